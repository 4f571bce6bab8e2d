"""The alpha-beta-gamma cost model of every exchange, fitted to ``mpirl.bench`` results.

    python -m mpirl.costmodel runs/bench -o figures/costmodel     # fit, errors, crossovers

A collective on ``p`` ranks and ``n`` bytes costs (Hockney; Thakur, Rabenseifner and
Gropp 2005)::

    T = a * alpha + b * beta + c * gamma   (+ a * delta for mpirl's Python topologies)

with ``a`` the messages on the critical path, ``b`` the bytes each rank on it moves,
``c`` the bytes it reduces; ``alpha`` is the latency of one message, ``beta`` seconds per
byte moved, ``gamma`` seconds per byte reduced, and ``delta`` the extra per-message cost of
a call made from Python (mpi4py call, numpy add, bookkeeping).  With
``q = 2^floor(log2 p)`` and ``r = p - q`` (ranks left over from a power of two):

================================  ====================  ====================  ==================
exchange (allreduce)              a (messages)          b (bytes moved)       c (bytes reduced)
================================  ====================  ====================  ==================
butterfly, MPICH recursive_dbl    log2(q) + 2[r>0]      (log2(q)+2[r>0]) n    (log2(q)+[r>0]) n
ring, MPICH ring                  2(p-1)                2(p-1)/p n            (p-1)/p n
tree (binomial reduce + bcast)    2 ceil(log2 p)        2 ceil(log2 p) n      ceil(log2 p) n
star (root gathers, adds, sends)  2(p-1)                2(p-1) n              (p-1) n
MPICH reduce_scatter_allgather    2 log2(q) + 2[r>0]    2(q-1)/q n + 2[r>0]n  (q-1)/q n + [r>0]n
MPICH tree (pipelined binomial)   as tree
================================  ====================  ====================  ==================

Broadcast: binomial (tree, butterfly, MPICH binomial) ``a = ceil(log2 p)``, ``b = a n``;
star (root sends to each) ``a = p-1``, ``b = (p-1) n``; ring (pipelined chain, segments
of ``s`` bytes) ``a = p-2+ceil(n/s)``, ``b = a s``; MPICH scatter_ring_allgather
``a = log2 p + p-1``, ``b = 2(p-1)/p n``.  The non-power-of-two fold (MPICH's, also the
butterfly's) costs the extra ranks' send-in and send-out: the ``[r>0]`` terms.

``native`` (MPICH's own choice) is predicted as the cheapest of MPICH's algorithms.  The
four parameters are fitted by non-negative least squares on relative error over every
measured (op, exchange, p, n), and the fit's relative error is reported per size and
rank count.  Where two exchanges' costs are straight lines in n, their crossover size
is where the lines meet.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

RING_SEGMENT = 256 * 1024          # topologies.ring's pipelined bcast segment


@dataclass
class Params:
    alpha: float     # s per message
    beta: float      # s per byte moved
    gamma: float     # s per byte reduced
    delta: float     # extra s per message for a Python topology
    rendezvous: float = 0.0     # extra s per message larger than eager_bytes (handshake)
    eager_bytes: float = math.inf   # MPICH's eager/rendezvous switch, as fitted

    def as_dict(self) -> dict:
        return asdict(self)


def _fold(p: int) -> tuple[int, int]:
    q = 1 << (p.bit_length() - 1)
    return q, p - q


def coefficients(op: str, exchange: str, p: int, n: float) -> tuple[float, float, float, bool]:
    """``(a, b, c, python)`` of the table above; ``python`` says whether delta applies."""
    if p == 1:
        return 0.0, 0.0, 0.0, False
    python = not exchange.startswith("native")
    name = exchange.split(":", 1)[1] if ":" in exchange else exchange
    q, r = _fold(p)
    lq, extra, clog = math.log2(q), float(r > 0), math.ceil(math.log2(p))
    if op == "allreduce":
        if name in ("butterfly", "recursive_doubling"):
            return lq + 2 * extra, (lq + 2 * extra) * n, (lq + extra) * n, python
        if name == "ring":
            return 2 * (p - 1), 2 * (p - 1) / p * n, (p - 1) / p * n, python
        if name == "tree":
            return 2 * clog, 2 * clog * n, clog * n, python
        if name == "star":
            return 2 * (p - 1), 2 * (p - 1) * n, (p - 1) * n, python
        if name == "reduce_scatter_allgather":
            return (2 * lq + 2 * extra, 2 * (q - 1) / q * n + 2 * extra * n,
                    (q - 1) / q * n + extra * n, python)
    elif op == "bcast":
        if name in ("tree", "butterfly", "binomial"):
            return clog, clog * n, 0.0, python
        if name == "star":
            return p - 1, (p - 1) * n, 0.0, python
        if name == "ring":
            a = p - 2 + max(1, math.ceil(n / RING_SEGMENT))
            return a, a * min(n, RING_SEGMENT), 0.0, python
        if name == "scatter_ring_allgather":
            return math.log2(q) + p - 1, 2 * (p - 1) / p * n, 0.0, python
    raise KeyError(f"no cost model for {op} {exchange}")


MPICH_ALGORITHMS = {"allreduce": ("recursive_doubling", "ring", "reduce_scatter_allgather"),
                    "bcast": ("binomial", "scatter_ring_allgather")}


def predict(params: Params, op: str, exchange: str, p: int, n: float) -> float:
    """Seconds for one ``op`` of ``n`` bytes over ``p`` ranks."""
    if exchange == "native":
        return min(predict(params, op, f"native:{a}", p, n) for a in MPICH_ALGORITHMS[op])
    a, b, c, python = coefficients(op, exchange, p, n)
    large = a if a and b / a > params.eager_bytes else 0.0
    return a * (params.alpha + (params.delta if python else 0.0)) + b * params.beta \
        + c * params.gamma + large * params.rendezvous


def _row(op: str, exchange: str, p: int, n: float, eager: float) -> list[float] | None:
    try:
        a, b, c, python = coefficients(op, exchange, p, n)
    except KeyError:
        return None
    return [a, b, c, a if python else 0.0, a if a and b / a > eager else 0.0]


#: candidate eager limits tried by the fit (bytes per message)
EAGER_CANDIDATES = [math.inf] + [float(1 << k) for k in range(12, 19)]


def fit(table) -> tuple[Params, "np.ndarray"]:
    """Fit on a ``analysis.load_bench`` table; returns the parameters and a boolean mask
    of the rows used (those with a model, more than one rank, and a measurement).  The
    eager limit is chosen among :data:`EAGER_CANDIDATES` by the smallest residual."""
    best = None
    for eager in EAGER_CANDIDATES:
        rows, times, used = [], [], np.zeros(len(table), dtype=bool)
        for i, rec in enumerate(table.itertuples()):
            if rec.ranks < 2 or rec.topology == "native" or not rec.avg_s > 0:
                continue
            row = _row(rec.op, rec.topology, rec.ranks, float(rec.bytes), eager)
            if row is None:
                continue
            rows.append(row)
            times.append(rec.avg_s)
            used[i] = True
        if not rows:
            raise ValueError("no benchmark rows with a cost model (need 2+ ranks)")
        A, t = np.asarray(rows), np.asarray(times)
        weighted = A / t[:, None]         # relative error: minimise sum((A x - t) / t)^2
        x = _nnls(weighted, np.ones(len(t)))
        residual = float(np.sum((weighted @ x - 1.0) ** 2))
        if best is None or residual < best[0] - 1e-12:
            best = (residual, Params(*x.tolist(), eager_bytes=eager), used)
    return best[1], best[2]


def _nnls(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a handful of unknowns: the best feasible solution
    over all subsets of free variables (the others held at zero)."""
    best, best_res = np.zeros(A.shape[1]), float(np.sum(y ** 2))
    scale = np.linalg.norm(A, axis=0)
    scale[scale == 0] = 1.0
    As = A / scale
    for k in range(1, A.shape[1] + 1):
        for subset in itertools.combinations(range(A.shape[1]), k):
            cols = list(subset)
            x_sub, *_ = np.linalg.lstsq(As[:, cols], y, rcond=None)
            if np.any(x_sub < 0):
                continue
            x = np.zeros(A.shape[1])
            x[cols] = x_sub
            res = float(np.sum((As @ x - y) ** 2))
            if res < best_res:
                best, best_res = x, res
    return best / scale


