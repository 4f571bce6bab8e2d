"""``mpirun -np N python -m mpirl.bench``: latency of every topology next to MPI's own.

Method (after the OSU Micro-Benchmarks): for each message size, every topology runs a
few warm-up calls and then timed calls, each call between barriers so that ranks start
together; a rank's latency is its mean over the timed calls, reported as min / avg /
max over ranks.  Topologies take turns within each size, and the whole set is repeated
``--rounds`` times with the best round kept, so a noisy neighbour hits them all alike
and the ratios to ``native`` (printed side by side) are fair.
"""

from __future__ import annotations

import argparse
import functools
import math
import socket
import sys
import time

from ..launch import apply_mpi_defaults, cpu_count, mpi_library

apply_mpi_defaults()
from mpi4py import MPI  # noqa: E402

import numpy as np  # noqa: E402

import topologies  # noqa: E402
from topologies import persistent  # noqa: E402

from ..telemetry.h5log import write_bench_file  # noqa: E402
from ..telemetry.schema import BENCH_DTYPE  # noqa: E402
from .mpich import MpichError, MpichTuning  # noqa: E402


def parse_size(text: str) -> int:
    """'4', '64K', '16M' (bytes, powers of 1024) -> int."""
    units = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    text = text.strip().upper().rstrip("B").rstrip("I")
    scale = units.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in units else text
    try:
        value = int(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r}; use e.g. 4, 64K, 16M") from None
    if value < 4:
        raise argparse.ArgumentTypeError(f"size {text!r} is below 4 bytes (one float32)")
    return value


