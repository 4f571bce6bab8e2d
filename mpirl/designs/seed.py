"""seed (SEED RL): actors hold no network; one observation per env step travels to rank 0,
which is the learner *and* the inference server.

Wiring: rank 0 batches requests, runs the model once per batch, answers, assembles
unrolls from what the requests carried (:class:`mpirl.parts.unroll.UnrollAssembler`)
and trains on them with V-trace.  Every other rank only steps envs ("many weak machines
can join as actors").  Its inference waits while rank 0 trains (single-threaded:
seed_rl overlaps the two with threads on one accelerator); ga3c
(:mod:`mpirl.designs.ga3c`) overlaps them on two ranks.  The actors, the batching
(``--inference-policy``) and what travels are the kit's (:mod:`mpirl.kit.inference`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from mpi4py import MPI

from ..config import Config
from ..kit.actorlearner import UnrollQueue, VtraceTrainer
from ..kit.common import Summary
from ..kit.inference import InferenceServer, run_inference


def run_seed(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    return run_inference(cfg, comm, run_dir, make_server=SeedLearner)


class SeedLearner(InferenceServer):
    """Rank 0: inference for every actor, and an update once ``--unroll-batch`` unrolls
    are queued."""

    role = "learner"

    def __init__(self, cfg: Config, comm: MPI.Comm, learner, layout, actors: list[int],
                 run_dir: Path) -> None:
        super().__init__(cfg, comm, learner, layout, actors, run_dir)
        self.trainer = VtraceTrainer(cfg, learner)
        self.queue = UnrollQueue(cfg.max_policy_lag)

    def made_unroll(self, record: np.ndarray) -> None:
        self.queue.add(record, self.trainer.version)

    def after_pass(self, timer) -> None:
        queued = len(self.queue)
        records = self.queue.take(self.batch, self.trainer.version)
        if not records:
            return
        losses = self.trainer.train(records, timer)
        self.version = self.trainer.version
        lags = self.queue.lags[-len(records):]
        self._row(timer, param_version=self.version, policy_lag=float(np.mean(lags)),
                  policy_lag_max=max(lags), queue_len=queued, **losses)

    def lags(self) -> list[int]:
        return self.queue.lags

    def end_stream(self, timer) -> None:
        self.queue.drop_rest()

    def unroll_fate(self) -> tuple[int, int]:
        return self.queue.used, self.queue.dropped
