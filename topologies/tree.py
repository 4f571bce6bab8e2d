"""Tree: binomial-tree reduce to the root, then binomial-tree broadcast from it.

Ranks are renumbered relative to the root, ``vrank = (rank - root) mod size``, so any
rank can be the root (the trick of MPICH's and SimGrid's binomial collectives).  In
round k (mask = 2^k) a rank whose vrank has bit k set sends its partial sum to
``vrank - mask`` and is done; the others receive from ``vrank + mask`` if that rank
exists.  Reduce and broadcast each take ceil(log2 N) rounds instead of the N-1 sends of
the star, and no rank ever receives more than log2 N messages.

The root holds the only complete sum and broadcasts it, so every rank ends with the
same bytes.

Cost, with ``L = ceil(log2 p)`` rounds each way::

    allreduce  messages 2L, bytes moved 2L n, bytes reduced L n   (reduce, then bcast;
               link phases 2: the root's link receives L n, then sends L n)
    bcast      messages L,  bytes moved L n

MPICH's ``binomial`` broadcast is the same data flow; its ``tree`` allreduce (a
pipelined k-nomial tree) is modelled as this one.
"""

from __future__ import annotations

import numpy as np

from .base import Cost, Message, Topology, ceil_log2, no_model

_TAG_REDUCE = 21
_TAG_BCAST = 22


def binomial_bcast(topo: Topology, buf: np.ndarray, root: int, tag: int) -> None:
    """Broadcast ``buf`` from ``root`` along a binomial tree, over ``topo``'s messaging.

    A non-root rank first receives from its parent (clear its lowest set bit), then
    forwards to its children vrank + 2^j for every 2^j below that bit, largest first, so
    the deepest subtree starts earliest.
    """
    size, vrank = topo.size, (topo.rank - root) % topo.size
    mask = 1
    while mask < size:
        if vrank & mask:
            topo._recv(buf, (vrank - mask + root) % size, tag)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if vrank + mask < size:
            topo._send(buf, (vrank + mask + root) % size, tag)
        mask >>= 1


def binomial_reduce_rounds(p: int, n: float, root: int = 0) -> list[list[Message]]:
    """The rounds of the binomial reduce to ``root`` (round k: every vrank whose lowest
    set bit is k sends its partial sum to ``vrank - 2**k``, which adds it)."""
    return [[((v + root) % p, (v - mask + root) % p, n, n)
             for v in range(mask, p, 2 * mask)]
            for mask in (1 << k for k in range(ceil_log2(p)))]


def binomial_bcast_rounds(p: int, n: float, root: int = 0) -> list[list[Message]]:
    """The rounds of :func:`binomial_bcast` (round t: every vrank that holds the data, a
    multiple of ``2 * mask``, sends it ``mask`` further, largest mask first)."""
    return [[((v + root) % p, (v + mask + root) % p, n, 0.0)
             for v in range(0, p - mask, 2 * mask)]
            for mask in (1 << k for k in reversed(range(ceil_log2(p))))]


class Tree(Topology):
    """Binomial reduce to ``root`` followed by binomial broadcast from it."""

    name = "tree"
    persistent = ("allreduce", "bcast")

    @classmethod
    def _cost(cls, op: str, p: int, n: float) -> Cost:
        rounds = ceil_log2(p)
        if op == "allreduce":
            return Cost(2 * rounds, 2 * rounds * n, rounds * n, link_phases=2)
        return Cost(rounds, rounds * n, 0.0)                   # bcast

    @classmethod
    def rounds(cls, op: str, p: int, n: float, root: int = 0) -> list[list[Message]]:
        """Binomial reduce to ``root``, then binomial broadcast from it.  Over consecutive
        ranks a round's partners share a node while the distance is below the ranks per
        node; above it the senders are twice the distance apart, so at most one per node
        crosses its link."""
        if op == "allreduce":
            return binomial_reduce_rounds(p, n, root) + binomial_bcast_rounds(p, n, root)
        if op == "bcast":
            return binomial_bcast_rounds(p, n, root)
        raise no_model(cls.name, op)

    def _allreduce_sum(self, buf: np.ndarray) -> None:
        size, root = self.size, self.root
        vrank = (self.rank - root) % size
        incoming = self._scratch(buf.size, buf.dtype)
        mask = 1
        while mask < size:
            if vrank & mask:
                self._send(buf, (vrank - mask + root) % size, _TAG_REDUCE)
                break
            child = vrank | mask
            if child < size:
                self._recv(incoming, (child + root) % size, _TAG_REDUCE)
                self._add(buf, incoming)
            mask <<= 1
        binomial_bcast(self, buf, root, _TAG_REDUCE + 100)

    def _bcast(self, buf: np.ndarray, root: int) -> None:
        binomial_bcast(self, buf, root, _TAG_BCAST)
