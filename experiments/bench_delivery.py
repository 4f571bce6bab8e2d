"""Parameter delivery measured: the per-actor push against one broadcast through a
topology (``--param-delivery broadcast``), learner + 7 actors on the emulated cluster.

    python experiments/bench_delivery.py                 # ~5 min on 2 cores, as root
    python experiments/bench_delivery.py --layout 4x2 2x4   # nodes of several ranks
    python experiments/bench_delivery.py --layout 4x2:cyclic 2x4:cyclic

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
its node with PER - 1 actors.  ``NODESxPER:cyclic`` numbers the same processes round
robin over the nodes instead (rank r on node r mod NODES: a ``Split`` of the world with
that order), so that neighbours in rank order sit on different nodes, as a flat ring or
tree sees them under a scheduler's cyclic distribution.  Each layout has its own
cluster and its own table (``results.md`` for 8x1, ``results-NxP[-cyclic].md`` else).

Delivery time: from the learner's start to the moment the last actor holds the copy
(every node is a namespace of this one machine: one clock).  The ways take turns trial
by trial (ABCDE ABCDE: the same conditions for all), ``--trials`` each; the table gives
medians, and each way's time over the push's.  Also the learner's link bytes per
delivery.  Writes ``results.md`` and ``results.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpirl.cluster.launch import layout_or_exit, node_of, ranks_on  # noqa: E402

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


def layout(text: str) -> tuple[int, int, str]:
    """``NODESxPER[:cyclic]`` as (nodes, ranks per node, placement) for the 8 ranks; a bad
    one stops the script (one line, exit 2)."""
    return layout_or_exit(text, RANKS, "bench_delivery")


def ways_of(per: int) -> list[str]:
    return WAYS + (TWO_LEVEL if per > 1 else [])


def worker(trials: int, mib: float, shape: tuple[int, int, str]) -> None:
    """One rank's part (under mpiexec): rank 0 prints one JSON line."""
    from mpirl.launch import apply_mpi_defaults

    apply_mpi_defaults()
    import numpy as np
    from mpi4py import MPI

    from mpirl.kit.delivery import Publisher, Subscriber

    nodes, per, placement = shape
    ways, world = ways_of(per), MPI.COMM_WORLD
    # mpiexec places the world in blocks; cyclic renumbers it round robin over the nodes:
    # the i-th rank of a node takes the i-th number the cluster launcher's cyclic
    # placement gives that node (python -m mpirl.cluster exec --placement cyclic)
    w = world.Get_rank()
    comm = world if placement == "block" else \
        world.Split(0, ranks_on(w // per, nodes, per, RANKS, "cyclic")[w % per])
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
                        help="NODESxPER[:cyclic], one table each (default 8x1)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rewrite", action="store_true",
                        help="rewrite each --layout's table (results[-NxP[-cyclic]].md) "
                             "from its JSON under --out, running nothing")
    args = parser.parse_args()
    layouts = {text: layout(text) for text in args.layout}      # checked before anything
    out = (ROOT / args.out).resolve()
    if args.worker:
        worker(args.trials, args.mib[0], layouts[args.layout[0]])
        return 0
    if args.rewrite:
        for text, shape in layouts.items():
            write(out, json.loads((out / f"{stem(text)}.json").read_text()), args.trials,
                  text, shape)
        return 0
    from mpirl.cluster import lifecycle
    from mpirl.cluster.launch import json_points

    out.mkdir(parents=True, exist_ok=True)
    for text, (nodes, per, placement) in layouts.items():
        points = {f"{mib:g} MiB": ["python", str(Path(__file__).resolve()), "--worker",
                                   "--trials", str(args.trials), "--mib", str(mib),
                                   "--layout", text] for mib in args.mib}
        with lifecycle.owned(NAME, nodes, SUBNET) as spec:
            results = json_points(spec, RATES, points, RANKS, per, f"bench_delivery {text}",
                                  timeout_s=1200)
        (out / f"{stem(text)}.json").write_text(json.dumps(results, indent=1))
        write(out, results, args.trials, text, (nodes, per, placement))
    return 0


def stem(text: str) -> str:
    """The files of a layout's table: results.md/json for 8x1, results-NxP for others
    (results-NxP-cyclic for a cyclic one)."""
    return "results" if text == "8x1" else "results-" + text.replace(":", "-")


def link_hops(node: list[int]) -> int:
    """How many hops of the chain 0 -> 1 -> ... -> p - 1 cross the link."""
    return sum(a != b for a, b in itertools.pairwise(node))


def ring_copies(node: list[int]) -> int:
    """The most copies of the parameters one node's link sends in the chain: one for
    each of its ranks whose successor sits on another node (the node's ranks share it)."""
    out = collections.Counter(a for a, b in itertools.pairwise(node) if a != b)
    return max(out.values(), default=0)


def tree_copies(node: list[int]) -> int:
    """The binomial broadcast from rank 0 (topologies.tree) taken round by round, masks
    largest first (rank r, a multiple of 2 x mask, sends to r + mask): per round the most
    copies one node's link sends, summed over the rounds."""
    p, total, mask = len(node), 0, 1 << (len(node) - 1).bit_length()
    while (mask := mask >> 1) > 0:
        out = collections.Counter(node[r] for r in range(0, p - mask, 2 * mask)
                                  if node[r] != node[r + mask])
        total += max(out.values(), default=0)
    return total


def predicted(rate: str, nbytes: int, shape: tuple[int, int, str]) -> dict[str, float]:
    """Seconds of each way's slowest path over the links at ``rate`` (bandwidth terms
    only; shared memory inside a node taken as free; a node's ranks share its link): the
    push's copies to actors on other nodes; the chain's :func:`ring_copies` whole, then
    one segment per further hop over the link; the tree's :func:`tree_copies`; the
    two-level ways their inner way over the node leaders (one per node)."""
    nodes, per, placement = shape
    node, leaders = node_of(nodes, per, placement), list(range(nodes))
    per_s = float(rate.removesuffix("mbit").removesuffix("gbit")) * (
        1e9 if rate.endswith("gbit") else 1e6) / 8
    segment = min(nbytes, 256 * 1024)

    def chain(node: list[int]) -> float:
        return (ring_copies(node) * nbytes + (link_hops(node) - 1) * segment) / per_s

    push = sum(n != node[0] for n in node[1:]) * nbytes / per_s    # actors on other nodes
    return {"push": push, "star": push, "ring": chain(node),
            "tree": tree_copies(node) * nbytes / per_s,
            "hierarchical:ring": chain(leaders),
            "hierarchical:tree": tree_copies(leaders) * nbytes / per_s}


def write(out: Path, results: dict, trials: int, text: str,
          shape: tuple[int, int, str]) -> None:
    nodes, per, placement = shape
    ways = ways_of(per)
    where = ("" if per == 1 else
             f", ranks in blocks: the learner shares its node with "
             f"{per - 1} actor{'s' if per > 2 else ''}" if placement == "block" else
             f", ranks round robin over the nodes (rank r on node r mod {nodes}): the "
             f"learner shares its node with actor{'s' if per > 2 else ''} "
             + ", ".join(str(r) for r in range(nodes, RANKS, nodes)))
    lines = ["# Parameter delivery: per-actor push against one broadcast "
             "(experiments/bench_delivery.py)", "",
             f"Emulated cluster, {nodes} nodes x {per} rank{'s' if per > 1 else ''}: the "
             f"learner (rank 0) and 7 actors{where}. "
             "Time from the learner's start until the last actor holds the parameters, "
             f"median of {trials} trial{'s' if trials != 1 else ''} per way (the ways take "
             "turns); in brackets, "
             "over the push's. Learner link: MiB the learner sent per delivery.", "",
             "| link, size | " + " | ".join(ways) + " |",
             "|---|" + "---|" * len(ways)]
    for key, r in results.items():
        push = r["median_s"]["push"]
        cells = [f"{r['median_s'][w] * 1e3:.0f} ms ({r['median_s'][w] / push:.2f})"
                 for w in ways]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
        model = predicted(key.split(",")[0], r["n"] * 4, shape)
        lines.append("| model | " + " | ".join(
            f"{model[w] * 1e3:.0f} ms" if w in model else "" for w in ways) + " |")
    first, node = next(iter(results.values())), node_of(*shape)
    two = "; the two-level ways: their inner way over the node leaders" if per > 1 else ""
    lines += ["", "Model: the bytes on the slowest path over the link's rate (push and star: "
              "one copy per actor on another node out of the learner's link; ring: the most "
              f"copies of n one node's link sends ({ring_copies(node)} here: one per rank of "
              "it whose successor is on another node), then one 256 KiB segment per further "
              f"hop over the link ({link_hops(node)} of the chain's {RANKS - 1} hops here); "
              "tree: round by round, the most copies one node's link sends in that round, "
              f"summed ({tree_copies(node)} here){two}); no latency terms, shared memory "
              "taken as free.",
              "", "Learner link per delivery, MiB (" + ", ".join(
        f"{w} {first['learner_bytes'][w] / 2 ** 20:.2f}" for w in ways)
        + f"), at {first['n'] * 4 / 2 ** 20:g} MiB of parameters; native's is one "
        "logical message (what MPI_Bcast sends is the library's own); sends to the "
        "learner's node-mates count too."]
    (out / f"{stem(text)}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
