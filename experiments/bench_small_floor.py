"""What a replayed small allreduce is made of: the floor under the small-message path.

    mpiexec -n 2 python experiments/bench_small_floor.py     # ~1 min on 2 cores

``experiments/bench_small.py`` compares whole calls with MPICH's same algorithm (issue
target: 1.2x at 1 KiB and 2 ranks).  This script times, side by side in one run at 2
ranks and 1 KiB (256 float32), calls back to back with no barrier between them, each
piece a replay is built of, so that the gap can be read as a sum:

* one replay step: ``Prequest.Startall`` + ``Request.Waitall`` of a send and a receive
  to the peer (the persistent requests the path records);
* the same exchange as MPICH runs it inside a collective: one ``Sendrecv`` from Python
  (the nearest a Python call gets to MPICH's inner loop);
* the reduction step: ``numpy.add(a, b, out=a)`` on 128 and 256 float32;
* the per-call wrapper: ``topologies.base.check_buffer`` and a whole ``allreduce`` of
  each topology (the path's schedule lookup included), replayed in C (where built) and
  in Python, and the C replay's own call alone, against ``MPI_Allreduce`` forced to the
  same algorithm (MPICH's CVARs, as ``mpirl.bench`` forces it).

Each figure is the median of ``--rounds`` rounds of ``--iters`` calls, the ranks leaving
a barrier together before each round.  Rank 0 prints a markdown table and writes it to
``--out`` (default ``docs/figures/small/floor.md``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpirl.launch import apply_mpi_defaults  # noqa: E402

apply_mpi_defaults()
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import topologies  # noqa: E402
from topologies import persistent  # noqa: E402
from topologies.base import check_buffer  # noqa: E402

N = 256                      # 1 KiB of float32
TOPOLOGIES = ["butterfly", "ring", "tree", "rabenseifner"]


def timed(comm, call, iters: int, rounds: int) -> float:
    """Median over rounds of the mean microseconds per call."""
    for _ in range(iters // 10 + 1):        # warm-up (and the path's record and replay)
        call()
    per_round = []
    for _ in range(rounds):
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        per_round.append((time.perf_counter() - start) / iters * 1e6)
    return statistics.median(per_round)


def pieces(comm, iters: int, rounds: int) -> list[tuple[str, float]]:
    peer = 1 - comm.Get_rank()
    a, b = np.ones(N, np.float32), np.zeros(N, np.float32)
    half_a, half_b = a[: N // 2], b[: N // 2]
    requests = [comm.Send_init([a, MPI.FLOAT], peer, 7), comm.Recv_init([b, MPI.FLOAT], peer, 7)]
    statuses = [MPI.Status(), MPI.Status()]

    def replay_step():
        MPI.Prequest.Startall(requests)
        MPI.Request.Waitall(requests, statuses)

    status = MPI.Status()

    def sendrecv():
        comm.Sendrecv([a, MPI.FLOAT], peer, 8, [b, MPI.FLOAT], peer, 8, status=status)

    rows = [("one replay step: Startall + Waitall (send + receive of 1 KiB)",
             timed(comm, replay_step, iters, rounds)),
            ("one Sendrecv of 1 KiB from Python", timed(comm, sendrecv, iters, rounds)),
            ("numpy.add, 128 float32 (ring's chunk at 2 ranks)",
             timed(comm, lambda: np.add(half_a, half_b, out=half_a), iters, rounds)),
            ("numpy.add, 256 float32", timed(comm, lambda: np.add(a, b, out=a), iters, rounds)),
            ("check_buffer (the call's argument check)",
             timed(comm, lambda: check_buffer(a), iters, rounds))]
    for request in requests:
        request.Free()
    return rows


def allreduces(comm, iters: int, rounds: int) -> list[tuple[str, float]]:
    from mpirl.study.bench import SAME_ALGORITHM
    from mpirl.study.mpich import MpichTuning

    tuning = MpichTuning()
    rows = []
    modes = ["c", "python"] if persistent.NATIVE is not None else ["python"]
    for name in TOPOLOGIES:
        for mode in modes:
            buf = np.ones(N, np.float32)
            topo = topologies.get(name)(comm).small_path(mode)
            rows.append((f"{name}.allreduce (replayed in {'C' if mode == 'c' else 'Python'})",
                         timed(comm, lambda t=topo, b=buf: t.allreduce(b), iters, rounds)))
            if mode == "c":            # its schedule's C call alone, without the wrapper
                schedule = next(iter(topo._schedules.kept.values()))
                rows.append((f"{name}: its schedule's C replay call alone",
                             timed(comm, lambda s=schedule: s.replay(*s.native), iters,
                                   rounds)))
        algorithm = SAME_ALGORITHM["allreduce"][name]
        with tuning.forced("allreduce", algorithm):
            ref = np.ones(N, np.float32)
            rows.append((f"MPI_Allreduce forced to {algorithm}",
                         timed(comm, lambda r=ref: comm.Allreduce(MPI.IN_PLACE, r),
                               iters, rounds)))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="docs/figures/small/floor.md")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        if comm.Get_rank() == 0:
            print(f"bench_small_floor: run at 2 ranks (mpiexec -n 2), not {comm.Get_size()}",
                  file=sys.stderr)
        return 2
    rows = pieces(comm, args.iters, args.rounds) + allreduces(comm, args.iters, args.rounds)
    if comm.Get_rank() == 0:
        lines = ["# The floor under a small allreduce (experiments/bench_small_floor.py)",
                 "", f"2 ranks, 1 KiB (256 float32); rank 0's median over {args.rounds} rounds "
                 f"of {args.iters:,} calls back to back, side by side in one run.", "",
                 "| piece | microseconds per call |", "|---|---|"]
        lines += [f"| {label} | {us:.2f} |" for label, us in rows]
        text = "\n".join(lines) + "\n"
        out = ROOT / args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
