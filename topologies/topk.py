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
  differ; one per buffer length, as a buffer of another length is another gradient)
  and the call count (which rank leads); a checkpoint saves both (:meth:`TopK.state`).
  A rank whose accumulated gradient holds a NaN or an infinity keeps its previous
  residual, so one bad gradient (``--nan-policy skip``) does not stay in it for ever.
* The residual is only replaced once both inner calls have returned: a redone exchange
  (``--on-failure shrink``) starts again from the same residual.

Cost: the inner topology's bcast and allreduce of ``4k`` bytes each, plus selecting
the top k (``argpartition`` on unique keys, linear in n, whatever the ties) and two
streams over the buffer, counted as ``2n`` bytes reduced.
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
        #: this rank's error feedback, per gradient length (one per buffer exchanged)
        self.residuals: dict[int, np.ndarray] = {}
        self._spare = np.empty(0)                # the next residual, built before it counts
        self._index = np.empty(0, np.int32)
        self._values = np.empty(0)
        self._key = np.empty(0, np.uint64)       # the selection's keys (see _top)

    def k(self, n: int) -> int:
        return max(1, math.ceil(self.option * n))

    def _compressed_sum(self, flat: np.ndarray, average: bool) -> None:
        n, k = flat.size, self.k(flat.size)
        residual = self._buffers(n, k, flat.dtype)
        acc = np.add(flat, residual, out=self._spare)               # m = g + e
        leader = self.calls_made % self.size
        if self.rank == leader:
            self._index[:] = self._top(acc, k)
        # the indices travel as their four bytes (a bcast adds nothing: bits exact).  The
        # leader takes turns: a schedule per leader, those that do not fit in the kept
        # schedules taking the blocking path (topologies.persistent)
        bits = self._index_bits
        self.inner_topology._broadcast(bits, bits, leader)
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
            self.residuals[n], self._spare = acc, residual

    def _top(self, acc: np.ndarray, k: int) -> np.ndarray:
        """The indices of the k entries of largest magnitude, ascending.

        Selected on unique keys (the magnitude's float32 bits, which order as integers,
        above the index: ties go to the higher index): numpy's introselect degrades
        from linear to some 40 ms per 256 Ki entries when most of them tie (a gradient
        of many exact zeros, or of few distinct values), and unique keys keep it at a
        few ms whatever the data."""
        n = acc.size
        if k >= n:
            return np.arange(n)
        if self._key.size != n:
            self._key = np.empty(n, np.uint64)
            self._positions = np.arange(n, dtype=np.uint64)
            self._magnitude = np.empty(n, np.float32)
        magnitude = self._magnitude
        np.abs(acc, out=magnitude, casting="same_kind")      # float64: rounded to float32
        key = self._key
        key[:] = magnitude.view(np.uint32)
        key <<= np.uint64(32)
        key |= self._positions
        top = np.argpartition(key, n - k)[n - k:]
        top.sort()                         # ascending: the gathers walk memory in order
        return top

    def _buffers(self, n: int, k: int, dtype: np.dtype) -> np.ndarray:
        """This length's residual (zeros the first time); the scratch buffers sized."""
        residual = self.residuals.get(n)
        if residual is None:
            residual = self.residuals[n] = np.zeros(n, dtype)
        elif residual.dtype != dtype:
            raise TopologyError(f"topk: a {dtype} gradient of {n} elements after "
                                f"{residual.dtype} ones (or a checkpoint's residual); the "
                                "residual belongs to one gradient buffer")
        if self._spare.size != n or self._spare.dtype != dtype:
            self._spare = np.empty(n, dtype)
        if self._index.size != k or self._values.dtype != dtype:
            self._index = np.empty(k, np.int32)
            self._index_bits = self._index.view(np.float32)
            self._values = np.empty(k, dtype)
        return residual

    def state(self) -> dict:
        if not self.residuals:
            return {}
        return {"calls_made": self.calls_made,
                **{f"residual_{n}": r.copy() for n, r in self.residuals.items()}}

    def load_state(self, state: dict) -> None:
        residuals = {int(key[len("residual_"):]): np.array(value, copy=True)
                     for key, value in state.items() if key.startswith("residual_")}
        if residuals:
            self.residuals = residuals
            self.calls_made = int(state["calls_made"])

    def layout(self) -> str:
        return (f"{self.name}: {self.option:g} of the gradient's entries per call (the top k "
                f"of a leader taking turns), indices and values through {self.inner}; the "
                "rest kept as each rank's residual (error feedback); parameters sent exactly")
