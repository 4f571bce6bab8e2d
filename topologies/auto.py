"""Auto: per call, the algorithm the fitted cost model predicts fastest.

MPICH picks a collective's algorithm from selection tables (message size, communicator
size) tuned once by its developers.  ``auto`` does the same from this machine's or this
cluster's own fit: ``python -m mpirl.costmodel BENCH_FILES -o DIR`` writes
``DIR/params.json`` (alpha, beta, gamma, delta, ...), and ``auto:DIR/params.json``
predicts, for each call's size and the communicator's size, the time of every candidate
(:func:`topologies.model.seconds` of its ``cost``) and runs the cheapest.

* Candidates: mpirl's flat allreduces, ``tree``, ``butterfly``, ``ring`` and
  ``rabenseifner`` (their broadcasts too).  Not ``native``: which algorithm MPI runs is
  MPI's choice, which the model predicts only as a lower bound (the cheapest of MPICH's
  algorithms); not ``star`` (never cheaper than the tree in the model); not
  ``hierarchical`` (its cost has two levels, the fit one).
* Every rank must load the same parameters (construction checks it with one
  allgather), so every rank picks the same algorithm for the same call: the choice is a
  function of (op, bytes, ranks) alone, made once per size and kept.
* Plain ``auto`` uses :data:`DEFAULT_PARAMS`, a fit on a 2-core machine over shared
  memory; a cluster wants its own fit.
* ``choices`` records what was picked per (op, bytes), for the logs and the tests.

Cost: the chosen candidate's.  ``cost(op, p, n)`` is the cheapest candidate's cost under
the class's parameters.
"""

from __future__ import annotations

import functools
from typing import Callable, ClassVar

import numpy as np
from mpi4py import MPI

from .base import Cost, Topology, TopologyError
from .butterfly import Butterfly
from .model import Params, load_params, seconds, terms
from .rabenseifner import Rabenseifner
from .ring import Ring
from .tree import Tree

CANDIDATES: tuple[type[Topology], ...] = (Tree, Butterfly, Ring, Rabenseifner)

#: fitted by ``python -m mpirl.costmodel`` on mpirl.bench at 2 ranks over shared memory
#: (1 KiB to 8 MiB; a 2-core x86 development machine, MPICH 5.0.2)
DEFAULT_PARAMS = Params(alpha=3.14e-6, beta=1.27e-10, gamma=7.16e-11, delta=2.07e-6,
                        rendezvous=5.78e-6, eager_bytes=4096.0)


class Auto(Topology):
    """The candidate the cost model predicts fastest, per call size."""

    name = "auto"
    params: ClassVar[Params] = DEFAULT_PARAMS
    source: ClassVar[str] = "built-in"

    @classmethod
    def variant(cls, options: str, lookup: Callable[[str], type[Topology]]) -> type[Auto]:
        """``auto:PARAMS.json``: the parameters fitted by ``mpirl.costmodel``."""
        return _variant(options)

    @classmethod
    def pick(cls, op: str, p: int, n: float) -> type[Topology]:
        """The candidate with the least predicted time (the first of equals)."""
        return min(CANDIDATES, key=lambda c: seconds(cls.params, terms(op, c, p, n)))

    @classmethod
    def _cost(cls, op: str, p: int, n: float) -> Cost:
        return cls.pick(op, p, n).cost(op, p, n)

    def __init__(self, comm=MPI.COMM_WORLD, *, root: int = 0) -> None:
        super().__init__(comm, root=root)
        if len(set(comm.allgather(repr(self.params)))) > 1:
            raise TopologyError("auto: the ranks loaded different cost-model parameters; "
                                "every rank must read the same params.json")
        self.instances: dict[type[Topology], Topology] = {}
        self._picked: dict[tuple[str, int], Topology] = {}

    @property
    def choices(self) -> dict[tuple[str, int], str]:
        """(op, bytes) -> the registry name of the candidate picked for it so far."""
        return {key: topo.name for key, topo in self._picked.items()}

    def _candidate(self, op: str, buf: np.ndarray) -> Topology:
        topo = self._picked.get((op, buf.nbytes))
        if topo is None:
            cls = self.pick(op, self.size, float(buf.nbytes))
            topo = self.instances.get(cls)
            if topo is None:
                topo = self.instances[cls] = cls(self.comm, root=self.root)
                topo.stats = self.stats            # one set of counters for all of them
            self._picked[op, buf.nbytes] = topo
        return topo

    def _allreduce_sum(self, buf: np.ndarray) -> None:
        self._candidate("allreduce", buf)._sum(buf, buf)   # with its small-message path

    def _bcast(self, buf: np.ndarray, root: int) -> None:
        self._candidate("bcast", buf)._broadcast(buf, buf, root)

    def layout(self) -> str:
        return (f"auto: picks per call size among {', '.join(c.name for c in CANDIDATES)} "
                f"by the cost model ({self.source} parameters)")


@functools.lru_cache(maxsize=None)
def _variant(path: str) -> type[Auto]:
    if not path:
        return Auto
    try:
        params = load_params(path)
    except (OSError, ValueError, TypeError) as err:
        raise TopologyError(f"auto: cannot read cost-model parameters from {path!r} "
                            f"({err}); allowed: a params.json written by python -m "
                            "mpirl.costmodel -o DIR") from None
    return type("Auto_fitted", (Auto,), {"params": params, "source": path,
                                         "__doc__": Auto.__doc__})
