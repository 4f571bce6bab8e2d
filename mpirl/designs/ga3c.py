"""ga3c (GA3C): seed's substrate with its two roles split over two ranks.

Wiring: rank 1, the *predictor*, batches requests and assembles unrolls as seed's
inference does (:class:`mpirl.kit.inference.InferenceServer`), then ships each unroll
(one record, as impala's) to rank 0, the *trainer*, from its own training queue, one in
flight.  The trainer trains on ``--unroll-batch`` of them and answers each with its
latest parameters when they changed.  Predictor and trainer therefore have their own
queues and batch sizes, and training never stalls inference; the price is parameters
that reach inference one trainer reply late (policy lag, corrected by V-trace).  Every
other rank is an actor (:class:`mpirl.kit.inference.SeedActor`).  Batching defaults to
``drain`` (GA3C's predictor: one request, then whatever arrives within
``--inference-wait-s``).
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import numpy as np
from mpi4py import MPI

from topologies.channels import ChannelClient, ChannelServer, as_bytes

from ..config import Config
from ..kit.actorlearner import (REPLY_META, TAG_KEEP, TAG_PARAMS, TAG_STOP, AccountingError,
                                UnrollQueue, VtraceTrainer, meta_nbytes, params_reply)
from ..kit.common import Summary
from ..kit.inference import InferenceServer, run_inference
from ..parts.unroll import UNROLL_META, UnrollLayout
from ..resilience.guard import Guard
from ..resilience.schedule import PARAMS
from ..telemetry.runlog import RunLogger
from ..telemetry.timing import PhaseTimer, add_phases


def run_ga3c(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    return run_inference(cfg, comm, run_dir, make_server=Predictor, make_trainer=Trainer)


class Predictor(InferenceServer):
    """Rank 1: inference for every actor; each unroll shipped to the trainer, whose
    reply to it brings the parameters inference acts with."""

    role = "predictor"

    def __init__(self, cfg: Config, comm: MPI.Comm, learner, layout: UnrollLayout,
                 actors: list[int], run_dir: Path) -> None:
        super().__init__(cfg, comm, learner, layout, actors, run_dir)
        self.outbox: deque[np.ndarray] = deque()
        self.to_trainer = ChannelClient(comm, 0)
        self._in_flight = None            # the unroll being sent, kept alive until the
                                          # trainer's reply (its Isend reads it)
        self.params_in = params_reply(learner.wire.size)
        self.dropped = 0

    def made_unroll(self, record: np.ndarray) -> None:
        self.outbox.append(record)

    def after_pass(self, timer) -> None:
        """Take the trainer's reply to the unroll in flight (waiting only when the
        outbox is over-full), then send the next one."""
        block = len(self.outbox) > 2 * self.batch
        link = self.to_trainer
        if link.in_flight:
            if self.schedule.replaying:           # take the reply where the recording did
                event = self.schedule.upcoming()
                block = event is not None and event[0] == PARAMS
            with timer("publish_s"):
                got = (link.wait_reply(self.params_in, timeout_s=self.cfg.wait_timeout_s)
                       if block else None if self.schedule.replaying
                       else link.poll_reply(self.params_in))
            if got is None:
                return
            self._take_params(got[0])
            self.schedule.take(PARAMS, self.version)
        if self.outbox:
            record = self.outbox.popleft()
            with timer("send_s"):
                self._in_flight = record            # kept untouched until the reply
                link.send(record)
            self._row(timer, param_version=self.version)

    def _take_params(self, tag: int) -> None:
        if tag == TAG_PARAMS:
            self.learner.wire[:] = self.params_in[0]["params"]
            self.version = int(self.params_in[0]["meta"][REPLY_META["version"]])
        elif tag != TAG_KEEP:
            raise AccountingError(f"predictor: unexpected reply tag {tag} from the trainer")

    def end_stream(self, timer) -> None:
        """Take the last reply, drop what was not shipped, end the trainer's stream."""
        link = self.to_trainer
        if link.in_flight:
            self._take_params(link.wait_reply(self.params_in,
                                              timeout_s=self.cfg.wait_timeout_s)[0])
        self.dropped += len(self.outbox)
        self.outbox.clear()
        end = self.layout.empty()
        end[0]["meta"][UNROLL_META["stop"]] = 1.0     # not an unroll: the end of the stream
        link.send(end)
        tag, _ = link.wait_reply(self.params_in, timeout_s=self.cfg.wait_timeout_s)
        if tag != TAG_STOP:
            raise AccountingError(f"predictor: the trainer answered the end with tag {tag}")

    def unroll_fate(self) -> tuple[int, int]:
        return 0, self.dropped

    def channels(self) -> tuple:
        return (self.server, self.to_trainer)


