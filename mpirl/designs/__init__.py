"""The training designs compared by mpirl, registered by ``--mode`` name.

Each design is a function ``run(cfg, comm, run_dir) -> Summary`` that every rank calls:
one module per architecture, each a wiring of the five parts (:mod:`mpirl.parts`) to
ranks that says what travels between them.  How bytes move is the topology's business
(``topologies/``); what a gradient is, the learner's.

========  =========================================  ==============================
mode      wiring                                     what travels
========  =========================================  ==============================
sync      every rank: envs, actor, learner            gradients, by allreduce
async     rank 0: parameter server; others: workers   gradients up, parameters down
quorum    as async; the server steps on K fresh ones  gradients up, parameters down
impala    ranks 0..L-1: learners; others: actors      unrolls up, parameters down
seed      rank 0: learner + inference; others: envs   observations up, actions down
ga3c      rank 0: trainer; 1: predictor; others: envs observations up, actions down;
                                                      unrolls to the trainer
apex      rank 0: learner; 1..R: replay; others:      prioritized transitions up,
          actors                                      batches to the learner,
                                                      priorities back, parameters down
gorila    ranks 0..S-1: parameter shards; others:     gradient shards up, parameter
          actor-learners with a local replay          shards down
========  =========================================  ==============================
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
from mpi4py import MPI

from ..config import ACTOR_LEARNER_MODES, MODES, Config
from ..launch import cpu_count
from ..resilience import sentinel
from ..telemetry import schema, superblock
from ..telemetry.h5log import rank_file, run_file
from .common import Summary, ranks_sharing_cores
from .apex import run_apex
from .impala import run_impala
from .gorila import run_gorila
from .paramserver import run_async, run_quorum
from .seed import run_ga3c, run_seed
from .sync import run_sync

DESIGNS = {"sync": run_sync, "async": run_async, "quorum": run_quorum, "impala": run_impala,
           "seed": run_seed, "ga3c": run_ga3c, "apex": run_apex, "gorila": run_gorila}
assert tuple(DESIGNS) == MODES, "mpirl.config.MODES must name the designs registered here"
assert ACTOR_LEARNER_MODES == schema.ACTOR_LEARNER_MODES, "the readers must know them too"


def make_run_dir(cfg: Config, comm: MPI.Comm) -> Path:
    """Rank 0 creates the run directory and saves the configuration; all ranks learn it."""
    if cfg.resume:
        return Path(cfg.resume)
    path = None
    if comm.Get_rank() == 0:
        name = cfg.run_name or (f"{cfg.topology}-{cfg.mode}-{comm.Get_size()}r-"
                                f"{time.strftime('%Y%m%d-%H%M%S')}")
        path = Path(cfg.run_dir) / name
        path.mkdir(parents=True, exist_ok=True)
        cfg.save(path / "config.yaml")
    return Path(comm.bcast(str(path) if path else None, root=0))


def train(cfg: Config, comm: MPI.Comm) -> Summary:
    """Run ``cfg`` on every rank of ``comm``; the writing rank prints and saves the summary."""
    rank, size = comm.Get_rank(), comm.Get_size()
    # Ranks sharing cores divide them: torch's own threads would fight over them.
    torch.set_num_threads(cfg.torch_threads or max(1, cpu_count() // ranks_sharing_cores(comm)))
    run_dir = make_run_dir(cfg, comm)
    if rank == 0:
        workers = cfg.experience_ranks(size)
        print(f"mpirl: {size} ranks ({workers} collecting experience), mode={cfg.mode}, "
              f"topology={cfg.topology}, env={cfg.env}, budget {cfg.total_steps} env steps",
              flush=True)
    # names this rank if it dies without a word, and mends the log its death cut short
    mend = (rank_file(run_dir, rank), *([run_file(run_dir)] if rank == 0 else []))
    watcher = sentinel.start(run_dir, rank, mend=mend, mender=superblock.__file__)
    try:
        summary = DESIGNS[cfg.mode](cfg, comm, run_dir)
    except BaseException:
        watcher.close(sentinel.REPORTED)         # mpirl.run reports it (or it is a stop)
        raise
    watcher.close(sentinel.CLEAN)
    summary.torch_threads = torch.get_num_threads()
    if rank == summary.writer_rank:           # rank 0, or the lowest survivor of a failure
        (run_dir / "summary.json").write_text(json.dumps(summary.as_dict(), indent=2))
        print(describe(summary))
        print(f"run files: {run_dir}/ (config.yaml, progress.csv, summary.json, run.h5 "
              "-> rankNNNN.h5)", flush=True)
    return summary


def describe(s: Summary) -> str:
    lines = [f"done: {s.updates} updates, {s.env_steps} env steps in {s.wall_s:.1f} s "
             f"({s.env_steps / s.wall_s if s.wall_s else math.nan:.0f} steps/s); "
             f"final mean return {s.final_mean_return:.1f}"]
    if s.mode == "apex":
        lines.append(f"transitions: {s.transitions_sent} sent = {s.transitions_inserted} "
                     f"inserted ({s.replay_evicted} evicted), {s.transitions_sampled} sampled, "
                     f"{s.priority_updates} priorities updated; policy lag mean "
                     f"{s.mean_policy_lag:.2f}, p95 {s.p95_policy_lag:.0f} updates; "
                     f"{s.bytes_per_env_step:.0f} bytes per env step; actors' env share "
                     f"{100 * s.actor_env_share:.1f}%")
        return "\n".join(lines)
    if s.mode in ACTOR_LEARNER_MODES:
        lines.append(f"unrolls: {s.unrolls_sent} sent = {s.unrolls_used} used + "
                     f"{s.unrolls_dropped} dropped; policy lag mean {s.mean_policy_lag:.2f}, "
                     f"p95 {s.p95_policy_lag:.0f} updates; {s.bytes_per_env_step:.0f} bytes "
                     f"per env step; actors' env share {100 * s.actor_env_share:.1f}%")
        if s.requests_sent:
            lines.append(f"requests: {s.requests_sent} sent = {s.requests_answered} answered "
                         f"+ {s.requests_dropped} dropped; {s.mean_inference_batch:.1f} "
                         "observations per forward pass")
        return "\n".join(lines)
    lines.append(f"gradients: {s.gradients_sent} sent = {s.gradients_applied} applied + "
                 f"{s.gradients_dropped} dropped; communication {100 * s.comm_share:.1f}% of "
                 "workers' busy time")
    if s.mode == "gorila":
        lines.append(f"replay: {s.transitions_sent} transitions sent = "
                     f"{s.transitions_inserted} inserted ({s.replay_evicted} evicted), "
                     f"{s.transitions_sampled} sampled, {s.priority_updates} priorities "
                     f"updated ({s.priority_stale} stale)")
    if s.ranks_failed:
        lines.append(f"survived the failure of rank(s) {s.ranks_failed}: finished with "
                     f"{s.ranks - len(s.ranks_failed)} of {s.ranks} ranks (--on-failure shrink)")
    if not math.isnan(s.mean_staleness):
        lines[1] += f"; mean staleness {s.mean_staleness:.2f}"
    return "\n".join(lines)
