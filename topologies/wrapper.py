"""What every compression wrapper shares: an inner topology, its spec, its state.

A wrapper is not an exchange of its own (as PyTorch DDP's comm hooks and Horovod's
``Compression`` are not): it turns the caller's gradient into a smaller buffer (or two),
has the inner topology allreduce that with its own algorithm, checks and small-message
path, and turns the sum back.  ``bcast`` (parameters, which must arrive exactly) goes
through the inner topology unchanged.

Spec: ``NAME[:OPTION][:INNER]``: ``OPTION`` is the wrapper's one number where it has one
(top-k's ratio, PowerSGD's rank), told apart from ``INNER`` by being a number; ``INNER``
is any topology spec that is not itself a wrapper (default ring).

Wrappers with error feedback keep state between calls (each rank's residual, PowerSGD's
warm-start matrices): :meth:`Wrapper.state` gives it as numpy arrays and numbers, and
:meth:`Wrapper.load_state` puts it back, so that a checkpoint can hold it.
"""

from __future__ import annotations

import functools
from typing import Callable, ClassVar

import numpy as np
from mpi4py import MPI

from .base import Cost, Topology, TopologyError, check_buffer
from .ring import Ring

DEFAULT_INNER = "ring"
#: the buffers a wrapper compresses
FULL = (np.dtype(np.float32), np.dtype(np.float64))


class Wrapper(Topology):
    """A compression wrapper around ``inner_cls``; subclasses implement
    :meth:`_compressed_sum` (and :meth:`_cost`)."""

    name = "wrapper"
    inner: ClassVar[str] = DEFAULT_INNER
    inner_cls: ClassVar[type[Topology]] = Ring
    #: the wrapper's numeric option: its name in errors ("" for none), default and value
    option_name: ClassVar[str] = ""
    option: ClassVar[float] = 0.0

    @classmethod
    def variant(cls, options: str, lookup: Callable[[str], type[Topology]]) -> type[Wrapper]:
        """The class for ``NAME:OPTIONS`` (``OPTIONS`` = ``[OPTION:]INNER``)."""
        first, _, rest = options.partition(":")
        if cls.option_name and _is_number(first):
            return _variant(cls, cls.check_option(first), rest or DEFAULT_INNER, lookup)
        return _variant(cls, cls.option, options or DEFAULT_INNER, lookup)

    @classmethod
    def check_option(cls, text: str) -> float:
        """The option parsed, or TopologyError saying what is allowed (subclasses)."""
        raise TopologyError(f"{cls.name} takes no option (got {text!r})")

    def __init__(self, comm=MPI.COMM_WORLD, *, root: int = 0) -> None:
        super().__init__(comm, root=root)
        self.inner_topology = self.inner_cls(comm, root=root)
        self.inner_topology.stats = self.stats     # the bytes counted are the bytes sent

    def allreduce(self, buf: np.ndarray, *, average: bool = False) -> np.ndarray:
        flat = check_buffer(buf)
        if flat.dtype not in FULL:
            raise TopologyError(f"{self.name} compresses float32 or float64 buffers; got "
                                f"{flat.dtype} (pass the full-precision gradient)")
        self.stats.calls += 1
        if self.size > 1:                 # one rank exchanges nothing: nothing compressed
            self._compressed_sum(flat, average)
        return buf

    def _compressed_sum(self, flat: np.ndarray, average: bool) -> None:
        """Leave the (lossy) sum over ranks in ``flat``, or the average if ``average``;
        the inner calls are made with ``inner_topology._sum`` (not counted again)."""
        raise NotImplementedError

    def communicators(self) -> list[MPI.Comm]:
        return self.inner_topology.communicators()

    def _allreduce_sum(self, buf: np.ndarray) -> None:
        """The sum, compressed: for a topology that runs this one inside it."""
        self._compressed_sum(buf, False)

    def _bcast(self, buf: np.ndarray, root: int) -> None:
        self.inner_topology._broadcast(buf, buf, root)


def inner_cost(cls: type[Wrapper], op: str, p: int, n: float) -> Cost | None:
    """``bcast``'s cost (the inner topology's, uncompressed), or None for allreduce."""
    return cls.inner_cls.cost(op, p, n) if op == "bcast" else None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _variant(cls: type[Wrapper], option: float, inner: str,
             lookup: Callable[[str], type[Topology]]) -> type[Wrapper]:
    inner_cls = lookup(inner)           # unknown names: the registry's error
    if issubclass(inner_cls, Wrapper):
        raise TopologyError(f"{cls.name} cannot wrap {inner!r}: one compression is enough; "
                            "allowed: any topology that is not a compression wrapper")
    suffix = f"{option:g}".replace(".", "_") if cls.option_name else ""
    return type(f"{cls.__name__}{suffix}_{inner.replace(':', '_')}", (cls,),
                {"inner": inner, "inner_cls": inner_cls, "option": option,
                 "from_python": inner_cls.from_python, "__doc__": cls.__doc__})
