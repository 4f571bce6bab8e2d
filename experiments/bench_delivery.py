"""Parameter delivery measured: the per-actor push against one broadcast through a
topology (``--param-delivery broadcast``), learner + 7 actors on the emulated cluster.

    python experiments/bench_delivery.py                 # ~5 min on 2 cores, as root
    python experiments/bench_delivery.py --layout 4x2 2x4   # nodes of several ranks

On its own emulated cluster (``mpirldeliv``, 8 nodes x 1 rank by default, taken down at
the end, also on error) rank 0 is the learner and ranks 1-7 its actors.  Per trial the
learner delivers ``--mib`` MiB of float32 parameters to every actor, one way at a time:

* ``push``: impala's default: one ``Isend`` of the whole copy per actor, as
  :class:`topologies.channels.ChannelServer` answers each actor's unroll (all at once:
  the push's best case, a burst);
* ``ring`` / ``tree`` / ``native`` / ``star``: :class:`mpirl.kit.delivery.Publisher`'s
  doorbells, then the topology's ``bcast`` (ring: a pipelined chain in 256 KiB
  segments; tree: binomial; native: ``MPI_Bcast``; star: p - 1 sends from the root),
  each actor's :class:`~mpirl.kit.delivery.Subscriber` joining on its own thread;
* ``hierarchical:ring`` / ``hierarchical:tree`` (``--layout`` with several ranks per
  node only): the two-level broadcast, inside the learner's node over shared memory,
  among the node leaders by the inner topology, then inside each node.

``--layout NODESxPER`` places the 8 ranks on NODES nodes of PER ranks, in blocks (ranks
0..PER-1 on the first node, as ``mpirl.cluster.launch`` places them): the learner shares
its node with PER - 1 actors.  Each layout has its own cluster and its own table
(``results.md`` for 8x1, ``results-NxP.md`` for the others).

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
RANKS = 8
RATES = ["100mbit", "1gbit"]
WAYS = ["push", "ring", "tree", "native", "star"]
#: the two-level broadcasts, measured where a node holds several ranks
TWO_LEVEL = ["hierarchical:ring", "hierarchical:tree"]
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


def layout(text: str) -> tuple[int, int]:
    """``NODESxPER`` as (nodes, ranks per node): NODES x PER = 8, NODES >= 2."""
    nodes, _, per = text.partition("x")
    if not (nodes.isdigit() and per.isdigit() and int(nodes) >= 2
            and int(nodes) * int(per) == RANKS):
        print(f"bench_delivery: --layout {text!r}: want NODESxPER with NODES x PER = "
              f"{RANKS} and NODES >= 2 (8x1, 4x2, 2x4)", file=sys.stderr)
        raise SystemExit(2)
    return int(nodes), int(per)


def ways_of(per: int) -> list[str]:
    return WAYS + (TWO_LEVEL if per > 1 else [])


def worker(trials: int, mib: float, ways: list[str]) -> None:
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
    times: dict[str, list[float]] = {way: [] for way in ways}
    sent: dict[str, list[int]] = {way: [] for way in ways}
    for trial in range(trials + 1):                     # trial 0: a warm-up, not kept
        for way in ways:
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
    parser.add_argument("--layout", nargs="+", default=["8x1"],
                        help="NODESxPER, one table each (default 8x1)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rewrite", action="store_true",
                        help="rewrite results.md from --out's results.json, running nothing")
    args = parser.parse_args()
    layouts = {text: layout(text) for text in args.layout}      # checked before anything
    out = (ROOT / args.out).resolve()
    if args.worker:
        worker(args.trials, args.mib[0], ways_of(layouts[args.layout[0]][1]))
        return 0
    if args.rewrite:
        for text, shape in layouts.items():
            write(out, json.loads((out / f"{stem(text)}.json").read_text()), args.trials,
                  text, shape)
        return 0
    from mpirl.cluster import lifecycle, net
    from mpirl.cluster.launch import json_job

    out.mkdir(parents=True, exist_ok=True)
    for text, (nodes, per) in layouts.items():
        results = {}
        with lifecycle.owned(NAME, nodes, SUBNET) as spec:
            for rate in RATES:
                net.set_rate(spec, rate)
                for mib in args.mib:
                    key = f"{rate}, {mib:g} MiB"
                    results[key] = json_job(spec, RANKS, per, [
                        "python", str(Path(__file__).resolve()), "--worker", "--trials",
                        str(args.trials), "--mib", str(mib), "--layout", text],
                        f"bench_delivery: the {text} {key} job", timeout_s=1200)
                    print(text, key, results[key]["median_s"], flush=True)
        (out / f"{stem(text)}.json").write_text(json.dumps(results, indent=1))
        write(out, results, args.trials, text, (nodes, per))
    return 0


def stem(text: str) -> str:
    """The files of a layout's table: results.md/json for 8x1, results-NxP for others."""
    return "results" if text == "8x1" else f"results-{text}"


