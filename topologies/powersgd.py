"""PowerSGD: each weight matrix's gradient sent as a rank-r product, with error feedback.

Vogels, Karimireddy & Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization" (NeurIPS 2019), as PyTorch DDP's ``powerSGD_hook`` applies it:
a wrapper around any topology's allreduce.  For each matrix M (rows x cols) of the
caller's buffer, with Q (cols x r) kept from the last call (*warm start*)::

    M = G + E                      # this rank's gradient and residual
    P = allreduce(M Q)             # rows x r, all matrices' P in one buffer
    P = orthonormal(P)             # numpy's QR: the same bytes on every rank
    Q_mine = M^T P                 # cols x r
    Q = allreduce(Q_mine)          # all matrices' Q in one buffer
    out = P Q^T (/ p)              # rows x cols, identical on every rank
    E = M - P Q_mine^T             # what this rank's share of ``out`` left out

``out`` is ``sum_i P P^T M_i``: rank i's share is the projection of its own M_i, so its
residual is ``M_i - P P^T M_i`` (the paper's and DDP's hook subtract the averaged
approximation instead; both keep the sum of residuals and outputs equal to the sum of
gradients).  Q, the same on every rank after the allreduce, is kept for the next call.

* **Which tensors:** a tensor of shape (rows, cols, ...) is taken as rows x (cols ...);
  it is compressed only where that saves bytes by DDP's rule
  ``(rows + cols) r min_rate < rows cols`` (``min_rate`` = :data:`MIN_RATE`); every other
  element (biases, small layers) travels uncompressed in the first allreduce, beside
  the P's.  The runtime says what the buffer holds with :meth:`PowerSGD.describe`;
  without it the whole buffer is taken as the most nearly square matrix its length
  allows (``mpirl.bench``'s flat buffers).
* **Rank** ``r`` (spec ``powersgd:RANK[:INNER]``, default 2): an integer >= 1.
* **Bytes:** two allreduces of ``4 (sum (rows + cols) r + uncompressed)`` bytes in all,
  instead of ``4n``.
* **State:** the residual (per rank) and the Q's (the same on every rank), saved by a
  checkpoint (:meth:`PowerSGD.state`); the first Q's are drawn from a fixed seed, the
  same on every rank.  Nothing changes until both allreduces have returned, so a redone
  exchange (``--on-failure shrink``) starts from the same state.  A rank whose M holds
  a NaN or an infinity keeps its previous residual.

Cost: the inner allreduce of the P buffer then of the Q buffer, plus the products
(``4 r n`` multiply-adds per matrix, counted as ``4 r n`` bytes reduced; QR is small).
"""

from __future__ import annotations

import math

import numpy as np

from .base import Cost, TopologyError, in_sequence
from .wrapper import Wrapper, inner_cost

#: DDP's ``min_compression_rate``: compress a matrix only if it shrinks by this much
MIN_RATE = 2.0
#: the seed of the first Q's (the same on every rank)
SEED = 20190527


def matrix_of(shape: tuple[int, ...]) -> tuple[int, int] | None:
    """(rows, cols) a tensor of ``shape`` is taken as, or None for a vector or scalar."""
    if len(shape) < 2:
        return None
    return int(shape[0]), int(math.prod(shape[1:]))


def square(n: int) -> tuple[int, int]:
    """The most nearly square (rows, cols) with rows * cols == n, rows <= cols."""
    rows = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return rows, n // rows


def plan(shapes: list[tuple[int, ...]], rank: int) -> tuple[list[tuple[int, int, int]], int]:
    """The compressed matrices as (offset, rows, cols), and the count of the elements
    sent uncompressed."""
    matrices, offset, plain = [], 0, 0
    for shape in shapes:
        size = int(math.prod(shape))
        mat = matrix_of(shape)
        if mat is not None and (mat[0] + mat[1]) * rank * MIN_RATE < mat[0] * mat[1]:
            matrices.append((offset, *mat))
        else:
            plain += size
        offset += size
    return matrices, plain