class Trainer:
    """ga3c's trainer (rank 0): takes the predictor's unrolls, answers each with the
    latest parameters (when they changed), trains on every ``--unroll-batch``."""

    episodes = None      # it steps no envs

    def __init__(self, cfg: Config, comm: MPI.Comm, learner, layout: UnrollLayout,
                 predictor: int, run_dir: Path) -> None:
        self.cfg, self.comm, self.learner, self.layout = cfg, comm, learner, layout
        self.predictor = predictor
        self.server = ChannelServer(comm, [predictor], layout.nbytes)
        self.reply = params_reply(learner.wire.size)
        self.trainer = VtraceTrainer(cfg, learner)
        self.queue = UnrollQueue(cfg.max_policy_lag)
        self.batch = cfg.unroll_batch or comm.Get_size() - 2
        self.published = 0                 # version the predictor last got
        self.phases: dict[str, float] = {}
        self.log = RunLogger(cfg, comm, run_dir, role="learner")
        self.log.watch(self.server, waits=())

    def run(self) -> None:
        timer, server, cfg = PhaseTimer(), self.server, self.cfg
        with Guard(cfg, self.comm, self.comm.Get_rank()) as guard:
            self.log.begin()
            while True:
                guard.at(f"waiting for unrolls for update {self.trainer.version + 1}")
                with timer("data_wait_s"):
                    server.wait_any(timeout_s=cfg.wait_timeout_s)
                record = self.layout.view(server.buffers[self.predictor]).copy()
                if record[0]["meta"][UNROLL_META["stop"]]:
                    server.reply(self.predictor, as_bytes(self.reply)[:meta_nbytes()],
                                 tag=TAG_STOP, last=True)
                    break
                self.queue.add(record, self.trainer.version)
                queued = len(self.queue)
                records = self.queue.take(self.batch, self.trainer.version)
                if records:
                    losses = self.trainer.train(records, timer)
                    lags = self.queue.lags[-len(records):]
                    add_phases(self.phases, self.log.record(
                        self.trainer.version, timer, param_version=self.trainer.version,
                        policy_lag=float(np.mean(lags)), policy_lag_max=max(lags),
                        queue_len=queued, **losses))
                    guard.beat(self.trainer.version, "between updates")
                self._publish(timer)        # after the step: the freshest parameters
        self.queue.drop_rest()
        server.close(timeout_s=cfg.wait_timeout_s)
        add_phases(self.phases, timer.take())

    def _publish(self, timer) -> None:
        version = self.trainer.version
        with timer("publish_s"):
            self.reply[0]["meta"][REPLY_META["version"]] = version
            if version != self.published:
                self.reply[0]["params"] = self.learner.wire
                self.published = version
                self.server.reply(self.predictor, self.reply, tag=TAG_PARAMS)
            else:
                self.server.reply(self.predictor, as_bytes(self.reply)[:meta_nbytes()],
                                  tag=TAG_KEEP)

    def counts(self) -> dict:
        return {"unrolls_used": self.queue.used, "unrolls_dropped": self.queue.dropped}
