"""Pieces every mode shares: the run summary and episode bookkeeping."""

from __future__ import annotations

import json
import math
import socket
import time
from collections import deque
from pathlib import Path
from dataclasses import asdict, dataclass, field

import numpy as np
from mpi4py import MPI

from .. import __version__
from ..h5log import RankLog, finish_run_file, write_run_file
from ..launch import cpu_count, mpi_library


@dataclass
class Summary:
    """The figures a run ends with (rank 0 writes them to summary.json)."""

    mode: str
    topology: str
    ranks: int
    updates: int = 0
    env_steps: int = 0
    wall_s: float = 0.0
    gradients_sent: int = 0
    gradients_applied: int = 0
    gradients_dropped: int = 0
    final_mean_return: float = math.nan     # over the last episodes of every rank
    mean_staleness: float = math.nan
    comm_share: float = math.nan            # exchange time / busy time, worker ranks
    phase_s: dict = field(default_factory=dict)   # rank 0's (or worker 1's) seconds per phase
    reached_target: bool = False            # stopped early by target_return
    param_digest: str = ""                  # SHA-256 of the final parameters (rank 0's)
    gradient_bytes: int = 0                 # size of the flat gradient each exchange moves
    updates_skipped: int = 0                # non-finite gradients skipped (--nan-policy skip)
    ranks_failed: list = field(default_factory=list)   # launch ranks lost, run went on
    writer_rank: int = 0                    # launch rank that wrote this (lowest survivor)
    snapshots: int = 0                      # async/quorum: checkpoint snapshots completed
    snapshot_s: float = 0.0                 # the server's seconds in them (first flag to
                                            # its own checkpoint written), summed

    def as_dict(self) -> dict:
        return asdict(self)

    def totals(self) -> dict:
        """The gradient totals, as stored in run.h5's attributes."""
        return {"gradients_sent": self.gradients_sent,
                "gradients_applied": self.gradients_applied,
                "gradients_dropped": self.gradients_dropped,
                "ranks_failed_json": json.dumps(self.ranks_failed)}


class Episodes:
    """Episodes finished on this rank: a window for progress and the last ones for the end."""

    def __init__(self, keep_last: int = 20) -> None:
        self.window_sum = 0.0
        self.window_count = 0
        self.last = deque(maxlen=keep_last)

    def add(self, finished: list[tuple[float, int]]) -> None:
        for ret, _length in finished:
            self.window_sum += ret
            self.window_count += 1
            self.last.append(ret)

    def recent_mean(self) -> float | None:
        """Mean return of the last ``keep_last`` episodes, once that many have finished."""
        if len(self.last) < self.last.maxlen:
            return None
        return sum(self.last) / len(self.last)

    def state(self) -> dict:
        return {"window_sum": self.window_sum, "window_count": self.window_count,
                "last": list(self.last)}

    def load_state(self, state: dict) -> None:
        self.window_sum, self.window_count = state["window_sum"], state["window_count"]
        self.last.clear()
        self.last.extend(state["last"])

    def take_window(self) -> tuple[float, int]:
        out = (self.window_sum, self.window_count)
        self.window_sum, self.window_count = 0.0, 0
        return out


def final_mean_return(comm: MPI.Comm, episodes: Episodes | None) -> float:
    """Mean over the last episodes of every rank that ran envs (collective)."""
    last = list(episodes.last) if episodes is not None else []
    total = comm.allreduce(sum(last))
    count = comm.allreduce(len(last))
    return total / count if count else math.nan


def comm_share(phases: dict) -> float:
    """Share of the busy seconds in ``phases`` spent in the exchange."""
    busy = sum(phases.values())
    return phases.get("exchange_s", 0.0) / busy if busy else 0.0


def sum_over_ranks(comm: MPI.Comm, values: tuple[float, ...]) -> tuple:
    """Element-wise sum of a few numbers over all ranks, known to every rank."""
    total = np.asarray(values, dtype=np.float64)
    comm.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
    return tuple(total.tolist())