def errors(params: Params, table) -> "object":
    """The table with ``predicted_s`` and ``rel_error`` (predicted / measured - 1)."""
    out = table.copy()
    out["predicted_s"] = [predict(params, r.op, r.topology, r.ranks, float(r.bytes))
                          if _row(r.op, r.topology, r.ranks, 1.0, math.inf) is not None
                          or r.topology == "native" else math.nan
                          for r in table.itertuples()]
    out["rel_error"] = out["predicted_s"] / out["avg_s"] - 1.0
    return out


def crossover(params: Params, op: str, x: str, y: str, p: int) -> float | None:
    """Bytes above which ``y`` is cheaper than ``x`` (or below, if it starts cheaper);
    None when the two never cross (costs are a + b n in n, except the ring bcast)."""
    f = [predict(params, op, e, p, 0.0) for e in (x, y)]
    g = [predict(params, op, e, p, 1 << 20) - v for e, v in zip((x, y), f, strict=True)]
    if g[0] == g[1]:
        return None
    n = (f[1] - f[0]) / (g[0] - g[1]) * (1 << 20)
    return n if n > 0 else None


def main(argv: list[str] | None = None) -> int:
    from analysis.load import load_bench

    parser = argparse.ArgumentParser(prog="python -m mpirl.costmodel", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="mpirl.bench --out files or directories")
    parser.add_argument("-o", "--out", help="directory for params.json, errors.csv, figure")
    args = parser.parse_args(argv)
    table = load_bench(*args.paths)
    if table.empty:
        print("mpirl.costmodel: error: no benchmark file (python -m mpirl.bench --out F.h5)",
              file=sys.stderr)
        return 2
    # The machine's parameters come from runs with no more ranks than cores; a rank
    # count that oversubscribes the cores gets its own fit (time-sharing is not in the
    # model) and is reported beside it.
    honest = table[~table["oversubscribed"]]
    base = honest if len(honest) else table
    params, _ = fit(base)
    print(f"fitted on {len(base)} measurements "
          f"({', '.join(sorted(map(str, base['ranks'].unique())))} ranks"
          f"{'' if len(honest) else ', all oversubscribed'}):")
    print("  " + describe(params))
    by_ranks = {}
    for ranks, part in table.groupby("ranks"):
        by_ranks[int(ranks)], _ = fit(part)
        flag = " (oversubscribed)" if part["oversubscribed"].any() else ""
        print(f"  {ranks} ranks alone{flag}: " + describe(by_ranks[int(ranks)]))
    err = pd.concat([errors(by_ranks[int(r)], part) for r, part in table.groupby("ranks")])
    used = err["predicted_s"].notna() & (err["topology"] != "native")
    print("\n(errors below: each rank count with its own fit)")
    fitted = err[used]
    print("\nrelative error |predicted/measured - 1|, median over exchanges:")
    pivot = fitted.assign(abs_err=fitted["rel_error"].abs()).pivot_table(
        index="bytes", columns="ranks", values="abs_err", aggfunc="median")
    print((pivot * 100).round(1).to_string(float_format=lambda v: f"{v:.1f}%"))
    print(f"overall median {100 * fitted['rel_error'].abs().median():.1f}%, "
          f"p90 {100 * fitted['rel_error'].abs().quantile(0.9):.1f}%")
    print("\npredicted allreduce crossovers (machine fit): which is cheaper, and up to "
          "which size")
    for p in (2, 3, 4, 8, 64, 1024, 4096):
        cells = []
        for x, y in (("butterfly", "ring"), ("tree", "ring"), ("star", "tree"),
                     ("butterfly", "native")):
            cells.append(describe_crossover(params, "allreduce", x, y, p))
        print(f"  p={p:<5} " + "; ".join(cells))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "params.json").write_text(json.dumps(params.as_dict(), indent=2))
        (out / "params_by_ranks.json").write_text(json.dumps(
            {r: p.as_dict() for r, p in by_ranks.items()}, indent=2))
        err.to_csv(out / "errors.csv", index=False)
        print(f"\nwrote {out / 'params.json'}, {out / 'errors.csv'}")
    return 0


