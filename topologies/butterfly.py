"""Butterfly: recursive-doubling allreduce, partner = rank XOR 2^k in round k.

Every rank exchanges its whole partial sum with one partner per round and adds what it
receives, so after log2 N rounds every rank holds the full sum: no master, no rank that
everything waits on (Thakur, Rabenseifner & Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 2005, section 4.4).

Byte-identity: in each round both partners compute ``a + b`` from the same two operands
(one as ``a + b``, the other as ``b + a``); IEEE addition is commutative, so partners
hold identical bytes after every round, and by induction so do all ranks.  Except for
NaNs: which of two NaN operands a sum returns depends on their order (x86 keeps the
first; NumPy's in-place loops may swap them), so where ranks' buffers held NaNs of both
signs (``inf - inf`` gives -NaN) the summed NaN's sign may differ between partners.
Its position never does, which is what a NaN check needs; MPI's own recursive doubling
behaves the same.

Non-power-of-two rank counts (the hard part) are folded as MPICH does.  With
``pof2`` the largest power of two <= N and ``rem = N - pof2``:

* among the first ``2*rem`` ranks, each even rank sends its buffer to the odd rank
  above it and sits out; the odd rank adds it and takes part as ``newrank = rank // 2``;
* ranks from ``2*rem`` on take part as ``newrank = rank - rem``;
* the ``pof2`` participants run the butterfly on newranks, mapping a partner newrank
  back with :func:`rank_of` (odd ranks for newrank < rem, else newrank + rem);
* each odd rank then sends the result back to the even rank it absorbed.

That costs two extra full-buffer steps for 2*rem ranks and none for the rest.

Broadcast: the first half of a butterfly is a binomial tree (in round k the ranks that
hold the data send to vrank XOR 2^k), so ``bcast`` is the binomial broadcast of
:mod:`topologies.tree`.

Cost of the allreduce, with ``q`` the largest power of two <= p, ``r = p - q`` and
``x = 1`` when r > 0 (else 0)::

    messages       log2(q) + 2x       the rounds, plus the fold's send-in and send-out
    bytes moved    (log2(q) + 2x) n   every message carries the whole buffer
    bytes reduced  (log2(q) + x) n    one add per round, one more at the fold

MPICH's ``recursive_doubling`` allreduce is the same data flow.  Broadcast: the tree's.
"""

from __future__ import annotations

import math

import numpy as np
from mpi4py import MPI

from .base import Cost, Message, Topology, fold as pof2_fold, no_model
from .tree import Tree, binomial_bcast

_TAG_FOLD = 31
_TAG_ROUND = 32
_TAG_UNFOLD = 33
_TAG_BCAST = 34


def fold(rank: int, size: int) -> tuple[int, int]:
    """Return ``(newrank, pof2)``; newrank is -1 for a rank folded out of the butterfly."""
    pof2 = 1 << (size.bit_length() - 1)
    rem = size - pof2
    if rank < 2 * rem:
        return (-1 if rank % 2 == 0 else rank // 2), pof2
    return rank - rem, pof2


def rank_of(newrank: int, size: int) -> int:
    """The real rank of butterfly participant ``newrank`` (inverse of :func:`fold`)."""
    rem = size - (1 << (size.bit_length() - 1))
    return newrank * 2 + 1 if newrank < rem else newrank + rem


def fold_in(topo: Topology, buf: np.ndarray, tag: int, newrank: int, pof2: int) -> None:
    """MPICH's fold, before the rounds (``newrank, pof2 = fold(rank, size)``, computed
    once per topology): among the first ``2*rem`` ranks each even one sends its buffer
    to the odd one above, which adds it in; a folded-out rank (newrank -1) then waits
    in :func:`fold_out`."""
    rank = topo.rank
    if rank < 2 * (topo.size - pof2):
        if newrank < 0:
            topo._send(buf, rank + 1, tag)
        else:
            incoming = topo._scratch(buf.size, buf.dtype)
            topo._recv(incoming, rank - 1, tag)
            topo._add(buf, incoming)


def fold_out(topo: Topology, buf: np.ndarray, tag: int, newrank: int, pof2: int) -> None:
    """The fold undone after the rounds: each odd rank of the first ``2*rem`` sends the
    result to the even rank it absorbed."""
    rank = topo.rank
    if rank < 2 * (topo.size - pof2):
        if newrank < 0:
            topo._recv(buf, rank + 1, tag)
        else:
            topo._send(buf, rank - 1, tag)


def fold_rounds(p: int, n: float, core: list[list[Message]]) -> list[list[Message]]:
    """``core``'s rounds (written on newranks, the pof2 participants) on real ranks,
    wrapped in MPICH's fold: the even ranks of the first ``2r`` send their buffer to the
    odd one above, which adds it; at the end each odd rank sends the result back."""
    q, r = pof2_fold(p)
    real = [[(rank_of(src, p), rank_of(dst, p), nbytes, added)
             for src, dst, nbytes, added in messages] for messages in core]
    if not r:
        return real
    return [[(2 * i, 2 * i + 1, n, n) for i in range(r)], *real,
            [(2 * i + 1, 2 * i, n, 0.0) for i in range(r)]]


class Butterfly(Topology):
    """Recursive doubling (butterfly) allreduce with MPICH's non-power-of-two fold."""

    name = "butterfly"
    persistent = ("allreduce", "bcast")

    @classmethod
    def _cost(cls, op: str, p: int, n: float) -> Cost:
        if op == "allreduce":
            q, r = pof2_fold(p)
            steps, extra = math.log2(q), float(r > 0)
            return Cost(steps + 2 * extra, (steps + 2 * extra) * n, (steps + extra) * n)
        return Tree.cost(op, p, n)          # bcast: the binomial tree's

    @classmethod
    def rounds(cls, op: str, p: int, n: float, root: int = 0) -> list[list[Message]]:
        """The fold, then in round k every participant and its partner at distance 2**k
        swap whole buffers: over consecutive ranks the rounds at distances below the ranks
        per node stay inside a node, and in each later one every rank of a node sends
        over its link at once.  Broadcast: the tree's."""
        if op == "bcast":
            return Tree.rounds(op, p, n, root)
        if op != "allreduce":
            raise no_model(cls.name, op)
        q = pof2_fold(p)[0]
        return fold_rounds(p, n, [[(v, v ^ mask, n, n) for v in range(q)]
                                  for mask in (1 << k for k in range(q.bit_length() - 1))])

    def __init__(self, comm=MPI.COMM_WORLD, *, root: int = 0) -> None:
        super().__init__(comm, root=root)
        self.newrank, self.pof2 = fold(self.rank, self.size)

    def _allreduce_sum(self, buf: np.ndarray) -> None:
        newrank, pof2 = self.newrank, self.pof2
        fold_in(self, buf, _TAG_FOLD, newrank, pof2)
        if newrank >= 0:                         # the butterfly proper
            incoming = self._scratch(buf.size, buf.dtype)
            mask = 1
            while mask < pof2:
                partner = rank_of(newrank ^ mask, self.size)
                self._sendrecv(buf, partner, incoming, partner, _TAG_ROUND)
                self._add(buf, incoming)
                mask <<= 1
        fold_out(self, buf, _TAG_UNFOLD, newrank, pof2)

    def _bcast(self, buf: np.ndarray, root: int) -> None:
        binomial_bcast(self, buf, root, _TAG_BCAST)
