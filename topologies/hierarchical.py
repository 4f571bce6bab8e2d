"""Hierarchical: reduce inside each node, allreduce among the node leaders, broadcast back.

The node-aware allreduce of MPICH (its SMP allreduce), Open MPI (HAN) and Horovod
(``HOROVOD_HIERARCHICAL_ALLREDUCE``): ranks on one node share memory, so they combine
their buffers there and only one rank per node, its leader, sends over the link.

* Nodes: ``comm.Split_type(COMM_TYPE_SHARED)`` (the ranks that share memory), or, to
  study the two levels on one machine, blocks of ``node_size`` consecutive ranks.  The
  leader of a node is its lowest rank; the leaders form their own communicator.
* Allreduce: ``MPI_Reduce`` to the leader over the node's communicator (MPI's
  shared-memory path), the leaders' allreduce with the ``inner`` topology (any
  registered one: ``hierarchical:ring``, ``hierarchical:butterfly``, ...), then
  ``MPI_Bcast`` from the leader over the node.  The leaders end byte-identical (the
  inner topology's guarantee) and every other rank receives a leader's copy.
* Broadcast: inside the root's node from the root, among the leaders with the inner
  topology's broadcast, then inside every other node from its leader.

Nodes may hold different rank counts (the allreduce stays exact); the largest node then
sets the pace of the node level, and ``mpirl.run`` says so at start.

Spec: ``hierarchical[:INNER[:NODE_SIZE]]``, e.g. ``hierarchical:butterfly:2``
(``topologies.get`` builds the variant; ``mpirl.run`` composes it from ``--topology
hierarchical --inner NAME --node-size K``).  Default: ring inside, nodes by shared
memory.

Cost, two levels (:meth:`Hierarchical.levels`), with ``k`` ranks per node and ``m``
nodes, the node level modelled as a binomial reduce and broadcast::

    node level   messages 2 ceil(log2 k), bytes moved 2 ceil(log2 k) n,
                 bytes reduced ceil(log2 k) n        (alpha/beta inside a node)
    link level   the inner topology's allreduce over m ranks       (alpha/beta of the link)

``cost(op, p, n)`` is the sum of the two for the variant's ``node_size`` (one node of p
ranks when nodes are found by shared memory), for the one-fit cost model; a prediction
for a cluster takes each level with its own fitted alpha and beta.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, ClassVar

import numpy as np
from mpi4py import MPI

from .base import Cost, Topology, TopologyError, _msg, in_sequence, sum_op
from .ring import Ring
from .tree import Tree

DEFAULT_INNER = "ring"


def node_groups(comm: MPI.Comm, node_size: int) -> MPI.Comm:
    """This rank's node: the ranks sharing its memory (``node_size`` 0), or its block of
    ``node_size`` consecutive ranks."""
    if node_size:
        return comm.Split(comm.Get_rank() // node_size, comm.Get_rank())
    return comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())


class Hierarchical(Topology):
    """Node-level reduce, leaders' allreduce with ``inner``, node-level broadcast."""

    name = "hierarchical"
    #: the leaders' topology (its registry name and class) and the emulated node size
    #: (0: nodes by shared memory)
    inner: ClassVar[str] = DEFAULT_INNER
    inner_cls: ClassVar[type[Topology]] = Ring
    node_size: ClassVar[int] = 0

    @classmethod
    def variant(cls, options: str, lookup: Callable[[str], type[Topology]]
                ) -> type[Hierarchical]:
        """The class for ``hierarchical:INNER[:NODE_SIZE]`` (``options`` after the name;
        ``lookup`` is the registry's ``get``)."""
        inner, _, size = options.partition(":")
        return _variant(inner or DEFAULT_INNER, size, lookup)

    @classmethod
    def levels(cls, op: str, nodes: int, per_node: int, n: float) -> tuple[Cost, Cost]:
        """(node level, link level) of ``op`` over ``nodes`` nodes of ``per_node`` ranks."""
        return Tree.cost(op, per_node, n), cls.inner_cls.cost(op, nodes, n)

    @classmethod
    def levels_from_python(cls, nodes: int) -> tuple[bool, bool]:
        # the node level is MPI's own reduce and broadcast; the link level the inner's
        return False, cls.inner_cls.from_python and nodes > 1

    @classmethod
    def _cost(cls, op: str, p: int, n: float) -> Cost:
        per_node = min(p, cls.node_size) if cls.node_size else p
        node, link = cls.levels(op, math.ceil(p / per_node), per_node, n)
        return in_sequence(node, link)

    def __init__(self, comm=MPI.COMM_WORLD, *, root: int = 0) -> None:
        super().__init__(comm, root=root)
        self.node = node_groups(comm, self.node_size)
        self.leader = self.node.Get_rank() == 0
        self.leaders = comm.Split(0 if self.leader else MPI.UNDEFINED, self.rank)
        self.per_node = self.node.Get_size()
        #: the leaders' communicator has more than one rank: the link level runs
        self.across = self.leader and self.leaders.Get_size() > 1
        #: per rank of ``comm``: its node's index among the leaders (one allgather, once)
        my_node = self.leaders.Get_rank() if self.leader else -1
        self.node_of = self.node.bcast(my_node, root=0)
        self.node_index = comm.allgather(self.node_of)
        self.inner_topology = self.inner_cls(self.leaders) if self.leader else None
        if self.inner_topology is not None:
            self.inner_topology.stats = self.stats       # one set of counters for both levels

    def communicators(self) -> list[MPI.Comm]:
        inner = self.inner_topology.communicators() if self.inner_topology else []
        return [self.comm, self.node, *inner]

    def _node_reduce(self, buf: np.ndarray) -> None:
        if self.per_node == 1:
            return
        if self.leader:
            self.node.Reduce(MPI.IN_PLACE, _msg(buf), op=sum_op(buf.dtype), root=0)
            self.stats.bytes_recv += buf.nbytes * (self.per_node - 1)
        else:
            self.node.Reduce(_msg(buf), None, op=sum_op(buf.dtype), root=0)
            self._count_sent(buf)

    def _node_bcast(self, buf: np.ndarray, root: int) -> None:
        if self.per_node == 1:
            return
        self.node.Bcast(_msg(buf), root=root)
        if self.node.Get_rank() == root:
            self._count_sent(buf)
        else:
            self.stats.bytes_recv += buf.nbytes

    def _allreduce_sum(self, buf: np.ndarray) -> None:
        self._node_reduce(buf)
        if self.across:      # the leaders' call, planned as the inner topology plans it
            self.inner_topology._sum(buf, buf)
        self._node_bcast(buf, 0)

    def _bcast(self, buf: np.ndarray, root: int) -> None:
        root_node = self.node_index[root]
        on_root_node = self.node_of == root_node
        if on_root_node:                 # the root's node first, from the root itself
            self._node_bcast(buf, self._node_rank_of(root))
        if self.across:
            self.inner_topology._broadcast(buf, buf, root_node)
        if not on_root_node:
            self._node_bcast(buf, 0)

    def _node_rank_of(self, rank: int) -> int:
        """The node-communicator rank of ``rank`` of ``comm`` (on this rank's node): nodes
        keep the order of ``comm``'s ranks."""
        return sum(1 for r in range(rank) if self.node_index[r] == self.node_index[rank])

    def layout(self) -> str:
        sizes = self.node_sizes()
        how = f"blocks of {self.node_size} ranks" if self.node_size else "shared memory"
        line = (f"hierarchical: {len(sizes)} node(s) by {how}, of {', '.join(map(str, sizes))} "
                f"ranks; the leaders exchange with {self.inner}")
        if len(set(sizes)) > 1:
            line += (f"; nodes differ in size (exact, but the largest, {max(sizes)} ranks, "
                     "sets the pace of the node level)")
        return line

    def node_sizes(self) -> list[int]:
        """The rank count of each node, in the leaders' order."""
        return [self.node_index.count(i) for i in range(max(self.node_index) + 1)]


@functools.lru_cache(maxsize=None)
def _variant(inner: str, size: str, lookup: Callable[[str], type[Topology]]
             ) -> type[Hierarchical]:
    inner_cls = lookup(inner)           # unknown names: the registry's error
    if inner_cls is Hierarchical or issubclass(inner_cls, Hierarchical):
        raise TopologyError("hierarchical's inner topology cannot be hierarchical; "
                            "allowed: any other registered topology")
    if size and not (size.isdigit() and int(size) >= 1):
        raise TopologyError(f"hierarchical node size {size!r}; allowed: an integer >= 1 "
                            "(or none: nodes by shared memory)")
    return type(f"Hierarchical_{inner}_{size or 'shm'}", (Hierarchical,),
                {"inner": inner, "inner_cls": inner_cls, "node_size": int(size or 0),
                 "__doc__": Hierarchical.__doc__})
