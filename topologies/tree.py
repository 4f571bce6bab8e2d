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

from .base import NO_COST, Cost, Topology, ceil_log2, doubling_rounds

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
    def levels(cls, op: str, nodes: int, per_node: int, n: float) -> tuple[Cost, Cost]:
        """Reduce and broadcast by distance doubling over consecutive ranks: a round's
        partners share a node while the distance is below ``per_node``; above it, the
        senders are ``2 * distance`` apart, so at most one per node crosses its link."""
        if op != "allreduce":
            raise KeyError(f"no two-level model of {cls.name} {op}")
        inside, across = doubling_rounds(cls.name, nodes, per_node)
        node, link = (Cost(2 * k, 2 * k * n, k * n, link_phases=2) if k else NO_COST
                      for k in (inside, across))
        return node, link

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