def describe_crossover(params: Params, op: str, x: str, y: str, p: int) -> str:
    """'x < y below N KiB' (then y wins), or which one is cheaper at every size."""
    n = crossover(params, op, x, y, p)
    if all(math.isclose(predict(params, op, x, p, v), predict(params, op, y, p, v),
                        rel_tol=1e-9) for v in (4.0, float(1 << 24))):
        return f"{x} = {y}"
    small_x = predict(params, op, x, p, 4.0) <= predict(params, op, y, p, 4.0)
    first, second = (x, y) if small_x else (y, x)
    if n is None:
        return f"{first} cheaper at every size"
    return f"{first} < {second} below {n / 1024:.0f} KiB"


def describe(params: Params) -> str:
    bandwidth = 1 / params.beta / 2**30 if params.beta else math.inf
    eager = "none" if math.isinf(params.eager_bytes) else f"{params.eager_bytes / 1024:.0f} KiB"
    return (f"alpha {params.alpha * 1e6:.2f} us/msg, beta {params.beta * 1e9:.3f} ns/B "
            f"({bandwidth:.2f} GiB/s), gamma {params.gamma * 1e9:.3f} ns/B, delta "
            f"{params.delta * 1e6:.2f} us/msg (Python), rendezvous "
            f"{params.rendezvous * 1e6:.2f} us/msg above {eager}")


def load_params(path: str | Path) -> Params:
    return Params(**json.loads(Path(path).read_text()))


if __name__ == "__main__":
    sys.exit(main())
