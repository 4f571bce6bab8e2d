"""Cast: allreduce in half precision (float16 or bfloat16) over any other topology.

The simplest gradient compression, as PyTorch DDP's ``fp16_compress_hook`` /
``bf16_compress_hook`` and Horovod's ``Compression.fp16`` do it: a wrapper around an
exchange, not an exchange of its own.  Each call

1. divides the float32 (or float64) buffer by the rank count *before* the cast, as
   DDP's hook does, when the caller asks for the average: the sum of p values of at
   most ``max|g|`` then stays below ``max|g|``, so float16's 65504 overflows only where
   one rank's own gradient already would;
2. casts into a half-precision scratch buffer (one per length, kept) and allreduces that
   with the inner topology, so every message carries half the bytes (a quarter of a
   float64 buffer's), with the inner topology's own algorithm, checks and small-message
   path; the additions happen in half precision, in the inner topology's order;
3. casts the sum back into the caller's buffer.

The inner topology leaves identical half-precision bytes on every rank, and the cast
back is a function of them, so the replicas stay byte-identical.  ``bcast`` is not
compressed: it sends the parameters, which must arrive exactly.

* **fp16** (IEEE half): 10 mantissa bits, range 6e-8..65504; small gradients lose
  precision or flush to zero (below 6e-8, the subnormal limit).
* **bf16** (bfloat16, ``ml_dtypes``): 7 mantissa bits, float32's range; nothing
  overflows or flushes, every value is rounded more coarsely.

Spec: ``fp16[:INNER]`` / ``bf16[:INNER]``, INNER any other spec (default ring), e.g.
``bf16:hierarchical:butterfly:2``; ``mpirl.run --compress fp16 --topology T`` composes
it.  ``native`` as INNER sums with a user-defined MPI op (numpy's half addition), as MPI
has no half-precision type of its own.

Cost: the inner topology's for ``n/2`` bytes (the caller's buffer taken as float32),
plus two casts, counted as ``n`` bytes reduced (they stream over the buffer as an add
does).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from mpi4py import MPI

from .base import FLOAT16, Cost, bfloat16
from .wrapper import Wrapper, inner_cost


#: half-precision buffers kept, one per buffer length
LENGTHS_KEPT = 8


class Cast(Wrapper):
    """Allreduce of a half-precision copy through ``inner``; ``bcast`` unchanged."""

    name = "cast"
    #: the dtype sent (set by the registered subclasses: a function giving it, so that
    #: ml_dtypes is imported only where bf16 runs)
    half_dtype: ClassVar = staticmethod(lambda: FLOAT16)

    @classmethod
    def _cost(cls, op: str, p: int, n: float) -> Cost:
        inner = inner_cost(cls, op, p, n) or cls.inner_cls.cost(op, p, n / 2)
        if op == "bcast":
            return inner
        return Cost(inner.messages, inner.bytes_moved, inner.bytes_reduced + n,
                    inner.link_phases)

    def __init__(self, comm=MPI.COMM_WORLD, *, root: int = 0) -> None:
        super().__init__(comm, root=root)
        self._halves: dict[int, np.ndarray] = {}
        self.half = self.half_dtype()

    def _compressed_sum(self, flat: np.ndarray, average: bool) -> None:
        half = self._half(flat.size)
        if average:         # DDP's fp16 hook: divide first, so the sum cannot overflow
            np.divide(flat, self.size, out=half, casting="same_kind")
        else:
            np.copyto(half, flat, casting="same_kind")
        self.inner_topology._sum(half, half)
        np.copyto(flat, half, casting="same_kind")

    def _half(self, count: int) -> np.ndarray:
        """The half-precision buffer for ``count`` elements: the same array every call of
        one length (the inner topology's small-message path plans it), for the last
        :data:`LENGTHS_KEPT` lengths (``--overlap``'s buckets take turns)."""
        half = self._halves.get(count)
        if half is None:
            if len(self._halves) >= LENGTHS_KEPT:
                del self._halves[next(iter(self._halves))]     # the oldest length
            half = self._halves[count] = np.empty(count, self.half)
        return half

    def layout(self) -> str:
        return (f"{self.name}: gradients summed in {self.half.name} through {self.inner} "
                "(divided by the rank count before the cast); parameters sent exactly")


class Fp16(Cast):
    """IEEE float16."""

    name = "fp16"


class Bf16(Cast):
    """bfloat16."""

    name = "bf16"
    half_dtype = staticmethod(bfloat16)
