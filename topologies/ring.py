"""Ring: reduce-scatter then allgather around a ring, the bandwidth-optimal allreduce.

The buffer is cut into N near-equal chunks (chunk i is ``[i*n//N, (i+1)*n//N)``; with
fewer elements than ranks some chunks are empty and their messages carry 0 elements).
Each rank sends to ``rank+1`` and receives from ``rank-1`` (mod N), with one
``Sendrecv`` per step, so no step can deadlock whatever N is.

* Reduce-scatter, steps s = 0..N-2: send chunk ``rank-s``, receive chunk ``rank-s-1``
  and add it in.  After N-1 steps this rank holds the complete sum of chunk ``rank+1``.
* Allgather, steps s = 0..N-2: send chunk ``rank+1-s``, receive chunk ``rank-s``
  straight into place.

Every rank sends 2(N-1)/N of the buffer in total, independent of N: the lower bound
for an allreduce (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for
clusters of workstations", JPDC 2009), paid for with 2(N-1) latencies.  Each chunk's
sum is computed once, by its owner, and then copied: identical bytes on every rank.

Broadcast is a pipelined chain along the same ring: the root's buffer is cut into
segments of ``segment_bytes`` and passed rank to rank, each rank forwarding segment i
while segment i+1 is already arriving.  For large buffers that approaches one buffer
transfer time however long the chain.

Cost (``s`` the broadcast's segment size)::

    allreduce  messages 2(p-1), bytes moved 2(p-1)/p n, bytes reduced (p-1)/p n
    bcast      messages a = p-2 + max(1, ceil(n/s)), bytes moved a min(n, s)

MPICH's ``ring`` allreduce is the same data flow.
"""

from __future__ import annotations

import math

import numpy as np
from mpi4py import MPI

from .base import Cost, Message, Topology, _msg, no_model

_TAG_REDUCE_SCATTER = 41
_TAG_ALLGATHER = 42
_TAG_BCAST = 43

DEFAULT_SEGMENT_BYTES = 256 * 1024


def chunk_bounds(count: int, size: int) -> list[int]:
    """Start offsets of the ``size`` ring chunks of a ``count``-element buffer, plus the end."""
    return [(i * count) // size for i in range(size + 1)]


class Ring(Topology):
    """Ring reduce-scatter + allgather; pipelined chain broadcast."""

    name = "ring"
    persistent = ("allreduce",)    # bcast: a pipelined chain (Irecv)

    @classmethod
    def _cost(cls, op: str, p: int, n: float) -> Cost:
        if op == "allreduce":
            return Cost(2 * (p - 1), 2 * (p - 1) / p * n, (p - 1) / p * n)
        segment = DEFAULT_SEGMENT_BYTES                        # bcast: a pipelined chain
        messages = p - 2 + max(1, math.ceil(n / segment))
        return Cost(messages, messages * min(n, segment), 0.0)

    @classmethod
    def rounds(cls, op: str, p: int, n: float, root: int = 0) -> list[list[Message]]:
        """Every step, every rank sends one chunk to the next.  Over consecutive ranks each
        step has one message per node that crosses its link (the node's last rank to the
        next node's first) and waits for it: with more than one node the whole ring is
        paid at the link's alpha and beta, one message per link per step (no sharing).
        Broadcast: the pipelined chain, segment ``t - v`` leaving vrank ``v`` at step
        ``t``, of the default segment size."""
        if op == "allreduce":
            return [[(r, (r + 1) % p, n / p, n / p if step < p - 1 else 0.0)
                     for r in range(p)] for step in range(2 * (p - 1))]
        if op != "bcast":
            raise no_model(cls.name, op)
        segment = DEFAULT_SEGMENT_BYTES
        sizes = [min(segment, n - start) for start in range(0, math.ceil(n), segment)] or [n]
        return [[((v + root) % p, (v + 1 + root) % p, sizes[step - v], 0.0)
                 for v in range(p - 1) if 0 <= step - v < len(sizes)]
                for step in range(len(sizes) + p - 2)] if p > 1 else []

    def __init__(self, comm=MPI.COMM_WORLD, *, root: int = 0,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        super().__init__(comm, root=root)
        if not isinstance(segment_bytes, int) or segment_bytes < 8:
            raise ValueError(f"segment_bytes={segment_bytes!r}; allowed: an int >= 8")
        self.segment_bytes = segment_bytes
        self._plans: dict[int, tuple[list, list]] = {}

    def _plan(self, count: int) -> tuple[list, list]:
        """Per step, the (start, end) of the chunk sent and of the chunk received, for
        the reduce-scatter and the allgather; computed once per buffer length."""
        plan = self._plans.get(count)
        if plan is None:
            rank, size = self.rank, self.size
            bounds = chunk_bounds(count, size)

            def span(i: int) -> tuple[int, int]:
                i %= size
                return bounds[i], bounds[i + 1]

            plan = ([(span(rank - s), span(rank - s - 1)) for s in range(size - 1)],
                    [(span(rank + 1 - s), span(rank - s)) for s in range(size - 1)])
            self._plans = {count: plan}          # the last length only: buffers repeat
        return plan

    def _allreduce_sum(self, buf: np.ndarray) -> None:
        right, left = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        reduce_scatter, allgather = self._plan(buf.size)
        for (s0, s1), (r0, r1) in reduce_scatter:
            target = buf[r0:r1]
            incoming = self._scratch(r1 - r0, buf.dtype)
            self._sendrecv(buf[s0:s1], right, incoming, left, _TAG_REDUCE_SCATTER)
            self._add(target, incoming)
        for (s0, s1), (r0, r1) in allgather:
            self._sendrecv(buf[s0:s1], right, buf[r0:r1], left, _TAG_ALLGATHER)

    def _bcast(self, buf: np.ndarray, root: int) -> None:
        size = self.size
        vrank = (self.rank - root) % size
        prev, nxt = (self.rank - 1) % size, (self.rank + 1) % size
        seg = max(1, self.segment_bytes // buf.itemsize)
        # At least one (possibly empty) segment, so a length mismatch is always seen.
        segments = [buf[i:i + seg] for i in range(0, buf.size, seg)] or [buf]

        if vrank == 0:
            for piece in segments:
                self._send(piece, nxt, _TAG_BCAST)
            return
        forward = vrank < size - 1
        pending = self.comm.Irecv(_msg(segments[0]), source=prev, tag=_TAG_BCAST)
        for i, piece in enumerate(segments):
            status = MPI.Status()
            try:
                pending.Wait(status)
            except MPI.Exception as err:
                self._raise_mismatch(err, piece, prev)
            self._check_count(status, piece, prev)
            if i + 1 < len(segments):  # next segment arrives while this one is forwarded
                pending = self.comm.Irecv(_msg(segments[i + 1]), source=prev, tag=_TAG_BCAST)
            if forward:
                self._send(piece, nxt, _TAG_BCAST)
