"""Sharded parameter servers (Gorila, DistBelief): the flat vector split over S servers.

The star's weakness is that "the master's bandwidth must carry everyone's traffic";
sharding splits that traffic.  Ranks ``0..S-1`` are servers; server ``k`` holds the
contiguous slice :meth:`ShardedParameterServer.bounds` ``[k]`` of the flat buffer.
Every other rank is a worker: it pushes slice ``k`` of its gradient to server ``k``
and pulls slice ``k`` of the parameters back, for every ``k`` at once, and the servers
answer independently of each other (each one on its own schedule, per shard).

Built from S plain :class:`~topologies.paramserver.ParameterServer` exchanges, one per
shard, each on a communicator holding server ``k`` (its rank 0) and every worker.  Each
message is a slice of the caller's buffer (a view: no packing, no copy on the worker).

Leaving: a worker's loop ends when a server answers STOP (the caller's server decides
when).  Shards that answered that round with parameters still expect a push from the
worker, so :meth:`pull` then sends each of them one *leaving* push, carrying the
caller's ``leave_meta`` (the caller's server loop must answer such a push with STOP),
and takes their STOPs.  This module moves bytes and never reads the meta itself.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .base import SummedStats, TopologyError
from .paramserver import ParameterServer


class ShardedParameterServer:
    """``servers`` parameter servers over contiguous shards of a ``count``-element buffer."""

    name = "shardedps"
    measures_wait = True

    def __init__(self, comm: MPI.Comm, servers: int, count: int, *, meta_len: int = 0,
                 leave_meta: np.ndarray | None = None) -> None:
        self.comm, self.servers, self.count = comm, servers, count
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        if not 1 <= servers < self.size:
            raise TopologyError(f"servers={servers} with {self.size} ranks; allowed: "
                                f"1..{self.size - 1} (at least one worker)")
        if count < servers:
            raise TopologyError(f"a {count}-element buffer cannot be split into {servers} "
                                "shards")
        edges = np.linspace(0, count, servers + 1).round().astype(int)
        self.bounds = [(int(lo), int(hi)) for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
        self.workers = list(range(servers, self.size))
        self.is_server = self.rank < servers
        self.shard = self.rank if self.is_server else None
        self.leave_meta = leave_meta
        # one exchange per shard: server k (rank 0 there) and every worker (collective)
        self.exchanges: dict[int, ParameterServer] = {}
        for k in range(servers):
            member = self.rank == k or not self.is_server
            sub = comm.Split(0 if member else MPI.UNDEFINED, 0 if self.rank == k else self.rank)
            if member:
                self.exchanges[k] = ParameterServer(sub, root=0, meta_len=meta_len)
        self.meta_len = meta_len
        self.snapshot = False          # sharded servers take no checkpoint snapshots

    def slice(self, buf: np.ndarray, shard: int) -> np.ndarray:
        lo, hi = self.bounds[shard]
        return buf[lo:hi]

    @property
    def server(self) -> ParameterServer:
        """A server rank's own exchange (its shard's)."""
        return self.exchanges[self.shard]

    @property
    def stats(self) -> "SummedStats":
        """This rank's traffic over all its exchanges (read live, like a CommStats)."""
        return SummedStats([ex.stats for ex in self.exchanges.values()])

    # -- worker side ------------------------------------------------------------------------
    def push(self, buf: np.ndarray, meta: np.ndarray | None = None) -> None:
        """Start sending every shard of ``buf`` (and ``meta`` to each) to its server."""
        for k, ex in self.exchanges.items():
            ex.push(self.slice(buf, k), meta)

    def pull(self, buf: np.ndarray, *, timeout_s: float | None = None) -> bool:
        """Every shard's reply into its slice of ``buf``: True when all sent parameters;
        False once any said STOP (the others are then left, see the module doc)."""
        alive = {k: ex.pull(self.slice(buf, k), timeout_s=timeout_s)
                 for k, ex in self.exchanges.items()}
        if all(alive.values()):
            return True
        for k, ex in self.exchanges.items():
            if alive[k]:
                ex.push(self.slice(buf, k), self.leave_meta)
                if ex.pull(self.slice(buf, k), timeout_s=timeout_s):
                    raise TopologyError(f"worker {self.rank}: server {k} answered a leaving "
                                        "push with parameters, not STOP")
        return False

    def free(self) -> None:
        for ex in self.exchanges.values():
            ex.comm.Free()


__all__ = ["ShardedParameterServer", "SummedStats"]   # SummedStats: from .base
