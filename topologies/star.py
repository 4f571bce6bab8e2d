"""Star: the parameter-server pattern over point-to-point messages.

Every worker sends its whole buffer to the root; the root adds them up in rank order
(a fixed order, so the sum is the same from run to run) and sends the result back to
each worker.  2(N-1) messages of the full buffer all pass through one rank: the root's
bandwidth and its reduction speed bound the exchange, which is the weakness of the
parameter server that the master-free topologies remove.

Cost: everything passes through the root, one message after another::

    allreduce  messages 2(p-1), bytes moved 2(p-1) n, bytes reduced (p-1) n
               (link phases 2: the root's link receives (p-1) n, then sends (p-1) n)
    bcast      messages p-1,    bytes moved (p-1) n
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .base import Cost, Topology, _msg

_TAG_REDUCE = 11
_TAG_BCAST = 12


class Star(Topology):
    """Gather-and-add at the root, then a flat broadcast from it."""

    name = "star"
    has_master = True

    @classmethod
    def _cost(cls, op: str, p: int, n: float) -> Cost:
        if op == "allreduce":
            return Cost(2 * (p - 1), 2 * (p - 1) * n, (p - 1) * n, link_phases=2)
        return Cost(p - 1, (p - 1) * n, 0.0)                   # bcast

    def _allreduce_sum(self, buf: np.ndarray) -> None:
        if self.rank == self.root:
            incoming = self._scratch(buf.size, buf.dtype)
            for src in self._workers(self.root):
                self._recv(incoming, src, _TAG_REDUCE)
                np.add(buf, incoming, out=buf)
        else:
            self._send(buf, self.root, _TAG_REDUCE)
        self._flat_bcast(buf, self.root, _TAG_REDUCE + 100)

    def _bcast(self, buf: np.ndarray, root: int) -> None:
        self._flat_bcast(buf, root, _TAG_BCAST)

    def _flat_bcast(self, buf: np.ndarray, root: int, tag: int) -> None:
        """The root sends the whole buffer to every other rank, all sends in flight at once."""
        if self.rank != root:
            self._recv(buf, root, tag)
            return
        requests = [self.comm.Isend(_msg(buf), dest=dst, tag=tag) for dst in self._workers(root)]
        MPI.Request.Waitall(requests)
        for _ in requests:
            self._count_sent(buf)

    def _workers(self, root: int):
        return (r for r in range(self.size) if r != root)