class PowerSGD(Wrapper):
    """Rank-r power iteration per weight matrix, warm-started, with error feedback."""

    name = "powersgd"
    option_name = "rank"
    option = 2

    @classmethod
    def check_option(cls, text: str) -> int:
        if not (text.isdigit() and int(text) >= 1):
            raise TopologyError(f"powersgd rank {text}; allowed: an integer >= 1, the rank "
                                "of each matrix's approximation (e.g. powersgd:2)")
        return int(text)

    @classmethod
    def _cost(cls, op: str, p: int, n: float) -> Cost:
        cost = inner_cost(cls, op, p, n)
        if cost is not None:
            return cost
        rows, cols = square(max(1, int(n // 4)))
        r = int(cls.option)
        if (rows + cols) * r * MIN_RATE >= rows * cols:
            return cls.inner_cls.cost(op, p, n)
        both = in_sequence(cls.inner_cls.cost(op, p, 4.0 * rows * r),
                           cls.inner_cls.cost(op, p, 4.0 * cols * r))
        return Cost(both.messages, both.bytes_moved, both.bytes_reduced + 4 * r * n,
                    both.link_phases)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.shapes: list[tuple[int, ...]] | None = None
        self.residual: np.ndarray | None = None
        self.qs: np.ndarray | None = None        # every matrix's Q, one flat buffer
        self._planned: tuple | None = None
        self._spare: np.ndarray | None = None    # the next residual, built before it counts

    def describe(self, shapes: list[tuple[int, ...]]) -> None:
        """The tensors the caller's buffer holds, in order (C order each)."""
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        self._planned = None

    def _plan(self, n: int, dtype: np.dtype) -> tuple:
        shapes = self.shapes if self.shapes is not None else [square(n)]
        if sum(math.prod(s) for s in shapes) != n:
            raise TopologyError(f"powersgd: the tensors described hold "
                                f"{sum(math.prod(s) for s in shapes)} elements, the buffer "
                                f"{n}; describe() the buffer that is exchanged")
        r = int(self.option)
        matrices, plain = plan(shapes, r)
        in_matrix = np.zeros(n, bool)
        for off, rows, cols in matrices:
            in_matrix[off:off + rows * cols] = True
        plain_index = np.flatnonzero(~in_matrix)
        p_len = sum(rows * r for _, rows, _ in matrices)
        q_len = sum(cols * r for _, _, cols in matrices)
        pbuf, qbuf = np.empty(p_len + plain, dtype), np.empty(q_len, dtype)
        mine = np.empty(q_len, dtype)
        if self.qs is None or self.qs.size != q_len or self.qs.dtype != dtype:
            if self.qs is not None:
                raise TopologyError(f"powersgd: saved Q's of {self.qs.size} elements, the "
                                    f"buffer's matrices need {q_len}")
            self.qs = np.random.default_rng(SEED).standard_normal(q_len).astype(dtype)
        if self.residual is None:
            self.residual = np.zeros(n, dtype)
        elif self.residual.size != n or self.residual.dtype != dtype:
            raise TopologyError(f"powersgd: a {n}-element {dtype} gradient after "
                                f"{self.residual.size}-element {self.residual.dtype} ones; "
                                "the residual belongs to one gradient buffer")
        views, p_at, q_at = [], 0, 0
        for off, rows, cols in matrices:
            views.append((slice(off, off + rows * cols), rows, cols,
                          slice(p_at, p_at + rows * r), slice(q_at, q_at + cols * r)))
            p_at, q_at = p_at + rows * r, q_at + cols * r
        self._spare = np.empty(n, dtype)
        self._planned = (n, dtype, views, plain_index, pbuf, qbuf, mine, p_len)
        return self._planned

    def _compressed_sum(self, flat: np.ndarray, average: bool) -> None:
        planned = self._planned
        if planned is None or planned[0] != flat.size or planned[1] != flat.dtype:
            planned = self._plan(flat.size, flat.dtype)
        _, _, views, plain_index, pbuf, qbuf, mine, p_len = planned
        r = int(self.option)
        acc = np.add(flat, self.residual, out=self._spare)            # M = G + E
        for at, rows, cols, ps, qs in views:
            np.matmul(acc[at].reshape(rows, cols), self.qs[qs].reshape(cols, r),
                      out=pbuf[ps].reshape(rows, r))
        np.take(acc, plain_index, out=pbuf[p_len:])
        self.inner_topology._sum(pbuf, pbuf)                          # the P's and the rest
        for at, rows, cols, ps, qs in views:
            p = pbuf[ps].reshape(rows, r)
            p[:] = np.linalg.qr(p)[0]                                 # orthonormal columns
            m = acc[at].reshape(rows, cols)
            np.matmul(m.T, p, out=mine[qs].reshape(cols, r))
        qbuf[:] = mine
        self.inner_topology._sum(qbuf, qbuf)                          # the Q's
        scale = qbuf.dtype.type(self.size) if average else None
        for at, rows, cols, ps, qs in views:
            p, q = pbuf[ps].reshape(rows, r), qbuf[qs].reshape(cols, r)
            np.matmul(p, q.T, out=flat[at].reshape(rows, cols))       # out = P Q^T
            m = acc[at].reshape(rows, cols)
            m -= p @ mine[qs].reshape(cols, r).T                      # E = M - P Q_mine^T
        flat[plain_index] = pbuf[p_len:]
        if scale is not None:
            np.divide(flat, scale, out=flat)
        if np.isfinite(np.sum(qbuf)):      # warm start (a NaN anywhere would stay in it)
            self.qs[:] = qbuf
        if np.isfinite(np.sum(acc)):       # else keep the old residual (a bad gradient)
            acc[plain_index] = 0
            self.residual, self._spare = acc, self.residual

    def state(self) -> dict:
        if self.residual is None:
            return {}
        return {"residual": self.residual.copy(), "qs": self.qs.copy()}

    def load_state(self, state: dict) -> None:
        if "residual" in state:
            self.residual = np.array(state["residual"], copy=True)
            self.qs = np.array(state["qs"], copy=True)
            self._planned = None

    def layout(self) -> str:
        what = "the tensors described" if self.shapes is not None else "the buffer as one matrix"
        return (f"{self.name}: rank-{int(self.option)} products of {what} (where they save "
                f"bytes), P and Q through {self.inner}; the rest kept as each rank's residual "
                "(error feedback); parameters sent exactly")
