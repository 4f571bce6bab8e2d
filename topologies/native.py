"""MPI's own collectives: ``MPI_Allreduce`` and ``MPI_Bcast``, the baseline.

Every other topology is measured against this one.  Which algorithm MPI runs is MPI's
choice (MPICH picks by message size and rank count); ``python -m mpirl.bench`` can force
one through MPICH's CVARs to compare like with like.

Cost: that of the algorithm MPI picks.  :data:`MPICH_ALGORITHMS` gives the cost of each
algorithm ``mpirl.bench`` can force; the cost model predicts MPI's own choice as the
cheapest of them.  Four share a data flow with mpirl's topologies (recursive doubling:
butterfly; ring: ring; reduce_scatter_allgather: rabenseifner; binomial broadcast and
tree allreduce: tree); the other, with ``q`` the largest power of two <= p::

    scatter_ring_allgather    (bcast: binomial scatter, then ring allgather)
        messages log2(q) + p-1,  bytes moved 2(p-1)/p n
"""

from __future__ import annotations

import math

import numpy as np
from mpi4py import MPI

from .base import NO_COST, Cost, Topology, _msg, fold, no_model, sum_op
from .butterfly import Butterfly
from .rabenseifner import Rabenseifner
from .ring import Ring
from .tree import Tree


def _scatter_ring_allgather(op: str, p: int, n: float) -> Cost:
    q, _ = fold(p)
    return Cost(math.log2(q) + p - 1, 2 * (p - 1) / p * n, 0.0)


#: op -> MPICH algorithm -> its cost ``(op, p, n) -> Cost``
MPICH_ALGORITHMS = {
    "allreduce": {"recursive_doubling": Butterfly.cost, "ring": Ring.cost, "tree": Tree.cost,
                  "reduce_scatter_allgather": Rabenseifner.cost},
    "bcast": {"binomial": Tree.cost, "scatter_ring_allgather": _scatter_ring_allgather},
}


class Native(Topology):
    """The MPI library's ``Allreduce(IN_PLACE, SUM)`` and ``Bcast``."""

    name = "native"
    from_python = False

    @classmethod
    def cost(cls, op: str, p: int, n: float, algorithm: str | None = None) -> Cost:
        """The cost of MPICH's ``algorithm`` (which one MPI picks by itself depends on
        the machine: the cost model predicts it as the cheapest of them)."""
        if op not in MPICH_ALGORITHMS:
            raise no_model(cls.name, op)
        algorithms = MPICH_ALGORITHMS[op]
        if algorithm not in algorithms:
            raise KeyError(f"no cost model for {op} native:{algorithm}; give one of MPICH's "
                           f"algorithms: {', '.join(algorithms)}")
        return NO_COST if p == 1 else algorithms[algorithm](op, p, n)

    @classmethod
    def _cost(cls, op: str, p: int, n: float) -> Cost:
        return cls.cost(op, p, n)           # without an algorithm: the error naming them

    def _allreduce_sum(self, buf: np.ndarray) -> None:
        self.comm.Allreduce(MPI.IN_PLACE, _msg(buf), op=sum_op(buf.dtype))
        # What the library sends is its own business; count one logical message.
        self._count_sent(buf)
        self.stats.bytes_recv += buf.nbytes

    def _bcast(self, buf: np.ndarray, root: int) -> None:
        self.comm.Bcast(_msg(buf), root=root)
        if self.rank == root:
            self._count_sent(buf)
        else:
            self.stats.bytes_recv += buf.nbytes
