"""Pieces every mode shares: the run summary and episode bookkeeping."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field

import numpy as np
from mpi4py import MPI


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

    def as_dict(self) -> dict:
        return asdict(self)


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


def local_rank_count(comm: MPI.Comm) -> int:
    """Ranks on this rank's node (collective)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_size()
    finally:
        node.Free()
