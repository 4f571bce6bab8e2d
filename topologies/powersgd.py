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
* **State:** the residual (per rank) and the Q's (the same on every rank), one of each
  per buffer length (another length is another gradient), saved by a checkpoint
  (:meth:`PowerSGD.state`); the first Q's are drawn from a fixed seed, the same on
  every rank.  Nothing changes until both allreduces have returned, so a redone
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


class Plan:
    """One buffer length's layout: each compressed matrix as (its slice of the buffer,
    rows, cols, its slice of the P buffer, its slice of the Q buffer), the indices sent
    uncompressed, and the scratch buffers (kept: the inner small-message path plans
    them)."""

    def __init__(self, shapes: list[tuple[int, ...]], rank: int, dtype: np.dtype) -> None:
        matrices, plain = plan(shapes, rank)
        n = sum(math.prod(s) for s in shapes)
        in_matrix = np.zeros(n, bool)
        self.views, p_at, q_at = [], 0, 0
        for off, rows, cols in matrices:
            in_matrix[off:off + rows * cols] = True
            self.views.append((slice(off, off + rows * cols), rows, cols,
                               slice(p_at, p_at + rows * rank),
                               slice(q_at, q_at + cols * rank)))
            p_at, q_at = p_at + rows * rank, q_at + cols * rank
        self.rank, self.dtype, self.p_len, self.q_len = rank, dtype, p_at, q_at
        self.plain = np.flatnonzero(~in_matrix)
        self.pbuf = np.empty(p_at + plain, dtype)        # the P's, then the rest
        self.qbuf = np.empty(q_at, dtype)                # the Q's, summed
        self.mine = np.empty(q_at, dtype)                # this rank's Q's
        self.spare = np.empty(n, dtype)                  # the next residual
        #: this rank's share of the largest matrix's output (no allocation per call)
        self.share = np.empty(max((rows * cols for _, rows, cols, _, _ in self.views),
                                  default=0), dtype)


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
        #: per gradient length (one per buffer exchanged): this rank's residual, and every
        #: matrix's Q in one flat buffer (the same on every rank)
        self.residuals: dict[int, np.ndarray] = {}
        self.qs: dict[int, np.ndarray] = {}
        self._plans: dict[int, Plan] = {}

    def describe(self, shapes: list[tuple[int, ...]]) -> None:
        """The tensors the caller's buffer holds, in order (C order each)."""
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        self._plans.clear()

    def _plan(self, n: int, dtype: np.dtype) -> Plan:
        shapes = self.shapes if self.shapes is not None else [square(n)]
        if sum(math.prod(s) for s in shapes) != n:
            raise TopologyError(f"powersgd: the tensors described hold "
                                f"{sum(math.prod(s) for s in shapes)} elements, the buffer "
                                f"{n}; describe() the buffer that is exchanged")
        plan_ = Plan(shapes, int(self.option), dtype)
        qs = self.qs.get(n)
        if qs is None:
            self.qs[n] = np.random.default_rng(SEED).standard_normal(plan_.q_len).astype(dtype)
        elif qs.size != plan_.q_len or qs.dtype != dtype:
            raise TopologyError(f"powersgd: saved Q's of {qs.size} {qs.dtype} elements; the "
                                f"buffer's matrices need {plan_.q_len} {dtype}")
        residual = self.residuals.setdefault(n, np.zeros(n, dtype))
        if residual.dtype != dtype:
            raise TopologyError(f"powersgd: a {dtype} gradient of {n} elements after "
                                f"{residual.dtype} ones; the residual belongs to one buffer")
        self._plans[n] = plan_
        return plan_

    def _compressed_sum(self, flat: np.ndarray, average: bool) -> None:
        n = flat.size
        pl = self._plans.get(n)
        if pl is None or pl.dtype != flat.dtype:
            pl = self._plan(n, flat.dtype)
        r, pbuf, qbuf, mine, qs = pl.rank, pl.pbuf, pl.qbuf, pl.mine, self.qs[n]
        residual = self.residuals[n]
        acc = np.add(flat, residual, out=pl.spare)                    # M = G + E
        for at, rows, cols, ps, qv in pl.views:
            np.matmul(acc[at].reshape(rows, cols), qs[qv].reshape(cols, r),
                      out=pbuf[ps].reshape(rows, r))
        np.take(acc, pl.plain, out=pbuf[pl.p_len:])
        self.inner_topology._sum(pbuf, pbuf)                          # the P's and the rest
        for at, rows, cols, ps, qv in pl.views:
            p = pbuf[ps].reshape(rows, r)
            p[:] = np.linalg.qr(p)[0]                                 # orthonormal columns
            np.matmul(acc[at].reshape(rows, cols).T, p, out=mine[qv].reshape(cols, r))
        qbuf[:] = mine
        self.inner_topology._sum(qbuf, qbuf)                          # the Q's
        for at, rows, cols, ps, qv in pl.views:
            p, q = pbuf[ps].reshape(rows, r), qbuf[qv].reshape(cols, r)
            np.matmul(p, q.T, out=flat[at].reshape(rows, cols))       # out = P Q^T
            share = pl.share[:rows * cols].reshape(rows, cols)
            np.matmul(p, mine[qv].reshape(cols, r).T, out=share)      # P Q_mine^T
            m = acc[at].reshape(rows, cols)
            np.subtract(m, share, out=m)                              # E = M - P Q_mine^T
        flat[pl.plain] = pbuf[pl.p_len:]
        if average:
            np.divide(flat, flat.dtype.type(self.size), out=flat)
        if np.isfinite(np.sum(qbuf)):      # warm start (a NaN anywhere would stay in it)
            qs[:] = qbuf
        if np.isfinite(np.sum(acc)):       # else keep the old residual (a bad gradient)
            acc[pl.plain] = 0
            self.residuals[n], pl.spare = acc, residual

    def state(self) -> dict:
        out: dict = {}
        for n, residual in self.residuals.items():
            out[f"residual_{n}"], out[f"qs_{n}"] = residual.copy(), self.qs[n].copy()
        return out

    def load_state(self, state: dict) -> None:
        lengths = [int(key[len("residual_"):]) for key in state if key.startswith("residual_")]
        if lengths:
            self.residuals = {n: np.array(state[f"residual_{n}"], copy=True) for n in lengths}
            self.qs = {n: np.array(state[f"qs_{n}"], copy=True) for n in lengths}
            self._plans.clear()

    def layout(self) -> str:
        what = "the tensors described" if self.shapes is not None else "the buffer as one matrix"
        return (f"{self.name}: rank-{int(self.option)} products of {what} (where they save "
                f"bytes), P and Q through {self.inner}; the rest kept as each rank's residual "
                "(error feedback); parameters sent exactly")
