"""Rabenseifner: reduce-scatter by recursive halving, then allgather by recursive doubling.

The large-message allreduce of MPICH (``reduce_scatter_allgather``) and Open MPI
(``rabenseifner``): Rabenseifner, "Optimization of Collective Reduction Operations",
ICCS 2004; Thakur, Rabenseifner & Gropp, IJHPCA 2005, section 4.4.  It moves the
ring's bytes in the butterfly's number of rounds.

The buffer is cut into ``q`` near-equal blocks (``q`` the participants, a power of two;
block b is ``[b*n//q, (b+1)*n//q)``, as the ring cuts its chunks).  Participant
``newrank`` starts responsible for every block and ends owning block ``newrank``:

* Reduce-scatter, recursive vector halving with distance doubling: with ``mask`` from 1
  up to q/2, exchange with ``newrank ^ mask``; both partners hold the same block range
  (it depends only on the bits below ``mask``), each keeps one half (the upper if
  ``newrank & mask``), sends the other and adds the partner's copy of the half it
  keeps.  After log2 q rounds each participant holds the complete sum of one block (the
  block whose index is its newrank with the bits reversed), computed on it alone.
* Allgather, recursive doubling: the same exchanges in reverse order; each side sends
  the range it kept in that round and receives, straight into place, the range it gave.

Each block's sum is computed once, by its owner, and then copied, so every rank ends
with identical bytes.  The order is MPICH's, and it matters on a cluster: the largest
exchange (half the buffer) goes to the nearest rank, which shares the node when ranks
are placed in blocks, and only the smaller ones cross the link.  Pairing distance q/2
first (the textbook order) sent twice the bytes over each link at 4 nodes x 2 ranks
and took 2.0x MPICH's time at 100 Mbit/s; this order moves what MPICH moves.

Non-power-of-two rank counts are folded as MPICH folds them (see
:mod:`topologies.butterfly`): among the first ``2r`` ranks each even rank sends its whole
buffer to the odd rank above and sits out, and gets the result back at the end.

Broadcast is the binomial tree's (:mod:`topologies.tree`), as for the butterfly.

Cost, with ``q`` the largest power of two <= p, ``r = p - q`` and ``x = 1`` when r > 0
(else 0)::

    messages       2 log2(q) + 2x             halving and doubling rounds, the fold's two
    bytes moved    2 (q-1)/q n + 2x n         n/2 + n/4 + ... each way, the fold's two
    bytes reduced  (q-1)/q n + x n            the halving's adds, the fold's

For p a power of two: ``2 lg p alpha + 2 (p-1)/p n beta + (p-1)/p n gamma``.  MPICH's
``reduce_scatter_allgather`` is the same data flow, and ``mpirl.bench`` forces it beside
this one.
"""

from __future__ import annotations

import math

import numpy as np
from mpi4py import MPI

from .base import Cost, Message, Topology, fold as pof2_fold, no_model
from .butterfly import fold, fold_in, fold_out, fold_rounds, rank_of
from .ring import chunk_bounds
from .tree import Tree, binomial_bcast

_TAG_FOLD = 45
_TAG_HALVING = 46
_TAG_DOUBLING = 47
_TAG_UNFOLD = 48
_TAG_BCAST = 49

#: one round of the exchange: (partner's rank, (start, end) sent, (start, end) received)
Step = tuple[int, tuple[int, int], tuple[int, int]]


def plan(newrank: int, pof2: int, size: int, count: int) -> tuple[list[Step], list[Step]]:
    """The rounds of participant ``newrank`` (of ``pof2``, among ``size`` ranks) on a
    ``count``-element buffer: the reduce-scatter's, then the allgather's."""
    bounds = chunk_bounds(count, pof2)
    lo, hi = 0, pof2                       # the blocks this rank is still responsible for
    halving: list[Step] = []
    mask = 1
    while mask < pof2:
        mid = (lo + hi) // 2
        keep, give = ((mid, hi), (lo, mid)) if newrank & mask else ((lo, mid), (mid, hi))
        halving.append((rank_of(newrank ^ mask, size), (bounds[give[0]], bounds[give[1]]),
                        (bounds[keep[0]], bounds[keep[1]])))
        lo, hi = keep
        mask <<= 1
    doubling = [(partner, kept, given) for partner, given, kept in reversed(halving)]
    return halving, doubling


class Rabenseifner(Topology):
    """Recursive-halving reduce-scatter + recursive-doubling allgather, MPICH's fold."""

    name = "rabenseifner"
    persistent = ("allreduce", "bcast")

    @classmethod
    def _cost(cls, op: str, p: int, n: float) -> Cost:
        if op == "allreduce":
            q, r = pof2_fold(p)
            steps, extra = math.log2(q), float(r > 0)
            return Cost(2 * steps + 2 * extra, 2 * (q - 1) / q * n + 2 * extra * n,
                        (q - 1) / q * n + extra * n)
        return Tree.cost(op, p, n)          # bcast: the binomial tree's

    @classmethod
    def rounds(cls, op: str, p: int, n: float, root: int = 0) -> list[list[Message]]:
        """The fold, then halving with distance doubling and its mirror: round ``k``
        (distance ``2**k``) moves ``n / 2**(k+1)`` per rank, so over consecutive ranks the
        large early halves stay inside a node and only the small late ones cross, every
        rank of a node at once: per node ``n (1 - 1/nodes)`` each way over the link, as
        MPI's own allreduce sends.  Broadcast: the tree's."""
        if op == "bcast":
            return Tree.rounds(op, p, n, root)
        if op != "allreduce":
            raise no_model(cls.name, op)
        q = pof2_fold(p)[0]
        halves = [(1 << k, n / (2 << k)) for k in range(q.bit_length() - 1)]
        halving = [[(v, v ^ mask, half, half) for v in range(q)] for mask, half in halves]
        doubling = [[(v, v ^ mask, half, 0.0) for v in range(q)]
                    for mask, half in reversed(halves)]
        return fold_rounds(p, n, halving + doubling)

    def __init__(self, comm=MPI.COMM_WORLD, *, root: int = 0) -> None:
        super().__init__(comm, root=root)
        self.newrank, self.pof2 = fold(self.rank, self.size)
        self._plans: dict[int, tuple[list[Step], list[Step]]] = {}

    def _plan(self, count: int) -> tuple[list[Step], list[Step]]:
        steps = self._plans.get(count)
        if steps is None:
            steps = plan(self.newrank, self.pof2, self.size, count)
            self._plans = {count: steps}     # the last length only: buffers repeat
        return steps

    def _allreduce_sum(self, buf: np.ndarray) -> None:
        fold_in(self, buf, _TAG_FOLD, self.newrank, self.pof2)
        if self.newrank >= 0:
            halving, doubling = self._plan(buf.size)
            for partner, (s0, s1), (k0, k1) in halving:
                incoming = self._scratch(k1 - k0, buf.dtype)
                self._sendrecv(buf[s0:s1], partner, incoming, partner, _TAG_HALVING)
                kept = buf[k0:k1]
                self._add(kept, incoming)
            for partner, (s0, s1), (r0, r1) in doubling:
                self._sendrecv(buf[s0:s1], partner, buf[r0:r1], partner, _TAG_DOUBLING)
        fold_out(self, buf, _TAG_UNFOLD, self.newrank, self.pof2)

    def _bcast(self, buf: np.ndarray, root: int) -> None:
        binomial_bcast(self, buf, root, _TAG_BCAST)
