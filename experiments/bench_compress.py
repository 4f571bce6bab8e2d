"""Compression wrappers (fp16, bf16, top-k, PowerSGD) measured: bytes on the links, time
at 100 Mbit/s and 1 Gbit/s, and their effect on learning.

    python experiments/bench_compress.py             # ~30 min on 2 cores, as root

1. **On the emulated cluster** (4 nodes x 1 rank, its own cluster ``mpirlcomp``, taken
   down at the end, also on error), at each cap:
   - ``mpirl.bench``: ring and butterfly plain, in fp16, in bf16, top-k at 1% and
     PowerSGD at rank 4 (a flat buffer: taken as its most nearly square matrix), 64 KiB
     to 4 MiB, side by side within each size (best of ``--rounds``);
   - a link probe per exchange (``bench_cluster.py``'s): 4 MiB allreduces, with the
     bytes through every node's link read before and after.
2. **The compression's own work** (this machine, 2 ranks, shared memory, one BLAS
   thread): the same bench where the wire costs little.
3. **Learning** (this machine, shared memory): sync A2C on CartPole at 2 ranks, seeds
   1-3, with ``--compress none|fp16|bf16|topk:0.05|powersgd:2``, the same budget: final
   mean return, gradient bytes sent per update, the
   curves (``learning.png``), and whether any run's parameters match the uncompressed
   run's.

Writes ``results.md``, ``learning.png`` and the raw files under ``--out``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NAME = "mpirlcomp"
SUBNET = "10.231.97.0/24"
NODES = 4
RATES = ["1gbit", "100mbit"]
SIZES = ["64K", "1M", "4M"]
SPECS = ["ring", "fp16:ring", "bf16:ring", "topk:0.01:ring", "powersgd:4:ring",
         "butterfly", "fp16:butterfly", "bf16:butterfly", "topk:0.01:butterfly",
         "powersgd:4:butterfly"]
#: bench_cluster's link probe: ``--probe SPEC --calls N`` times 4 MiB allreduces
PROBE = ROOT / "experiments" / "bench_cluster.py"
COMPRESS = ["none", "fp16", "bf16", "topk:0.05", "powersgd:2"]
SEEDS = [1, 2, 3]
#: the script's sections, in results.md's order (``--sections`` remeasures some)
SECTIONS = ("cluster", "compute", "learning")


def on_cluster(out: Path, rounds: int, calls: int) -> list[str]:
    from mpirl.cluster import lifecycle, net
    from mpirl.cluster.launch import json_job, run as run_on
    from mpirl.telemetry.read import load_bench

    lines = ["## On the emulated cluster: 4 nodes x 1 rank", "",
             f"`mpirl.bench` allreduce, ms, best of {rounds} rounds, side by side within each "
             "size; in brackets the time over the same topology uncompressed. Link: MiB "
             f"sent by node 0 per 4 MiB allreduce (median of {calls} calls).", ""]
    with lifecycle.owned(NAME, NODES, SUBNET) as spec:
        for rate in RATES:
            net.set_rate(spec, rate)
            bench = out / f"bench-{rate}.h5"
            code = run_on(spec, NODES, 1, ["python", "-m", "mpirl.bench", "--op", "allreduce",
                                          "--sizes", *SIZES, "--topologies", *SPECS,
                                          "--mpich", "--iters", "50", "--rounds",
                                          str(rounds), "--out", str(bench)], timeout_s=1800)
            if code != 0:
                raise SystemExit(f"bench_compress: mpirl.bench exited {code} at {rate}")
            t = load_bench(bench).pivot_table(index="bytes", columns="topology",
                                              values="avg_s") * 1e3
            lines += [f"### {rate}", "", "| exchange | " + " | ".join(
                f"{int(s) >> 10} KiB" for s in t.index) + " | node 0 sent per 4 MiB | "
                "4 MiB probe |", "|---|" + "---|" * (len(t.index) + 2)]
            for topology in SPECS:
                before = net.link_bytes(spec)
                median = json_job(spec, NODES, 1, ["python", str(PROBE), "--probe", topology,
                                                   "--calls", str(calls)],
                                  f"bench_compress: probe {topology}", timeout_s=900)["median_s"]
                after = net.link_bytes(spec)
                sent = (after["node0"]["sent"] - before["node0"]["sent"]) / (calls + 1)
                plain = topology.split(":")[-1]
                cells = [f"{t.loc[s, topology]:.3f} ({t.loc[s, topology] / t.loc[s, plain]:.2f})"
                         for s in t.index]
                lines.append(f"| {topology} | " + " | ".join(cells)
                             + f" | {sent / 2**20:.2f} MiB | {median * 1e3:.1f} ms |")
                print(lines[-1], flush=True)
            lines.append("")
    return lines


def compute(out: Path, rounds: int) -> list[str]:
    """The wrappers' own work, where the wire costs little: 2 ranks on this machine's
    shared memory (one per core, one BLAS thread each), the same specs and sizes."""
    from mpirl.launch import mpi_env, mpiexec_command
    from mpirl.telemetry.read import load_bench

    bench = out / "bench-shm-2r.h5"
    argv = [sys.executable, "-m", "mpirl.bench", "--op", "allreduce", "--sizes", *SIZES,
            "--topologies", *SPECS, "--iters", "50", "--rounds", str(rounds), "--out",
            str(bench)]
    env = mpi_env()
    done = subprocess.run(mpiexec_command(2, argv), cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit("bench_compress: the shared-memory bench failed:\n" + done.stderr[-2000:])
    t = load_bench(bench).pivot_table(index="bytes", columns="topology", values="avg_s") * 1e3
    lines = ["## The compression's own work: 2 ranks, shared memory", "",
             f"`mpirl.bench` allreduce at 2 ranks on this machine (one rank per core, "
             f"OPENBLAS_NUM_THREADS=1, as on the cluster), ms, best of {rounds} rounds; in "
             "brackets the time over the same topology uncompressed. The wire costs little "
             "here, so what is left is selecting, casting, multiplying.", "",
             "| exchange | " + " | ".join(f"{int(s) >> 10} KiB" for s in t.index) + " |",
             "|---|" + "---|" * len(t.index)]
    for topology in SPECS:
        plain = topology.split(":")[-1]
        lines.append(f"| {topology} | " + " | ".join(
            f"{t.loc[s, topology]:.3f} ({t.loc[s, topology] / t.loc[s, plain]:.2f})"
            for s in t.index) + " |")
    return lines + [""]


def learning(out: Path, steps: int) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from mpirl.launch import mpi_env, mpiexec_command
    from mpirl.telemetry.read import load_run

    runs = out / "runs"
    finals: dict[str, list[float]] = {c: [] for c in COMPRESS}
    digests: dict[tuple, str] = {}
    walls: dict[str, list[float]] = {c: [] for c in COMPRESS}
    sent: dict[str, list[float]] = {c: [] for c in COMPRESS}
    fig, ax = plt.subplots(figsize=(7, 4))
    grid = np.linspace(0, steps, 60)
    for compress in COMPRESS:
        curves = []
        for seed in SEEDS:
            name = f"{compress.replace(':', '')}-{seed}"
            shutil.rmtree(runs / name, ignore_errors=True)
            argv = [sys.executable, "-m", "mpirl.run", "--mode", "sync", "--topology", "ring",
                    "--compress", compress, "--env", "CartPole-v1", "--seed", str(seed),
                    "--total-steps", str(steps), "--run-dir", str(runs), "--run-name", name]
            done = subprocess.run(mpiexec_command(2, argv), cwd=ROOT, env=mpi_env(),
                                  capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                raise SystemExit(f"bench_compress: {name} failed:\n" + done.stderr[-2000:])
            run = load_run(runs / name)
            finals[compress].append(float(run.summary["final_mean_return"]))
            walls[compress].append(float(run.summary["wall_s"]))
            digests[compress, seed] = run.summary["param_digest"]
            later = run.updates[run.updates["update"] > 1]       # past the start's bcast
            sent[compress].append(float(later["bytes_sent"].sum() / len(later)))
            e = run.episodes.sort_values("env_steps")
            smooth = e["return"].rolling(50, min_periods=1).mean()
            curves.append(np.interp(grid, e["env_steps"], smooth))
            print(name, finals[compress][-1], flush=True)
        mean = np.mean(curves, axis=0)
        ax.plot(grid, mean, label=f"{compress} (3 seeds)")
        ax.fill_between(grid, np.min(curves, axis=0), np.max(curves, axis=0), alpha=0.15)
    ax.set_xlabel("env steps (both ranks)")
    ax.set_ylabel("episode return (50-episode mean)")
    ax.set_title("Sync A2C, CartPole-v1, 2 ranks, ring: gradients sent as ...")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "learning.png", dpi=110)
    lines = ["## Learning: sync A2C on CartPole-v1, 2 ranks, ring", "",
             f"{steps} env steps, seeds {', '.join(map(str, SEEDS))}; final mean return "
             "(the last 20 episodes of every rank) per seed, and the mean; figure: "
             "[learning.png](learning.png).", "",
             "| gradients sent as | final mean return per seed | mean | wall s (mean) | "
             "bytes sent per update and rank | parameters equal to uncompressed |",
             "|---|---|---|---|---|---|"]
    for compress in COMPRESS:
        same = sum(digests[compress, s] == digests["none", s] for s in SEEDS)
        lines.append(f"| {compress} | " + ", ".join(f"{v:.1f}" for v in finals[compress])
                     + f" | {np.mean(finals[compress]):.1f} | {np.mean(walls[compress]):.1f} "
                     f"| {np.mean(sent[compress]):.0f} | {same} of {len(SEEDS)} |")
    return lines + [""]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/figures/compress")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--steps", type=int, default=100_000,
                        help="env steps of each learning run")
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS,
                        help="the sections to (re)measure; results.md joins every "
                        "section's latest file (section-NAME.md)")
    args = parser.parse_args()
    # one BLAS thread per rank (PowerSGD's products): the emulated cluster's nodes share
    # this machine's cores, and OpenBLAS's own threads spin against the other ranks
    # (measured: powersgd:4:ring at 1 MiB, 254 ms with its default threads)
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    for name in args.sections:
        if name == "cluster":
            lines = on_cluster(out, args.rounds, args.calls)
        elif name == "compute":
            lines = compute(out, args.rounds)
        else:
            lines = learning(out, args.steps)
        (out / f"section-{name}.md").write_text("\n".join(lines) + "\n")
    text = ["# Compression wrappers (experiments/bench_compress.py)", ""]
    text += [(out / f"section-{name}.md").read_text() for name in SECTIONS
             if (out / f"section-{name}.md").is_file()]
    (out / "results.md").write_text("\n".join(text))
    print("\n".join(text))
    print(f"done in {time.monotonic() - started:.0f} s: {out}/results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
