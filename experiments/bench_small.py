"""The small-message path (``topologies.persistent``) measured, in a microbenchmark and in situ.

    python experiments/bench_small.py                # ~10 min on 2 cores

1. **Microbenchmark.**  ``mpirl.bench --blocking`` at 2, 3 and 4 ranks, 1 KiB to 64 KiB:
   every home-made topology with its small-message path (persistent requests replayed in
   C, the default where built), with the path replayed in Python (``NAME/python``) and
   without it (``NAME/blocking``), beside MPICH forced to the same algorithm, all side
   by side within each size (best of ``--rounds``).  The table gives each one's time
   over MPICH's same algorithm.
2. **In situ.**  Sync A2C on CartPole at 2 ranks, for each topology and two network
   sizes, with the path on and off (``MPIRL_SMALL_PATH_BYTES=0``), the pairs run
   alternately.  An update's exchange as the log has it: ``transfer_s`` is
   ``exchange_s`` less the waiting that ``analysis`` derives from when each rank
   entered, i.e. the time the exchange took once both ranks were in it; its median over
   updates and ranks is set against ``mpirl.bench`` of the gradient's own byte size, run
   in the same session.

3. **Why in situ costs more.**  The same allreduce (844 B, 2 ranks) in a loop where
   the ranks take turns to arrive 2 ms late (``--stagger-worker``; the late rank sleeps,
   or computes, meanwhile), against the lockstep loop of the microbenchmark: the late rank's
   allreduce time, for ``native`` (MPI_Allreduce) and ``butterfly``.

Writes ``results.md`` under ``--out`` (default ``docs/figures/small``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOPOLOGIES = ["tree", "butterfly", "ring", "rabenseifner"]
SIZES = ["1K", "8K", "64K"]
#: the networks of the in-situ runs: hidden widths
NETWORKS = {"16": ["16"], "64x64": ["64", "64"]}


def mpiexec(nranks: int, argv: list[str], env: dict | None = None, timeout_s: float = 1800):
    from mpirl.launch import mpi_env, mpiexec_command

    result = subprocess.run(mpiexec_command(nranks, [sys.executable, *argv]), cwd=ROOT,
                            env=mpi_env(env),
                            capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0:
        raise SystemExit(f"bench_small: {' '.join(argv[:3])} exited {result.returncode}:\n"
                         + (result.stdout + result.stderr)[-3000:])
    return result


def bench(nranks: int, sizes: list[str], out: Path, rounds: int, iters: int) -> None:
    mpiexec(nranks, ["-m", "mpirl.bench", "--op", "allreduce", "--sizes", *sizes,
                     "--topologies", *TOPOLOGIES, "--blocking", "--iters", str(iters),
                     "--rounds", str(rounds), "--out", str(out)])


def ratios(path: Path) -> list[str]:
    """One markdown row per size: each topology with the path (replayed in C, then in
    Python where the C replay is built) and without it over MPICH's same algorithm."""
    from mpirl.study.bench import SAME_ALGORITHM
    from mpirl.telemetry.read import load_bench

    t = load_bench(path).pivot_table(index="bytes", columns="topology", values="avg_s")
    rows = []
    for size, row in t.iterrows():
        cells = []
        for name in TOPOLOGIES:
            ref = row[f"native:{SAME_ALGORITHM['allreduce'][name]}"]
            python = (f" / {row[f'{name}/python'] / ref:.2f}" if f"{name}/python" in row
                      else "")
            cells.append(f"{row[name] / ref:.2f}{python} ({row[f'{name}/blocking'] / ref:.2f})")
        rows.append(f"| {int(size) >> 10} KiB | " + " | ".join(cells) + " |")
    return rows


def in_situ_run(out: Path, topology: str, hidden: list[str], path_on: bool, steps: int,
                rep: int):
    """One sync run; returns (gradient bytes, median transfer_s, median exchange_s)."""
    from mpirl.telemetry.read import load_run

    name = f"{topology}-{'x'.join(hidden)}-{'on' if path_on else 'off'}-{rep}"
    if (out / name).exists():
        import shutil

        shutil.rmtree(out / name)
    env = {} if path_on else {"MPIRL_SMALL_PATH_BYTES": "0"}
    mpiexec(2, ["-m", "mpirl.run", "--mode", "sync", "--topology", topology, "--env",
                "CartPole-v1", "--hidden", *hidden, "--total-steps", str(steps),
                "--seed", "3", "--run-dir", str(out), "--run-name", name], env=env)
    run = load_run(out / name)
    u = run.updates[run.updates["update"] > 0]            # update 0: the start's bcast
    return (int(run.summary["gradient_bytes"]), float(u["transfer_s"].median()),
            float(u["exchange_s"].median()))


