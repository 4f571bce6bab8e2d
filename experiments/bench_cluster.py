"""Every topology on the emulated cluster, at link caps where the network is what counts.

    python experiments/bench_cluster.py                       # ~20 min on 2 cores, as root
    python -m analysis.cluster runs/cluster_bench -o docs/figures/cluster

For each layout (2, 4 and 8 nodes x 1 rank, 4 nodes x 2 ranks) it brings up its
own cluster (``mpirlbench``, a subnet of its own, taken down at the end, also on error)
and, at each cap (100 Mbit/s, 1 Gbit/s, uncapped):

- ``python -m mpirl.bench --op allreduce`` over the nodes (every topology and MPICH's
  forced algorithms, sizes 4 KiB to 4 MiB, side by side within each size, best of 3
  rounds): ``bench-<N>n-<R>r-<cap>.h5``;
- a link probe per exchange: 4 MiB allreduces, timed, with the bytes through every
  node's link read before and after (the star's root link against the others):
  ``links.json``.

The emulated nodes share this machine's cores, so 8 ranks on 2 cores are oversubscribed:
large messages at or below 1 Gbit/s are bound by the cap, small ones by scheduling.

A layout of one node (``--layouts 1x2``) runs ``mpirl.bench`` on this machine without a
cluster (shared memory, no cap: ``bench-1n-<R>r-shm.h5``): the node level of the
two-level model that ``analysis.cluster`` draws for ``hierarchical``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NAME = "mpirlbench"
SUBNET = "10.231.99.0/24"
LAYOUTS = [(2, 1), (4, 1), (4, 2), (8, 1)]  # (nodes, ranks per node)
RATES = ["100mbit", "1gbit", "off"]
SIZES = ["4K", "64K", "256K", "1M", "4M"]
PROBE_BYTES = 4 << 20


def probe(topology: str, nbytes: int, calls: int) -> None:
    """Run under MPI: ``calls`` allreduces of ``nbytes`` with ``topology`` (one warm-up
    first), rank 0 prints the median seconds per call as JSON."""
    from mpirl.launch import apply_mpi_defaults

    apply_mpi_defaults()
    import numpy as np
    from mpi4py import MPI

    import topologies

    comm = MPI.COMM_WORLD
    topo = topologies.get(topology)(comm)
    buf = np.ones(nbytes // 4, dtype=np.float32)
    topo.allreduce(buf, average=True)
    times = []
    for _ in range(calls):
        comm.Barrier()
        t0 = MPI.Wtime()
        topo.allreduce(buf, average=True)
        times.append(MPI.Wtime() - t0)
    worst = comm.reduce(max(times), op=MPI.MAX)
    if comm.Get_rank() == 0:
        print(json.dumps({"median_s": float(np.median(times)), "max_s": worst}))


def bench_args(sizes: list[str], rounds: int, out_file: Path) -> list[str]:
    """``mpirl.bench``'s arguments, the same for every layout (after the Python)."""
    return ["-m", "mpirl.bench", "--op", "allreduce", "--sizes", *sizes, "--iters", "50",
            "--rounds", str(rounds), "--out", str(out_file)]


def one_node(ranks: int, sizes: list[str], rounds: int, out: Path, started: float) -> bool:
    """``mpirl.bench`` over ``ranks`` ranks of this machine (shared memory, no link):
    ``bench-1n-<R>r-shm.h5``, the node level of the two-level model."""
    import subprocess

    from mpirl.launch import mpi_env, mpiexec_command

    tag = f"1n-{ranks}r-shm"
    print(f"== {tag} ({time.monotonic() - started:.0f} s)", flush=True)
    cmd = mpiexec_command(ranks, [sys.executable,
                                  *bench_args(sizes, rounds, out / f"bench-{tag}.h5")])
    code = subprocess.run(cmd, cwd=ROOT, env=mpi_env({"PYTHONPATH": str(ROOT)}),
                          timeout=1800).returncode
    if code != 0:
        print(f"bench {tag} exited {code}", file=sys.stderr)
    return code == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/cluster_bench")
    parser.add_argument("--quick", action="store_true",
                        help="one layout (4 x 1), caps 1gbit only, sizes 64K 1M: a smoke run")
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=4, help="link-probe calls per exchange")
    parser.add_argument("--layouts", nargs="+", metavar="NxR",
                        default=[f"{n}x{r}" for n, r in LAYOUTS],
                        help="nodes x ranks per node (default: %(default)s); a layout "
                             "measured again replaces its files and link rows")
    parser.add_argument("--rounds", type=int, default=3,
                        help="mpirl.bench rounds (the best per cell is kept)")
    args = parser.parse_args()
    if args.probe:
        probe(args.probe, PROBE_BYTES, args.calls)
        return 0

    import topologies
    from mpirl.cluster import lifecycle, net
    from mpirl.cluster.launch import json_job, run as run_on

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        asked = [tuple(int(x) for x in text.split("x")) for text in args.layouts]
    except ValueError:
        parser.error(f"--layouts {' '.join(args.layouts)}; allowed: NODESxRANKS, e.g. 4x2")
    layouts, rates, sizes = (asked, RATES, SIZES) if not args.quick else \
        ([(4, 1)], ["1gbit"], ["64K", "1M"])
    links_path = out / "links.json"
    links = json.loads(links_path.read_text()) if links_path.exists() else []
    started = time.monotonic()
    for nodes, per_node in layouts:
        ranks = nodes * per_node
        if nodes == 1:              # one node: this machine's shared memory, no cluster
            if not one_node(per_node, sizes, args.rounds, out, started):
                return 1
            continue
        with lifecycle.owned(NAME, nodes, SUBNET) as spec:
            for rate in rates:
                net.set_rate(spec, rate)
                tag = f"{nodes}n-{ranks}r-{rate}"
                print(f"== {tag} ({time.monotonic() - started:.0f} s)", flush=True)
                bench = out / f"bench-{tag}.h5"
                code = run_on(spec, ranks, per_node,
                              ["python", *bench_args(sizes, args.rounds, bench)],
                              timeout_s=1800)
                if code != 0:
                    print(f"bench {tag} exited {code}", file=sys.stderr)
                    return 1
                for topology in topologies.names():
                    before = net.link_bytes(spec)
                    timing = json_job(spec, ranks, per_node,
                                      ["python", __file__, "--probe", topology, "--calls",
                                       str(args.calls)], f"bench_cluster: probe {topology}",
                                      timeout_s=900, one_blas_thread=False)
                    after = net.link_bytes(spec)
                    row = {"nodes": nodes, "ranks": ranks, "ranks_per_node": per_node,
                           "rate": rate, "topology": topology, "bytes": PROBE_BYTES,
                           "calls": args.calls + 1, **timing,
                           "sent": {h: after[h]["sent"] - before[h]["sent"] for h in after},
                           "received": {h: after[h]["received"] - before[h]["received"]
                                        for h in after}}
                    links = [r for r in links if (r["nodes"], r["ranks"], r["rate"],
                                                  r["topology"]) != (nodes, ranks, rate,
                                                                     topology)]
                    links.append(row)
                    links_path.write_text(json.dumps(links, indent=1))
                    print(f"   {topology:10} {timing['median_s'] * 1e3:8.1f} ms per 4 MiB; "
                          f"node0 sent {row['sent']['node0'] / 2**20:7.1f} MiB, node1 "
                          f"{row['sent']['node1'] / 2**20:7.1f} MiB", flush=True)
    print(f"done in {time.monotonic() - started:.0f} s: {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
