"""Gradient-exchange topologies, registered by name.

Each module holds one exchange pattern; this table is the only place that lists them.
Adding a topology means adding one module with a :class:`~topologies.base.Topology`
subclass and one row below.

>>> from mpi4py import MPI
>>> import numpy as np, topologies
>>> topo = topologies.get("butterfly")(MPI.COMM_WORLD)
>>> grad = np.ones(10, dtype=np.float32)
>>> topo.allreduce(grad, average=True)   # in place, identical on every rank
"""

from __future__ import annotations

from .auto import Auto
from .base import BufferMismatchError, CommStats, Topology, TopologyError
from .butterfly import Butterfly
from .hierarchical import Hierarchical
from .native import Native
from .rabenseifner import Rabenseifner
from .ring import Ring
from .star import Star
from .tree import Tree

REGISTRY: dict[str, type[Topology]] = {
    "native": Native,        # MPI_Allreduce / MPI_Bcast: the baseline
    "star": Star,            # parameter server: everything through one root
    "tree": Tree,            # binomial reduce + binomial broadcast
    "butterfly": Butterfly,  # recursive doubling, non-power-of-two fold
    "ring": Ring,            # reduce-scatter + allgather
    "rabenseifner": Rabenseifner,  # recursive halving + doubling, non-power-of-two fold
    "hierarchical": Hierarchical,  # node reduce, leaders' inner topology, node bcast
    "auto": Auto,            # per call size, the candidate the fitted cost model picks
}


class UnknownTopologyError(TopologyError, KeyError):
    """A topology name that is not in the registry."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return self.args[0]


def names() -> list[str]:
    """The registered topology names, in table order."""
    return list(REGISTRY)


def get(name: str) -> type[Topology]:
    """The topology class registered as ``name``; unknown names list the valid ones.

    ``NAME:OPTIONS`` names a variant of a topology that takes options (its classmethod
    ``variant``), e.g. ``hierarchical:butterfly:2``."""
    base, _, options = name.partition(":") if isinstance(name, str) else (name, "", "")
    try:
        cls = REGISTRY[base]
    except (KeyError, TypeError):
        raise UnknownTopologyError(
            f"unknown topology {name!r}; valid names: {', '.join(REGISTRY)}") from None
    if not options:
        return cls
    if not hasattr(cls, "variant"):
        raise UnknownTopologyError(f"topology {base!r} takes no options (got {name!r})")
    return cls.variant(options, get)


__all__ = ["REGISTRY", "BufferMismatchError", "CommStats", "Topology", "TopologyError",
           "UnknownTopologyError", "get", "names"]