def stagger_worker(topology: str, gap_s: float, busy: bool) -> None:
    """Under mpiexec -n 2: 300 allreduces of 211 float32, the ranks arriving ``gap_s``
    apart (which one is late alternates; 0: lockstep after a barrier); rank 0 prints the
    late rank's median and 10th-percentile allreduce time in microseconds."""
    from mpirl.launch import apply_mpi_defaults

    apply_mpi_defaults()
    import numpy as np
    from mpi4py import MPI

    import topologies

    comm = MPI.COMM_WORLD
    topo = topologies.get(topology)(comm)
    buf = np.ones(211, np.float32)
    work = np.random.default_rng(0).standard_normal((200, 200))
    stamps = []
    for i in range(300):
        comm.Barrier()
        until = time.perf_counter() + (gap_s if (i + comm.rank) % 2 else 0.0)
        while time.perf_counter() < until:
            if busy:
                work @ work
            else:
                time.sleep(max(0.0, until - time.perf_counter()))
        entered, started = time.time(), time.perf_counter()
        topo.allreduce(buf, average=True)
        stamps.append((entered, time.perf_counter() - started))
    every = comm.gather(np.array(stamps[20:]), root=0)
    if comm.rank == 0:
        a, b = every
        late = np.where(b[:, 0] > a[:, 0], b[:, 1], a[:, 1]) * 1e6
        print(f"{np.median(late):.1f} {np.percentile(late, 10):.1f}")


def stagger(nbytes_note: str) -> list[str]:
    lines = ["## Why in situ costs more: one rank arriving late", "",
             "2 ranks, 844 B (211 float32), 280 allreduces; the late rank's allreduce time, "
             f"median (10th percentile), microseconds. {nbytes_note}", "",
             "| exchange | lockstep | late rank slept 2 ms first | late rank computed "
             "2 ms first (numpy matmul: OpenBLAS threads on both cores) |", "|---|---|---|---|"]
    for topology in ("native", "butterfly"):
        cells = []
        for gap, busy in ((0.0, False), (0.002, False), (0.002, True)):
            out = mpiexec(2, [__file__, "--stagger-worker", topology, str(gap),
                              "busy" if busy else "sleep"]).stdout.split()
            cells.append(f"{out[0]} ({out[1]})")
        lines.append(f"| {topology} | " + " | ".join(cells) + " |")
    return lines + [""]


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--stagger-worker":
        stagger_worker(sys.argv[2], float(sys.argv[3]), sys.argv[4] == "busy")
        return 0
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/figures/small")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=60_000,
                        help="env steps of each in-situ run")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 4])
    args = parser.parse_args()
    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    text = ["# The small-message path (experiments/bench_small.py)", "",
            f"`mpirl.bench --blocking`, best of {args.rounds} rounds, all side by side within "
            "each size. Each cell: time over MPICH forced to the same algorithm, with the "
            "path (persistent requests) replayed in C / replayed in Python and, in brackets, "
            "without it.", ""]
    for nranks in args.ranks:
        path = out / f"micro-{nranks}r.h5"
        bench(nranks, SIZES, path, args.rounds, args.iters)
        text += [f"### {nranks} ranks", "", "| size | " + " | ".join(TOPOLOGIES) + " |",
                 "|---|" + "---|" * len(TOPOLOGIES), *ratios(path), ""]
        print("\n".join(text[-len(SIZES) - 4:]), flush=True)

    runs = out / "runs"
    situ: dict[tuple, tuple] = {}
    for hidden in NETWORKS.values():
        for topology in TOPOLOGIES:
            for rep, path_on in enumerate((False, True, False, True)):  # alternating
                key = (topology, "x".join(hidden), path_on)
                got = in_situ_run(runs, topology, hidden, path_on, args.steps, rep)
                old = situ.get(key)
                situ[key] = got if old is None or got[1] < old[1] else old
                print(key, got, f"{time.monotonic() - started:.0f} s", flush=True)
    from mpirl.telemetry.read import load_bench

    text += ["## In situ: an update's exchange against the microbenchmark", "",
             "Sync A2C, CartPole, 2 ranks; median over updates and ranks (better of two "
             "runs each), microseconds. transfer = exchange_s less the derived waiting.", "",
             "| network (gradient) | topology | path | in-situ transfer | in-situ exchange_s "
             "| bench, same bytes | transfer / bench |", "|---|---|---|---|---|---|---|"]
    for label, hidden in NETWORKS.items():
        nbytes = situ["butterfly", "x".join(hidden), True][0]
        path = out / f"situ-{label}.h5"
        bench(2, [str(nbytes)], path, args.rounds, args.iters)
        t = load_bench(path).set_index("topology")["avg_s"]
        for topology in TOPOLOGIES:
            for path_on in (True, False):
                _, transfer, exchange = situ[topology, "x".join(hidden), path_on]
                ref = t[topology if path_on else f"{topology}/blocking"]
                text.append(f"| {label} ({nbytes} B) | {topology} | "
                            f"{'on' if path_on else 'off'} | {transfer * 1e6:.1f} | "
                            f"{exchange * 1e6:.1f} | {ref * 1e6:.1f} | {transfer / ref:.2f} |")
    text.append("")
    text += stagger("In the lockstep loop the ranks leave a barrier together, as in "
                    "mpirl.bench; in a training step one rank is usually milliseconds "
                    "ahead (the log's entry times).")
    (out / "results.md").write_text("\n".join(text) + "\n")
    print("\n".join(text[-20:]))
    print(f"done in {time.monotonic() - started:.0f} s: {out}/results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
