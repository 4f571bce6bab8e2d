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
from .base import (SMALL_PATHS, BufferMismatchError, CommStats, Topology, TopologyError,
                   check_env)
from .butterfly import Butterfly
from .cast import Bf16, Fp16
from .hierarchical import Hierarchical
from .native import Native
from .powersgd import PowerSGD
from .rabenseifner import Rabenseifner
from .ring import Ring
from .star import Star
from .topk import TopK
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

#: Compression wrappers: ``NAME:SPEC`` runs topology SPEC with the wrapper around its
#: allreduce (as DDP's comm hooks and Horovod's Compression wrap an exchange); not
#: topologies themselves, so not in :func:`names`.
WRAPPERS: dict[str, type[Topology]] = {
    "fp16": Fp16,            # gradients summed as float16, divided before the cast
    "bf16": Bf16,            # gradients summed as bfloat16, divided before the cast
    "topk": TopK,            # top-k entries (a leader taking turns), error feedback
    "powersgd": PowerSGD,    # rank-r products per weight matrix, error feedback
}


class UnknownTopologyError(TopologyError, KeyError):
    """A topology name that is not in the registry."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return self.args[0]


def wrappers() -> list[str]:
    """The compression wrappers' names (:data:`WRAPPERS`)."""
    return list(WRAPPERS)


def names() -> list[str]:
    """The registered topology names, in table order."""
    return list(REGISTRY)


def get(name: str) -> type[Topology]:
    """The topology class registered as ``name``; unknown names list the valid ones.

    ``NAME:OPTIONS`` names a variant of a topology that takes options (its classmethod
    ``variant``), e.g. ``hierarchical:butterfly:2``; ``WRAPPER:SPEC`` a topology inside a
    compression wrapper, e.g. ``fp16:ring``, ``topk:0.01:butterfly``, ``powersgd:4``."""
    base, _, options = name.partition(":") if isinstance(name, str) else (name, "", "")
    try:
        cls = REGISTRY[base] if base in REGISTRY else WRAPPERS[base]
    except (KeyError, TypeError):
        raise UnknownTopologyError(
            f"unknown topology {name!r}; valid names: {', '.join(REGISTRY)} (and the "
            f"wrappers {', '.join(w + ':NAME' for w in WRAPPERS)})") from None
    if not options:
        return cls
    if not hasattr(cls, "variant"):
        raise UnknownTopologyError(f"topology {base!r} takes no options (got {name!r})")
    return cls.variant(options, get)


__all__ = ["REGISTRY", "SMALL_PATHS", "WRAPPERS", "BufferMismatchError", "CommStats",
           "Topology", "TopologyError", "UnknownTopologyError", "check_env", "get", "names",
           "wrappers"]
