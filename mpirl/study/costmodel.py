"""The alpha-beta-gamma cost model of every exchange, fitted to ``mpirl.bench`` results.

    python -m mpirl.costmodel runs/bench -o figures/costmodel     # fit, errors, crossovers

A collective on ``p`` ranks and ``n`` bytes costs (Hockney; Thakur, Rabenseifner and
Gropp 2005)::

    T = a * alpha + b * beta + c * gamma   (+ a * delta for mpirl's Python topologies)

with ``a`` the messages on the critical path, ``b`` the bytes each rank on it moves,
``c`` the bytes it reduces; ``alpha`` is the latency of one message, ``beta`` seconds per
byte moved, ``gamma`` seconds per byte reduced, and ``delta`` the extra per-message cost of
a call made from Python (mpi4py call, numpy add, bookkeeping).

The terms ``(a, b, c)`` are each topology's own: ``cost(op, p, n)``, written beside its
algorithm in ``topologies/<name>.py`` (MPICH's forced algorithms:
``topologies.native.MPICH_ALGORITHMS``).

A link capped by a token bucket (rate ``1 / beta``, depth ``burst_bytes``: the emulated
cluster's ``tc tbf``, a cloud NIC's burst allowance) is not a plain wire: a message may
leave faster than the rate while the bucket holds tokens.  The bytes the rate must
carry are then :func:`link_bytes`: each of the exchange's ``link_phases`` (its busiest
link used in separate phases, e.g. the star's root receiving, then sending) starts on a
link direction that was idle, its first ``burst_bytes`` free; and across back-to-back
calls a link direction cannot beat its rate on average, less the ``refill_bytes`` it
regains between calls (fitted; a training exchange after its compute finds the bucket
full: ``refill_bytes = burst_bytes``).  With ``burst_bytes = 0`` it is ``b``.

This module walks the registry, so a new topology is modelled as soon as it is
registered.  ``native`` (MPICH's own choice) is predicted as the cheapest of MPICH's
algorithms.  The four parameters (and an eager limit with a rendezvous cost per large
message; a bucket's refill) are fitted by non-negative least squares on relative error
over every measured (op, exchange, p, n), and the fit's relative error is reported per
size and rank count.  Where two exchanges' costs are straight lines in n, their
crossover size is where the lines meet.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

#: the prediction's math lives beside the cost terms; imported here for the fit and its
#: callers (``load_params`` among them)
from topologies.model import (Params, Terms, link_bytes, load_params,  # noqa: F401
                             mpi_seconds, seconds, terms)


def coefficients(op: str, exchange: str, p: int, n: float) -> Terms:
    """The :class:`Terms` of ``exchange`` (a topology spec, or ``native:ALGORITHM``).
    KeyError when there is no model of it."""
    import topologies
    from topologies.native import Native

    name, _, algorithm = exchange.partition(":")
    if name == "native" and algorithm:
        return terms(op, Native, p, n, algorithm)
    try:
        cls = topologies.get(exchange)
    except topologies.TopologyError:
        raise KeyError(f"no cost model for {op} {exchange}") from None
    return terms(op, cls, p, n)


def mpich_algorithms(op: str) -> tuple[str, ...]:
    """The MPICH algorithms with a cost model, for ``op``."""
    from topologies.native import MPICH_ALGORITHMS

    return tuple(MPICH_ALGORITHMS[op])


def predict(params: Params, op: str, exchange: str, p: int, n: float) -> float:
    """Seconds for one ``op`` of ``n`` bytes over ``p`` ranks (``native``: the cheapest
    of MPICH's algorithms)."""
    if exchange == "native":
        return mpi_seconds(params, op, p, n)
    return seconds(params, coefficients(op, exchange, p, n))


def has_levels(exchange: str, op: str = "allreduce") -> bool:
    """Whether ``exchange`` has a two-level model of ``op`` (:func:`predict_levels`)."""
    import topologies

    try:
        topologies.get(exchange).levels(op, 2, 2, 1.0)
    except (KeyError, topologies.TopologyError):
        return False
    return True


def predict_levels(node: Params, link: Params, op: str, exchange: str, nodes: int,
                   per_node: int, n: float) -> float:
    """Seconds for ``exchange`` over ``nodes`` nodes of ``per_node`` consecutive ranks,
    each of its two levels (the topology's ``levels``) priced with its own fit: the rounds
    inside a node with ``node`` (alpha and beta of shared memory: the fit of one node of
    as many ranks) and those over the links with ``link`` (the fit of one rank per node at
    the same node count and cap).  ``hierarchical`` is a node level of MPI's own reduce
    and broadcast (no delta) and its inner topology over the leaders; a flat exchange
    (tree, butterfly, ring, rabenseifner) is its own rounds, split by where their partners
    are.  KeyError for an exchange without a two-level model."""
    import topologies

    try:
        cls = topologies.get(exchange)
    except topologies.TopologyError:
        raise KeyError(f"no cost model for {op} {exchange}") from None
    inside, across = cls.levels(op, nodes, per_node, n)
    python = cls.levels_from_python(nodes)
    as_terms = [Terms(c.messages, c.bytes_moved, c.bytes_reduced, py, c.link_phases)
                for c, py in zip((inside, across), python, strict=True)]
    return seconds(node, as_terms[0]) + seconds(link, as_terms[1])


def _row(op: str, exchange: str, p: int, n: float, eager: float, burst: float = 0.0,
         refill: float = 0.0) -> list[float] | None:
    try:
        a, b, c, python, phases = coefficients(op, exchange, p, n)
    except KeyError:
        return None
    return [a, link_bytes(b, phases, burst, refill), c, a if python else 0.0,
            a if a and b / a > eager else 0.0]


#: candidate eager limits tried by the fit (bytes per message)
EAGER_CANDIDATES = [math.inf] + [float(1 << k) for k in range(12, 19)]
#: candidate refills tried by the fit, as fractions of the bucket
REFILL_CANDIDATES = [i / 8 for i in range(9)]


def fit(table, beta: float | None = None,
        burst: float = 0.0) -> tuple[Params, "np.ndarray"]:
    """Fit on a ``analysis.load_bench`` table; returns the parameters and a boolean mask
    of the rows used (those with a model, more than one rank, and a measurement).  The
    eager limit is chosen among :data:`EAGER_CANDIDATES` by the smallest residual.

    ``beta`` given (seconds per byte, e.g. from a link's rate: 8 / bits per second), it is
    held there and only the other parameters are fitted (a network whose bandwidth is
    known, with alpha, gamma and delta from what the CPU does).  ``burst`` given (the
    links' token bucket, bytes), the refill between calls is chosen among
    :data:`REFILL_CANDIDATES` of it the same way."""
    best = None
    refills = [burst * f for f in REFILL_CANDIDATES] if burst > 0 else [0.0]
    for eager, refill in itertools.product(EAGER_CANDIDATES, refills):
        rows, times, used = [], [], np.zeros(len(table), dtype=bool)
        for i, rec in enumerate(table.itertuples()):
            if rec.ranks < 2 or rec.topology == "native" or not rec.avg_s > 0:
                continue
            row = _row(rec.op, rec.topology, rec.ranks, float(rec.bytes), eager, burst,
                       refill)
            if row is None:
                continue
            rows.append(row)
            times.append(rec.avg_s)
            used[i] = True
        if not rows:
            raise ValueError("no benchmark rows with a cost model (need 2+ ranks)")
        x = _fit_rows(np.asarray(rows), np.asarray(times), beta)
        residual = float(np.sum((np.asarray(rows) @ x / np.asarray(times) - 1.0) ** 2))
        if best is None or residual < best[0] - 1e-12:
            best = (residual, Params(*x.tolist(), eager_bytes=eager, burst_bytes=burst,
                                     refill_bytes=refill), used)
    return best[1], best[2]


def _fit_rows(A: np.ndarray, t: np.ndarray, beta: float | None) -> np.ndarray:
    """alpha, beta, gamma, delta, rendezvous minimising the relative error of ``A x``
    against ``t`` (beta held when given)."""
    weighted = A / t[:, None]             # relative error: minimise sum((A x - t) / t)^2
    if beta is None:
        return _nnls(weighted, np.ones(len(t)))
    free = [0, 2, 3, 4]                   # the bytes' term is known: fit what is left
    x = np.zeros(A.shape[1])
    x[1] = beta
    x[free] = _nnls(weighted[:, free], 1.0 - weighted[:, 1] * beta)
    return x


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
    from ..telemetry.read import load_bench

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
        for x, y in (("butterfly", "ring"), ("rabenseifner", "ring"), ("tree", "ring"),
                     ("star", "tree"), ("butterfly", "native")):
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
    bucket = "" if not params.burst_bytes else (
        f", token bucket {params.burst_bytes / 1024:.0f} KiB refilled "
        f"{params.refill_bytes / 1024:.0f} KiB between calls")
    return (f"alpha {params.alpha * 1e6:.2f} us/msg, beta {params.beta * 1e9:.3f} ns/B "
            f"({bandwidth:.2f} GiB/s), gamma {params.gamma * 1e9:.3f} ns/B, delta "
            f"{params.delta * 1e6:.2f} us/msg (Python), rendezvous "
            f"{params.rendezvous * 1e6:.2f} us/msg above {eager}{bucket}")


if __name__ == "__main__":
    sys.exit(main())
