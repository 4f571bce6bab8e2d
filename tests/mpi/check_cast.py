"""Checks the compression wrappers (topologies.cast); run under mpiexec by the tests.

Usage: mpiexec -n N python tests/mpi/check_cast.py     (N >= 2)

Rank 0 prints ``OK CASE`` or ``FAIL CASE: why`` per case; exit status 1 on any failure.
"""

from __future__ import annotations

import sys

from cases import cases, comm, rank, report, size  # first: it starts MPI

import numpy as np
from mpi4py import MPI

import topologies


def sent(spec: str, n: int) -> int:
    topo = topologies.get(spec)(comm)
    topo.allreduce(np.ones(n, np.float32), average=True)
    return topo.stats.bytes_sent


def check_bytes_halved() -> None:
    problems = []
    for wrapper in ("fp16", "bf16"):
        for inner in ("ring", "butterfly", "tree", "rabenseifner"):
            full, half = sent(inner, 10_000), sent(f"{wrapper}:{inner}", 10_000)
            if 2 * half != full:
                problems.append(f"rank {rank}: {wrapper}:{inner} sent {half} B, {inner} {full} B")
    report("every message carries half the bytes", problems)


def check_divide_before_cast() -> None:
    """40000 on every rank: the sum overflows float16 (65504) unless divided first."""
    problems = []
    buf = np.full(100, 40000.0, np.float32)
    topologies.get("fp16:ring")(comm).allreduce(buf, average=True)
    if not np.all(buf == 40000.0):
        problems.append(f"rank {rank}: average of 40000s is {buf[0]}")
    report("fp16 divides before the cast: an average of 40000s does not overflow", problems)


def check_refusals_and_exact_bcast() -> None:
    problems = []
    topo = topologies.get("bf16:butterfly")(comm)
    try:
        topo.allreduce(np.ones(4, np.float16))
        problems.append(f"rank {rank}: a float16 buffer was taken")
    except topologies.TopologyError as err:
        if "compresses float32 or float64 buffers" not in str(err):
            problems.append(f"rank {rank}: {err}")
    params = np.full(10, 1 / 3 if rank == 0 else 0.0, np.float32)
    topo.bcast(params, root=0)
    if params.tobytes() != np.full(10, 1 / 3, np.float32).tobytes():
        problems.append(f"rank {rank}: bcast did not deliver the float32 bits exactly")
    report("a half buffer is refused and bcast sends parameters exactly", problems)


def check_rounding_and_identity() -> None:
    problems = []
    x = np.random.default_rng([11, rank]).standard_normal(5000).astype(np.float32)
    exact = x.astype(np.float64)
    comm.Allreduce(MPI.IN_PLACE, exact, op=MPI.SUM)
    exact /= size
    for wrapper, bits in (("fp16", 10), ("bf16", 7)):
        y = x.copy()
        topologies.get(f"{wrapper}:butterfly")(comm).allreduce(y, average=True)
        if len(set(comm.allgather(y.tobytes()))) != 1:
            problems.append(f"{wrapper}: ranks differ")
        err = np.max(np.abs(y - exact))
        # a half's rounding is 2**-(bits+1) relative; the sum's error grows with the ranks
        if not 0 < err <= size * 2.0 ** -bits * np.max(np.abs(exact)) * 4:
            problems.append(f"{wrapper}: max error {err:.3g}")
        if wrapper == "fp16":
            err16 = err
        elif not err > err16:
            problems.append(f"bf16's error {err:.3g} is not above fp16's {err16:.3g}")
    report("replicas identical; bf16 rounds more coarsely than fp16", problems)


def main() -> None:
    if size < 2:
        sys.exit("check_cast needs at least 2 ranks")
    check_bytes_halved()
    check_divide_before_cast()
    check_refusals_and_exact_bcast()
    check_rounding_and_identity()
    sys.exit(1 if cases.failed else 0)


if __name__ == "__main__":
    main()