def reached_target(target: float, recent_means: list[float], ranks: int) -> bool:
    """True when ``target`` is set, all ``ranks`` have a full window of recent episodes,
    and the mean of their windows' means reaches ``target``."""
    return bool(target) and len(recent_means) == ranks \
        and sum(recent_means) / ranks >= target


class RunLogger:
    """The HDF5 log of one rank in one run: ``run.h5`` (rank 0) and ``rankNNNN.h5``.

    Opening is collective (hostnames and core counts are gathered once, before any
    exchange); every later call is local, so logging adds no traffic to the exchange
    being measured.  ``record`` times itself: each row carries the seconds the
    previous row cost to log (``log_s``), so the overhead is in the data."""

    def __init__(self, cfg, comm: MPI.Comm, run_dir: Path, role: str,
                 resume_update: int | None = None, resume_rows: int | None = None) -> None:
        hosts = comm.allgather(socket.gethostname())
        cores = comm.allgather(cpu_count())
        resuming = resume_update is not None or resume_rows is not None
        if comm.Get_rank() == 0 and not resuming:
            write_run_file(run_dir, config=cfg.to_dict(), world_size=comm.Get_size(),
                           hostnames=hosts, cores=cores, version=__version__,
                           mpi_library=mpi_library())
        self.run_dir = run_dir
        self.rank = comm.Get_rank()
        self.log = RankLog(run_dir, self.rank, role, cfg.log_flush_every, resume_update,
                           resume_rows)
        self._log_s = 0.0
        self.update_start = self.exchange_start = 0.0

    def mark_update_start(self) -> None:
        """The first update starts now; each later one starts where the last record ended."""
        self.update_start = self.log.now()

    def mark_exchange_start(self) -> None:
        self.exchange_start = self.log.now()

    def record(self, update: int, phases: dict, **fields) -> None:
        """One update row: phase seconds plus any of the row's other fields.

        The update's time not in any phase is its ``other_s``; the next update starts
        when this call returns, so consecutive rows tile the rank's time."""
        t0 = time.perf_counter()
        other = self.log.now() - self.update_start - sum(phases.values())
        row = self.log.new_update(update, self.update_start, phases)
        row["other_s"] = max(0.0, other)
        row["exchange_t_s"] = self.exchange_start
        for key, value in fields.items():
            row[key] = value
        row["log_s"] = self._log_s
        self._log_s = time.perf_counter() - t0
        self.update_start = self.log.now()

    def episodes(self, update: int, finished: list[tuple[float, int]]) -> None:
        for ret, length in finished:
            self.log.episode(update, ret, length)

    def sim_times(self, update: int, times) -> None:
        self.log.sim_times(update, times)

    def failure(self, update: int, event) -> None:
        """A failure this rank survived (an :class:`mpirl.ulfm.FailureEvent`)."""
        self.log.failure(update, unix_s=event.unix_s, detect_s=event.detect_s,
                         recover_s=event.recover_s, size_after=event.size_after,
                         failed=event.failed)

    def close(self, totals: dict | None = None, writer: bool | None = None) -> None:
        """``writer``: this rank finishes run.h5 (default: rank 0; after a failure the
        lowest survivor)."""
        self.log.close()
        if (self.rank == 0 if writer is None else writer) and totals is not None:
            finish_run_file(self.run_dir, totals)


class StartupMismatch(RuntimeError):
    """Ranks disagree on something that must be equal before training starts."""


def check_same_model(comm: MPI.Comm, replica) -> None:
    """Every rank built a model of the same size (collective; same answer everywhere)."""
    counts = comm.allgather(int(replica.flat.param_np.size))
    if len(set(counts)) > 1:
        odd = [r for r, c in enumerate(counts) if c != counts[0]]
        raise StartupMismatch(f"ranks {odd} built a model with a different parameter count "
                              f"than rank 0 ({[counts[r] for r in odd]} vs {counts[0]}): "
                              "every rank must run the same env spaces and network")


def local_rank_count(comm: MPI.Comm) -> int:
    """Ranks on this rank's node (collective)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_size()
    finally:
        node.Free()
