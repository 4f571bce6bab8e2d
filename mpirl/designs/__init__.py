"""The training designs compared by mpirl, run by ``--mode`` name.

Each design is a function ``run(cfg, comm, run_dir) -> Summary`` that every rank calls:
one module per architecture, each a wiring of the five parts (:mod:`mpirl.parts`) to
ranks that says what travels between them.  How bytes move is the topology's business
(``topologies/``); what a gradient is, the learner's.  Which module runs a mode, and all
else that follows from its wiring, is its row in the design registry
(:mod:`mpirl.registry`); :func:`train` runs the row's entry.
"""

from __future__ import annotations

import importlib
import math
import time
from pathlib import Path
from typing import Callable

import torch
from mpi4py import MPI

from .. import registry
from ..config import Config
from ..launch import cpu_count, process_start_unix
from ..resilience import sentinel
from ..telemetry import superblock, tensorboard
from ..telemetry.h5log import rank_file, run_file
from ..kit.common import Summary, ranks_sharing_cores


def entry(cfg: Config) -> Callable[[Config, MPI.Comm, Path], Summary]:
    """The run function of ``cfg.mode``'s registry row (or of its variant that ``cfg``
    selects), imported."""
    module, _, function = registry.design(cfg.mode).entry_for(cfg).partition(":")
    return getattr(importlib.import_module(module), function)


def make_run_dir(cfg: Config, comm: MPI.Comm) -> Path:
    """Rank 0 creates the run directory and saves the configuration; all ranks learn it."""
    if cfg.resume:
        return Path(cfg.resume)
    path = None
    if comm.Get_rank() == 0:
        path = Path(cfg.run_dir) / cfg.run_dir_name(comm.Get_size())
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
        if not cfg.uses_topology and cfg.topology != "butterfly":
            print(f"mpirl: note: --topology {cfg.topology} plays no part in this run (mode "
                  f"{cfg.mode}{' with one learner' if cfg.mode == 'impala' else ''})",
                  flush=True)
    # names this rank if it dies without a word, and mends the log its death cut short
    mend = (rank_file(run_dir, rank), *([run_file(run_dir)] if rank == 0 else []))
    watcher = sentinel.start(run_dir, rank, mend=mend, mender=superblock.__file__)
    started = process_start_unix()
    startup_s = time.time() - started if started else float("nan")
    if cfg.tensorboard and rank == 0:         # the rank that prints progress
        tensorboard.start(run_dir)
    try:
        summary = entry(cfg)(cfg, comm, run_dir)
    except BaseException:
        watcher.close(sentinel.REPORTED)         # mpirl.run reports it (or it is a stop)
        raise
    finally:
        tensorboard.close()
    watcher.close(sentinel.CLEAN)
    summary.torch_threads = torch.get_num_threads()
    summary.startup_s = startup_s
    if rank == summary.writer_rank:           # rank 0, or the lowest survivor of a failure
        (run_dir / "summary.json").write_text(summary.as_json())
        print(describe(summary))
        print(f"run files: {run_dir}/ (config.yaml, progress.csv, summary.json, run.h5 "
              "-> rankNNNN.h5)", flush=True)
    return summary


def describe(s: Summary) -> str:
    """The summary's lines: totals, then one line per ledger of the design."""
    rate = s.env_steps / s.wall_s if s.wall_s else math.nan
    lines = [f"done: {s.updates} updates, {s.env_steps} env steps in {s.wall_s:.1f} s "
             f"({rate:.0f} steps/s); final mean return {s.final_mean_return:.1f}"]
    unused = {"requests": not s.requests_sent}
    lines += [LEDGER_LINES[ledger](s) for ledger in registry.design(s.mode).ledgers
              if ledger in LEDGER_LINES and not unused.get(ledger, False)]
    if s.ranks_failed:
        lines.append(f"survived the failure of rank(s) {s.ranks_failed}: finished with "
                     f"{s.ranks - len(s.ranks_failed)} of {s.ranks} ranks (--on-failure shrink)")
    return "\n".join(lines)


def _gradients_line(s: Summary) -> str:
    line = (f"gradients: {s.gradients_sent} sent = {s.gradients_applied} applied + "
            f"{s.gradients_dropped} dropped; communication {100 * s.comm_share:.1f}% of "
            "workers' busy time")
    if not math.isnan(s.mean_staleness):
        line += f"; mean staleness {s.mean_staleness:.2f}"
    return line


def _delivery_line(s: Summary) -> str:
    if not s.reply_progress:             # broadcast: no reply carries parameters
        return (f"parameter broadcasts: {s.broadcasts_sent} started, "
                f"{s.broadcasts_received} joined by actors")
    where = ("on the learner's progress thread" if s.reply_progress == "thread"
             else "inside the learner's own MPI calls")
    return f"parameters pushed in the actors' replies, which moved {where}"


#: one summary line per ledger (:data:`mpirl.registry.LEDGERS`)
LEDGER_LINES: dict[str, Callable[[Summary], str]] = {
    "gradients": _gradients_line,
    "unrolls": lambda s: (f"unrolls: {s.unrolls_sent} sent = {s.unrolls_used} used + "
                          f"{s.unrolls_dropped} dropped"),
    "delivery": _delivery_line,
    "lag": lambda s: (f"policy lag mean {s.mean_policy_lag:.2f}, p95 {s.p95_policy_lag:.0f} "
                      f"updates; {s.bytes_per_env_step:.0f} bytes per env step; actors' env "
                      f"share {100 * s.actor_env_share:.1f}%"),
    "requests": lambda s: (f"requests: {s.requests_sent} sent = {s.requests_answered} "
                           f"answered + {s.requests_dropped} dropped; "
                           f"{s.mean_inference_batch:.1f} observations per forward pass"),
    "transitions": lambda s: (f"transitions: {s.transitions_sent} sent = "
                              f"{s.transitions_inserted} inserted ({s.replay_evicted} "
                              f"evicted), {s.transitions_sampled} sampled, "
                              f"{s.priority_updates} priorities updated ({s.priority_stale} "
                              "stale)"),
}
