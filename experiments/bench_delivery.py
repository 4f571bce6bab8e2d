"""Parameter delivery measured: the per-actor push against one broadcast through a
topology (``--param-delivery broadcast``), learner + 7 actors on the emulated cluster.

    python experiments/bench_delivery.py          # ~5 min on 2 cores, as root

On its own emulated cluster (``mpirldeliv``, 8 nodes x 1 rank, taken down at the end,
also on error) rank 0 is the learner and ranks 1-7 its actors.  Per trial the learner
delivers ``--mib`` MiB of float32 parameters to every actor, one way at a time:

* ``push``: impala's default: one ``Isend`` of the whole copy per actor, as
  :class:`topologies.channels.ChannelServer` answers each actor's unroll (all at once:
  the push's best case, a burst);
* ``ring`` / ``tree`` / ``native`` / ``star``: :class:`mpirl.kit.delivery.Publisher`'s
  doorbells, then the topology's ``bcast`` (ring: a pipelined chain in 256 KiB
  segments; tree: binomial; native: ``MPI_Bcast``; star: p - 1 sends from the root),
  each actor's :class:`~mpirl.kit.delivery.Subscriber` joining on its own thread.

Delivery time: from the learner's start to the moment the last actor holds the copy
(every node is a namespace of this one machine: one clock).  The ways take turns trial
by trial (ABCDE ABCDE: the same conditions for all), ``--trials`` each; the table gives
medians, and each way's time over the push's.  Also the learner's link bytes per
delivery.  Writes ``results.md`` and ``results.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NAME = "mpirldeliv"
SUBNET = "10.231.95.0/24"
NODES = 8
RATES = ["100mbit", "1gbit"]
WAYS = ["push", "ring", "tree", "native", "star"]
TAG_PUSH = 62


def deliver(comm, way: str, end, params, held) -> tuple[float, int]:
    """One delivery by ``way``: when this rank holds the copy (the learner: when it
    started), and the bytes the learner's link sent (0 on an actor)."""
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    start = time.time()
    if way == "push":
        if rank == 0:
            MPI.Request.Waitall([comm.Isend(params, a, TAG_PUSH) for a in range(1, size)])
            return start, (size - 1) * params.nbytes
        comm.Recv(held, 0, TAG_PUSH)
        return time.time(), 0
    if rank == 0:
        before = end.topology.stats.bytes_sent
        end.offer(params, 1)
        while end.in_flight:
            time.sleep(2e-3)
        return start, end.topology.stats.bytes_sent - before
    while end.received < 1:           # when it landed: the thread's clock, not this loop's
        time.sleep(2e-3)
    end.take(held)
    return end.last_times[1], 0


def worker(trials: int, mib: float) -> None:
    """One rank's part (under mpiexec): rank 0 prints one JSON line."""
    from mpirl.launch import apply_mpi_defaults

    apply_mpi_defaults()
    import numpy as np
    from mpi4py import MPI

    from mpirl.kit.delivery import Publisher, Subscriber

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    n = int(mib * 2 ** 20) // 4
    params = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    held = np.zeros(n, np.float32)
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    sent: dict[str, list[int]] = {way: [] for way in WAYS}
    for trial in range(trials + 1):                     # trial 0: a warm-up, not kept
        for way in WAYS:
            # one way's threads at a time (made and ended outside the timed part): on a
            # machine with fewer cores than ranks, idle threads of the others would compete
            end = None if way == "push" else (Publisher if rank == 0 else Subscriber)(
                comm, way, n)
            comm.Barrier()
            start = time.time()
            done, link = deliver(comm, way, end, params, held)
            if rank != 0 and held.tobytes() != params.tobytes():
                raise SystemExit(f"rank {rank}: {way} delivered other bytes")
            held[:] = 0.0
            latest = comm.reduce(done, op=MPI.MAX, root=0)
            if end is not None:
                end.close(timeout_s=120)
            if rank == 0 and trial > 0:
                times[way].append(latest - start)
                sent[way].append(link)
    if rank == 0:
        print(json.dumps({"n": n, "ranks": comm.Get_size(),
                          "median_s": {w: float(np.median(t)) for w, t in times.items()},
                          "learner_bytes": {w: int(np.median(b)) for w, b in sent.items()}}),
              flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/figures/delivery")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--mib", type=float, nargs="+", default=[1.0, 4.0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rewrite", action="store_true",
                        help="rewrite results.md from --out's results.json, running nothing")
    args = parser.parse_args()
    if args.rewrite:
        out = (ROOT / args.out).resolve()
        write(out, json.loads((out / "results.json").read_text()), args)
        return 0
    if args.worker:
        worker(args.trials, args.mib[0])
        return 0
    from mpirl.cluster import lifecycle, net
    from mpirl.cluster.launch import json_job

    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    with lifecycle.owned(NAME, NODES, SUBNET) as spec:
        for rate in RATES:
            net.set_rate(spec, rate)
            for mib in args.mib:
                key = f"{rate}, {mib:g} MiB"
                results[key] = json_job(spec, NODES, 1, [
                    "python", str(Path(__file__).resolve()), "--worker", "--trials",
                    str(args.trials), "--mib", str(mib)], f"bench_delivery: the {key} job",
                    timeout_s=1200)
                print(key, results[key]["median_s"], flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    write(out, results, args)
    return 0


def predicted(rate: str, nbytes: int, p: int) -> dict[str, float]:
    """Seconds of each way's slowest path at ``rate`` (bandwidth terms only)."""
    per_s = float(rate.removesuffix("mbit").removesuffix("gbit")) * (
        1e9 if rate.endswith("gbit") else 1e6) / 8
    segment = min(nbytes, 256 * 1024)
    lg = (p - 1).bit_length()
    return {"push": (p - 1) * nbytes / per_s, "star": (p - 1) * nbytes / per_s,
            "ring": (nbytes + (p - 2) * segment) / per_s, "tree": lg * nbytes / per_s}


def write(out: Path, results: dict, args) -> None:
    lines = ["# Parameter delivery: per-actor push against one broadcast "
             "(experiments/bench_delivery.py)", "",
             f"Emulated cluster, {NODES} nodes x 1 rank: the learner (rank 0) and 7 actors. "
             "Time from the learner's start until the last actor holds the parameters, "
             f"median of {args.trials} trials per way (the ways take turns); in brackets, "
             "over the push's. Learner link: MiB the learner sent per delivery.", "",
             "| link, size | " + " | ".join(WAYS) + " |",
             "|---|" + "---|" * len(WAYS)]
    for key, r in results.items():
        push = r["median_s"]["push"]
        cells = [f"{r['median_s'][w] * 1e3:.0f} ms ({r['median_s'][w] / push:.2f})"
                 for w in WAYS]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
        model = predicted(key.split(",")[0], r["n"] * 4, r["ranks"])
        lines.append("| model | " + " | ".join(
            f"{model[w] * 1e3:.0f} ms" if w in model else "" for w in WAYS) + " |")
    first = next(iter(results.values()))
    lines += ["", "Model: the bytes on the slowest path over the link's rate (push and star: "
              "p - 1 copies out of the learner's link; ring: n, then one 256 KiB segment "
              "per further hop; tree: ceil(lg p) copies from the learner); no latency "
              "terms.", "", "Learner link per delivery, MiB (" + ", ".join(
        f"{w} {first['learner_bytes'][w] / 2 ** 20:.2f}" for w in WAYS)
        + f"), at {first['n'] * 4 / 2 ** 20:g} MiB of parameters; native's is one "
        "logical message (what MPI_Bcast sends is the library's own)."]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