def iterations_for(nbytes: int, base: int) -> int:
    """Many iterations for small messages, fewer for large (OSU: 1000 below 8 KiB, else 100)."""
    return max(3, base if nbytes <= 8192 else base // 10 if nbytes <= 1 << 20 else base // 100)


def time_call(call, comm: MPI.Comm, iters: int, warmup: int) -> float:
    """This rank's mean seconds per call (warm-up calls first, a barrier before each)."""
    for _ in range(warmup):
        call()
    elapsed = 0.0
    for _ in range(iters):
        comm.Barrier()
        t0 = MPI.Wtime()
        call()
        elapsed += MPI.Wtime() - t0
    return elapsed / iters


def over_ranks(mean: float, comm: MPI.Comm) -> tuple[float, float, float]:
    """(min, avg, max) over ranks of each rank's mean; NaN anywhere makes all NaN.

    Called outside any forced-algorithm block: these small reductions must run with
    MPICH's own choices (a forced one may refuse a one-element allreduce)."""
    mine = np.array([mean])
    lo, hi, total = np.empty(1), np.empty(1), np.empty(1)
    comm.Allreduce(mine, lo, op=MPI.MIN)
    comm.Allreduce(mine, hi, op=MPI.MAX)
    comm.Allreduce(mine, total, op=MPI.SUM)
    if math.isnan(total[0]):
        return (math.nan,) * 3
    return float(lo[0]), float(total[0] / comm.Get_size()), float(hi[0])


def human(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


#: the MPICH algorithm each home-made topology implements (same data flow), per op
SAME_ALGORITHM = {
    "allreduce": {"butterfly": "recursive_doubling", "ring": "ring", "tree": "tree",
                  "rabenseifner": "reduce_scatter_allgather"},
    "bcast": {"tree": "binomial", "butterfly": "binomial", "rabenseifner": "binomial"},
}
#: MPICH algorithms measured by default (forced at run time, see mpirl.mpich)
MPICH_DEFAULT = {
    "allreduce": ["recursive_doubling", "ring", "tree", "reduce_scatter_allgather"],
    "bcast": ["binomial", "scatter_ring_allgather"],
}
DEFAULT_SIZES = [1 << k for k in range(2, 27)]      # 4 B .. 64 MiB


def variants(op: str, instances: dict, buf: np.ndarray, tuning, mpich: list[str]):
    """(label, call, context) for every home-made topology and every MPICH algorithm."""
    from contextlib import nullcontext

    out = []
    for name, topo in instances.items():
        call = functools.partial(topo.allreduce, buf, average=True) if op == "allreduce" \
            else functools.partial(topo.bcast, buf, root=0)
        out.append((name, call, nullcontext()))
    native = instances["native"]
    for algorithm in mpich:
        call = functools.partial(native.allreduce, buf, average=True) if op == "allreduce" \
            else functools.partial(native.bcast, buf, root=0)
        out.append((f"native:{algorithm}", call, tuning.forced(op, algorithm)))
    return out


def run_op(op: str, args, comm, instances: dict, tuning, mpich: list[str]) -> dict:
    """Best (min, avg, max) seconds per (label, size) over the rounds; NaN where MPICH
    refused the forced algorithm (COLLECTIVE_FALLBACK=error)."""
    best: dict[tuple[str, int], tuple[float, float, float]] = {}
    for _ in range(args.rounds):
        for nbytes in args.sizes:
            buf = np.ones(nbytes // 4, dtype=np.float32)   # average keeps it at 1: no overflow
            iters = iterations_for(nbytes, args.iters)
            for label, call, context in variants(op, instances, buf, tuning, mpich):
                try:
                    with context:
                        mean = time_call(call, comm, iters, warmup=max(1, iters // 10))
                except MPI.Exception:       # the forced algorithm cannot take these args
                    mean = math.nan
                stats = over_ranks(mean, comm)
                old = best.get((label, nbytes))
                if old is None or math.isnan(old[1]) or stats[1] < old[1]:
                    best[label, nbytes] = stats
    return best


def print_osu(op: str, best: dict, labels: list[str], args, comm) -> None:
    """One OSU-style block per variant, then the ratio summary."""
    library = mpi_library()
    for label in labels:
        print(f"# mpirl.bench {op}: {label}, {comm.Get_size()} ranks, {library}")
        print(f"# {'Size':<10} {'Avg Latency(us)':>16} {'Min Latency(us)':>16} "
              f"{'Max Latency(us)':>16} {'Iterations':>11}")
        for nbytes in args.sizes:
            lo, avg, hi = best[label, nbytes]
            print(f"{nbytes:<12} {avg * 1e6:>16.2f} {lo * 1e6:>16.2f} {hi * 1e6:>16.2f} "
                  f"{iterations_for(nbytes, args.iters):>11}")
        print()
    same = SAME_ALGORITHM[op]
    print(f"# {op} summary: average latency (us); x = ratio to native (MPICH's own choice); "
          f"= = ratio to MPICH forced to the same algorithm")
    forced = [label for label in labels if label.startswith("native:")]
    homemade = [label for label in labels if label != "native" and label not in forced]
    cols = ["native", *homemade, *forced]
    print(f"{'size':>10} " + " ".join(f"{c:>24}" for c in cols))
    for nbytes in args.sizes:
        auto = best["native", nbytes][1]
        cells = []
        for c in cols:
            value = best[c, nbytes][1]
            text = f"{value * 1e6:9.1f} x{value / auto:5.2f}"
            name = c.split("/")[0]
            ref = best.get((f"native:{same[name]}", nbytes)) if name in same else None
            text += f" ={value / ref[1]:5.2f}" if ref and not math.isnan(ref[1]) else "       "
            cells.append(f"{text:>24}")
        print(f"{human(nbytes):>10} " + " ".join(cells))
    pairs = ", ".join(f"{t}={a}" for t, a in same.items() if t in cols)
    print(f"# same algorithm: {pairs}; nan: MPICH refused the forced algorithm at that size")
    print()


def variants_asked(args):
    """The topology classes, MPICH's tuning interface (None without --mpich) and, per
    op, the MPICH algorithms to force; raises naming an unknown one."""
    classes = {name: topologies.get(name) for name in args.topologies}
    room = BENCH_DTYPE["topology"].itemsize
    for name in classes:
        if len(name.encode()) > room:
            raise ValueError(f"topology {name!r} is {len(name.encode())} bytes; allowed: "
                             f"at most {room} (the results file's label; a shorter path?)")
    tuning = MpichTuning() if args.mpich != [] else None
    mpich = {op: (MPICH_DEFAULT[op] if args.mpich is None else args.mpich)
             if tuning else [] for op in args.op}
    for op, names in mpich.items():
        bad = [a for a in names if a not in tuning.algorithms(op)]
        if bad:
            raise ValueError(f"MPICH has no {op} algorithm {', '.join(bad)}; it has: "
                             f"{', '.join(tuning.algorithms(op))}")
    return classes, tuning, mpich


def instantiate(classes: dict, comm: MPI.Comm, blocking: bool) -> dict:
    """label -> topology on ``comm``: native first, then those asked, then (``blocking``)
    each one with a small-message path again with that path replayed in Python, as
    NAME/python (where the C replay is built), and with it off, as NAME/blocking."""
    classes = {"native": topologies.get("native"), **classes}
    instances = {name: cls(comm) for name, cls in classes.items()}
    if blocking:
        modes = {"blocking": "off"}
        if persistent.NATIVE is not None:
            modes["python"] = "python"
        for name, cls in classes.items():
            if cls.persistent:
                for label, mode in modes.items():
                    instances[f"{name}/{label}"] = cls(comm).small_path(mode)
    return instances


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpirl.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", type=parse_size, default=DEFAULT_SIZES,
                        help="message sizes in bytes (suffix K, M); default 4 B to 64 MiB, "
                             "powers of two")
    parser.add_argument("--max-size", type=parse_size, default=None,
                        help="drop sizes above this (e.g. 1M)")
    parser.add_argument("--topologies", nargs="+", default=topologies.names(),
                        help=f"which topologies (default: all of {', '.join(topologies.names())})")
    parser.add_argument("--op", nargs="+", choices=("allreduce", "bcast"),
                        default=["allreduce", "bcast"])
    parser.add_argument("--mpich", nargs="*", default=None, metavar="ALGORITHM",
                        help="MPICH algorithms to force and measure beside the topologies "
                             "(default: those the topologies implement, plus "
                             "reduce_scatter_allgather / scatter_ring_allgather; give none "
                             "to skip; only with MPICH)")
    parser.add_argument("--blocking", action="store_true",
                        help="also time every topology with a small-message path with that "
                             "path replayed in Python (label NAME/python, where its C replay "
                             "is built) and off (NAME/blocking): what the replays of "
                             "topologies.persistent buy, side by side in one run")
    parser.add_argument("--iters", type=int, default=1000,
                        help="timed iterations for small messages (fewer for large)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="repeat the whole sweep; the best round per cell is kept")
    parser.add_argument("--out", metavar="FILE.h5", default="",
                        help="HDF5 file for the results (read by analysis.plot and "
                             "mpirl.costmodel); default runs/bench/bench-<N>r-<time>.h5")
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    args = parser.parse_args(argv)
    if args.max_size:
        args.sizes = [s for s in args.sizes if s <= args.max_size]
    try:
        classes, tuning, mpich = variants_asked(args)
    except (topologies.TopologyError, MpichError, ValueError) as err:
        if rank == 0:
            print(f"mpirl.bench: error: {err}", file=sys.stderr)
        return 2
    instances = instantiate(classes, comm, args.blocking)
    comm.Set_errhandler(MPI.ERRORS_RETURN)      # a refused forced algorithm raises, not aborts

    started = time.perf_counter()
    results = {}
    for op in args.op:
        results[op] = run_op(op, args, comm, instances, tuning, mpich[op])
    hosts = comm.gather(socket.gethostname())
    cores = comm.gather(cpu_count())
    if rank == 0:
        print(f"# mpirl.bench: {comm.Get_size()} ranks, best of {args.rounds} rounds, "
              f"{time.perf_counter() - started:.1f} s; latency = each rank's mean over the "
              "timed calls, min/avg/max over ranks\n")
        for op, best in results.items():
            labels = [*instances, *(f"native:{a}" for a in mpich[op])]
            print_osu(op, best, labels, args, comm)
        out = args.out or \
            f"runs/bench/bench-{comm.Get_size()}r-{time.strftime('%Y%m%d-%H%M%S')}.h5"
        if out:
            rows = np.array([(op.encode(), label.encode(), nbytes,
                              iterations_for(nbytes, args.iters), *stats)
                             for op, best in results.items()
                             for (label, nbytes), stats in best.items()], dtype=BENCH_DTYPE)
            write_bench_file(out, rows, op=",".join(args.op), world_size=comm.Get_size(),
                             hostnames=hosts, cores=cores, rounds=args.rounds,
                             mpi_library=mpi_library())
            print(f"# results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