def predicted(rate: str, nbytes: int, nodes: int, per: int) -> dict[str, float]:
    """Seconds of each way's slowest path over the links at ``rate`` (bandwidth terms
    only; shared memory inside a node taken as free).  With ranks placed in blocks a
    flat ring's chain crosses the link ``nodes - 1`` times and a flat binomial tree
    sends ``ceil(lg nodes)`` copies over the learner's link, as their two-level
    counterparts do."""
    per_s = float(rate.removesuffix("mbit").removesuffix("gbit")) * (
        1e9 if rate.endswith("gbit") else 1e6) / 8
    segment = min(nbytes, 256 * 1024)
    remote = (nodes - 1) * per                       # actors on another node than the learner
    ring = (nbytes + (nodes - 2) * segment) / per_s
    tree = (nodes - 1).bit_length() * nbytes / per_s
    return {"push": remote * nbytes / per_s, "star": remote * nbytes / per_s,
            "ring": ring, "tree": tree, "hierarchical:ring": ring, "hierarchical:tree": tree}


def write(out: Path, results: dict, trials: int, text: str, shape: tuple[int, int]) -> None:
    nodes, per = shape
    ways = ways_of(per)
    where = ("" if per == 1 else f", ranks in blocks: the learner shares its node with "
             f"{per - 1} actor{'s' if per > 2 else ''}")
    lines = ["# Parameter delivery: per-actor push against one broadcast "
             "(experiments/bench_delivery.py)", "",
             f"Emulated cluster, {nodes} nodes x {per} rank{'s' if per > 1 else ''}: the "
             f"learner (rank 0) and 7 actors{where}. "
             "Time from the learner's start until the last actor holds the parameters, "
             f"median of {trials} trials per way (the ways take turns); in brackets, "
             "over the push's. Learner link: MiB the learner sent per delivery.", "",
             "| link, size | " + " | ".join(ways) + " |",
             "|---|" + "---|" * len(ways)]
    for key, r in results.items():
        push = r["median_s"]["push"]
        cells = [f"{r['median_s'][w] * 1e3:.0f} ms ({r['median_s'][w] / push:.2f})"
                 for w in ways]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
        model = predicted(key.split(",")[0], r["n"] * 4, nodes, per)
        lines.append("| model | " + " | ".join(
            f"{model[w] * 1e3:.0f} ms" if w in model else "" for w in ways) + " |")
    first = next(iter(results.values()))
    copies = ("p - 1 copies out of the learner's link" if per == 1 else
              "one copy per actor on another node out of the learner's link")
    hops = ("per further hop" if per == 1 else
            "per further link hop (the chain crosses the link nodes - 1 times)")
    lg = "ceil(lg p)" if per == 1 else "ceil(lg nodes)"
    two = "" if per == 1 else "; the two-level ways: their inner way over the nodes"
    lines += ["", f"Model: the bytes on the slowest path over the link's rate (push and star: "
              f"{copies}; ring: n, then one 256 KiB segment {hops}; tree: {lg} copies from "
              f"the learner{two}); no latency terms"
              + ("." if per == 1 else ", shared memory taken as free."),
              "", "Learner link per delivery, MiB (" + ", ".join(
        f"{w} {first['learner_bytes'][w] / 2 ** 20:.2f}" for w in ways)
        + f"), at {first['n'] * 4 / 2 ** 20:g} MiB of parameters; native's is one "
        "logical message (what MPI_Bcast sends is the library's own)"
        + ("." if per == 1 else "; with node-mates, sends to them count too.")]
    (out / f"{stem(text)}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
