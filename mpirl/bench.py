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
import socket
import sys
import time

from .launch import apply_mpi_defaults, cpu_count

apply_mpi_defaults()
from mpi4py import MPI  # noqa: E402

import numpy as np  # noqa: E402

import topologies  # noqa: E402

from .h5log import BENCH_DTYPE, write_bench_file  # noqa: E402


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


def time_call(call, comm: MPI.Comm, iters: int, warmup: int) -> tuple[float, float, float]:
    """Mean seconds per call on each rank, reduced to (min, avg, max) over ranks."""
    for _ in range(warmup):
        call()
    elapsed = 0.0
    for _ in range(iters):
        comm.Barrier()
        t0 = MPI.Wtime()
        call()
        elapsed += MPI.Wtime() - t0
    mean = np.array([elapsed / iters])
    lo, hi, total = np.empty(1), np.empty(1), np.empty(1)
    comm.Allreduce(mean, lo, op=MPI.MIN)
    comm.Allreduce(mean, hi, op=MPI.MAX)
    comm.Allreduce(mean, total, op=MPI.SUM)
    return float(lo[0]), float(total[0] / comm.Get_size()), float(hi[0])


def human(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpirl.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", type=parse_size,
                        default=[1 << 10, 64 << 10, 1 << 20, 16 << 20],
                        help="message sizes in bytes (suffix K, M); default 1K 64K 1M 16M")
    parser.add_argument("--topologies", nargs="+", default=topologies.names(),
                        help=f"which topologies (default: all of {', '.join(topologies.names())})")
    parser.add_argument("--op", choices=("allreduce", "bcast"), default="allreduce")
    parser.add_argument("--iters", type=int, default=1000,
                        help="timed iterations for small messages (fewer for large)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="repeat the whole sweep; the best round per cell is kept")
    parser.add_argument("--out", metavar="FILE.h5",
                        help="also write the results to this HDF5 file (read by analysis.plot)")
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    args = parser.parse_args(argv)
    try:
        classes = {name: topologies.get(name) for name in args.topologies}
    except topologies.UnknownTopologyError as err:
        if rank == 0:
            print(f"mpirl.bench: error: {err}", file=sys.stderr)
        return 2
    if "native" not in classes:
        classes = {"native": topologies.get("native"), **classes}
    instances = {name: cls(comm) for name, cls in classes.items()}

    best: dict[tuple[str, int], tuple[float, float, float]] = {}
    started = time.perf_counter()
    for _ in range(args.rounds):
        for nbytes in args.sizes:
            buf = np.ones(nbytes // 4, dtype=np.float32)   # average keeps it at 1: no overflow
            iters = iterations_for(nbytes, args.iters)
            for name, topo in instances.items():
                call = functools.partial(topo.allreduce, buf, average=True) \
                    if args.op == "allreduce" else functools.partial(topo.bcast, buf, root=0)
                stats = time_call(call, comm, iters, warmup=max(1, iters // 10))
                if (name, nbytes) not in best or stats[1] < best[name, nbytes][1]:
                    best[name, nbytes] = stats
    if rank == 0:
        print(f"# mpirl.bench {args.op}: {comm.Get_size()} ranks, "
              f"{MPI.Get_library_version().splitlines()[0].strip()}, best of {args.rounds} "
              f"rounds, {time.perf_counter() - started:.1f} s")
        header = f"{'size':>10} " + " ".join(f"{n:>17}" for n in instances)
        print(header)
        for nbytes in args.sizes:
            native = best["native", nbytes][1]
            cells = [f"{best[n, nbytes][1] * 1e6:9.1f}us x{best[n, nbytes][1] / native:5.2f}"
                     for n in instances]
            print(f"{human(nbytes):>10} " + " ".join(cells))
        print("# cell: average over ranks of each rank's mean latency, and its ratio to native")
    hosts = comm.gather(socket.gethostname())
    cores = comm.gather(cpu_count())
    if rank == 0 and args.out:
        rows = np.array([(name.encode(), nbytes, iterations_for(nbytes, args.iters), *stats)
                         for (name, nbytes), stats in best.items()], dtype=BENCH_DTYPE)
        write_bench_file(args.out, rows, op=args.op, world_size=comm.Get_size(),
                         hostnames=hosts, cores=cores, rounds=args.rounds,
                         mpi_library=MPI.Get_library_version().splitlines()[0].strip())
        print(f"# results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
