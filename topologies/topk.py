"""Top-k: the k largest entries of one rank's gradient, summed over all, with error feedback.

A sparsifying wrapper around any topology's allreduce.  Each rank's own top-k indices
differ, so their values cannot be summed by an allreduce as they are (that takes an
allgather of (index, value) pairs, p k pairs per rank).  This wrapper does as ScaleCom's
*cyclic local top-k* (Chen et al., NeurIPS 2020) does: per call, one rank, the leader,
taking turns (call t: rank t mod p), picks the k entries of largest magnitude of its own
accumulated gradient; the k indices are broadcast from it, and every rank's values at
those indices are allreduced, both through the inner topology.  What a rank did not send
stays in its *residual* (error feedback: Seide et al. 2014, Stich et al. 2018; the
"memory" of Lin et al.'s Deep Gradient Compression) and is added to its next gradient::

    m = g + e                          # this rank's gradient and its residual
    I = top_k(|m|) on the leader       # broadcast: k int32 indices
    s = allreduce(m[I])                # k values
    out = 0; out[I] = s (/ p)          # identical on every rank
    e = m; e[I] = 0                    # what this rank has not sent yet

So over any run, every rank's gradients are sent in full, some later than others: the
sum of what the outputs carried plus the residuals equals the sum of the gradients.
The output is zero outside I, so its bytes are identical on every rank.

* ``k = ceil(ratio n)``, ``ratio`` in (0, 1] (spec ``topk:RATIO[:INNER]``, default 0.01).
* Bytes: a bcast of ``4k`` and an allreduce of ``4k`` (float32) instead of ``4n``: the
  link bytes fall with ``ratio`` about as ``2 ratio`` (indices as 4-byte integers).
* State: the residual (one float per gradient element, per rank: ranks' residuals
  differ) and the call count (which rank leads); a checkpoint saves both
  (:meth:`TopK.state`).  A rank whose accumulated gradient holds a NaN or an infinity
  keeps its previous residual, so one bad gradient (``--nan-policy skip``) does not
  stay in the residual for ever.
* The residual is only replaced once both inner calls have returned: a redone exchange
  (``--on-failure shrink``) starts again from the same residual.

Cost: the inner topology's bcast and allreduce of ``4k`` bytes each, plus selecting
the top k (``argpartition``, linear in n) and two streams over the buffer, counted as
``2n`` bytes reduced.
"""

from __future__ import annotations

import math

import numpy as np

from .base import Cost, TopologyError, in_sequence
from .wrapper import Wrapper, inner_cost


class TopK(Wrapper):
    """Cyclic-leader top-k of the accumulated gradient, with error feedback."""

    name = "topk"
    option_name = "ratio"
    option = 0.01

    @classmethod
    def check_option(cls, text: str) -> float:
        ratio = float(text)
        if not 0.0 < ratio <= 1.0:
            raise TopologyError(f"topk ratio {text}; allowed: a fraction in (0, 1], the share "
                                "of gradient entries sent per call (e.g. topk:0.01)")
        return ratio

    @classmethod
    def _cost(cls, op: str, p: int, n: float) -> Cost:
        cost = inner_cost(cls, op, p, n)
        if cost is not None:
            return cost
        k = 4.0 * math.ceil(cls.option * n / 4)          # bytes of k float32 (or int32)
        both = in_sequence(cls.inner_cls.cost("bcast", p, k), cls.inner_cls.cost("allreduce", p, k))
        return Cost(both.messages, both.bytes_moved, both.bytes_reduced + 2 * n,
                    both.link_phases)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls_made = 0                      # which rank leads the next call
        self.residual: np.ndarray | None = None  # this rank's error feedback
        self._spare: np.ndarray | None = None    # the next residual, built before it counts
        self._index = np.empty(0, np.int32)
        self._values = np.empty(0)

    def k(self, n: int) -> int:
        return max(1, math.ceil(self.option * n))

    def _compressed_sum(self, flat: np.ndarray, average: bool) -> None:
        n, k = flat.size, self.k(flat.size)
        self._buffers(n, k, flat.dtype)
        acc = np.add(flat, self.residual, out=self._spare)          # m = g + e
        leader = self.calls_made % self.size
        if self.rank == leader:
            top = np.argpartition(np.abs(acc), n - k)[n - k:] if k < n else np.arange(n)
            top.sort()                     # ascending: the gathers walk memory in order
            self._index[:] = top
        # the indices travel as their four bytes (a bcast adds nothing: bits exact)
        self.inner_topology._broadcast(self._index_bits, self._index_bits, leader)
        index, values = self._index, self._values
        np.take(acc, index, out=values)
        self.inner_topology._sum(values, values)
        if average:
            np.divide(values, values.dtype.type(self.size), out=values)
        flat.fill(0)
        flat[index] = values
        self.calls_made += 1
        if np.isfinite(np.sum(acc)):       # else keep the old residual (a bad gradient)
            acc[index] = 0
            self.residual, self._spare = acc, self.residual

    def _buffers(self, n: int, k: int, dtype: np.dtype) -> None:
        if self.residual is None:
            self.residual = np.zeros(n, dtype)
        elif self.residual.size != n or self.residual.dtype != dtype:
            raise TopologyError(f"topk: a {n}-element {dtype} gradient after "
                                f"{self.residual.size}-element {self.residual.dtype} ones "
                                "(or a checkpoint's residual of that length); the residual "
                                "belongs to one gradient buffer")
        if self._spare is None or self._spare.size != n:
            self._spare = np.empty(n, dtype)
        if self._index.size != k:
            self._index = np.empty(k, np.int32)
            self._index_bits = self._index.view(np.float32)
            self._values = np.empty(k, dtype)

    def state(self) -> dict:
        return {} if self.residual is None else {"residual": self.residual.copy(),
                                                 "calls_made": self.calls_made}

    def load_state(self, state: dict) -> None:
        if "residual" in state:
            self.residual = np.array(state["residual"], copy=True)
            self.calls_made = int(state["calls_made"])

    def layout(self) -> str:
        return (f"{self.name}: {self.option:g} of the gradient's entries per call (the top k "
                f"of a leader taking turns), indices and values through {self.inner}; the "
                "rest kept as each rank's residual (error feedback); parameters sent exactly")
