"""Does one update of staleness cost learning?  sync A2C on CartPole-v1, plain against
``--one-step-stale``, the same seeds, ranks and budget.

    python experiments/bench_stale_learning.py [--seeds 1 2 3] [--ranks 2]
                                               [--total-steps 500000] [--out DIR]

Each run is ``--mode sync --topology butterfly --seed S --target-return 400`` with the
shared defaults otherwise (plus ``--one-step-stale`` for the stale runs): it stops once
every rank's last 20 episodes average 400, or at the budget.  Writes ``learning.md`` (per
seed: env steps to 400 and the final mean, side by side) and ``learning.png`` (the
progress lines' mean return against env steps, from each run's progress.csv) under ``--out``;
the runs themselves go to ``--runs``.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpirl.launch import mpi_env, mpiexec_command  # noqa: E402

WAYS = {"plain": [], "stale": ["--one-step-stale"]}


def train(args, way: str, seed: int) -> Path:
    name = f"{way}-s{seed}"
    argv = [sys.executable, "-m", "mpirl.run", "--mode", "sync", "--topology", "butterfly",
            "--seed", str(seed), "--total-steps", str(args.total_steps),
            "--target-return", "400", "--log-every", "5", "--run-dir", str(args.runs),
            "--run-name", name, *WAYS[way]]
    done = subprocess.run(mpiexec_command(args.ranks, argv), cwd=ROOT, env=mpi_env(),
                          capture_output=True, text=True, timeout=args.timeout_s)
    if done.returncode:
        raise SystemExit(f"{name} exited {done.returncode}:\n{done.stdout[-2000:]}"
                         f"{done.stderr[-2000:]}")
    return args.runs / name


def curve(run: Path) -> tuple[list[int], list[float]]:
    with open(run / "progress.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["mean_return"] not in ("", "nan")]
    return [int(r["env_steps"]) for r in rows], [float(r["mean_return"]) for r in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--total-steps", type=int, default=500_000)
    parser.add_argument("--out", type=Path, default=Path("docs/figures/stale"))
    parser.add_argument("--runs", type=Path, default=Path("runs/stale_learning"))
    parser.add_argument("--timeout-s", type=float, default=1800)
    args = parser.parse_args()
    results = {}
    for seed in args.seeds:
        for way in WAYS:          # plain then stale, per seed: the same conditions for both
            run = train(args, way, seed)
            results[way, seed] = (json.loads((run / "summary.json").read_text()), curve(run))
            s = results[way, seed][0]
            print(way, seed, s["reached_target"], s["env_steps"], s["final_mean_return"],
                  flush=True)
    write(args, results)
    return 0


def cell(summary: dict) -> str:
    steps = f"{summary['env_steps']:,}" if summary["reached_target"] else "not in budget"
    return f"{steps} | {summary['final_mean_return']:.1f}"


def write(args, results: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    args.out.mkdir(parents=True, exist_ok=True)
    lines = ["# Learning under one-step staleness", "",
             f"`python experiments/bench_stale_learning.py --seeds "
             f"{' '.join(map(str, args.seeds))} --ranks {args.ranks}`: sync A2C over "
             f"butterfly on CartPole-v1, {args.ranks} ranks, shared defaults, stop at a "
             f"mean of 400 (every rank's last 20 episodes) or {args.total_steps:,} env "
             "steps.", "",
             "| seed | plain: env steps to 400 | final mean | stale: env steps to 400 "
             "| final mean |", "|---|---|---|---|---|"]
    for seed in args.seeds:
        lines.append(f"| {seed} | {cell(results['plain', seed][0])} | "
                     f"{cell(results['stale', seed][0])} |")
    reached = {way: [results[way, s][0]["env_steps"] for s in args.seeds
                     if results[way, s][0]["reached_target"]] for way in WAYS}
    for way, steps in reached.items():
        mean = f", mean {sum(steps) / len(steps):,.0f} env steps" if steps else ""
        lines.append(f"\n{way}: {len(steps)} of {len(args.seeds)} seeds reached 400{mean}.")
    lines += ["", "![learning](learning.png)", ""]
    (args.out / "learning.md").write_text("\n".join(lines))
    fig, ax = plt.subplots(figsize=(7, 4))
    for way, color in zip(WAYS, ("tab:blue", "tab:red"), strict=True):
        for i, seed in enumerate(args.seeds):
            x, y = results[way, seed][1]
            ax.plot(x, y, color=color, alpha=0.8, label=way if i == 0 else None)
    ax.axhline(400, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("env steps (all ranks)")
    ax.set_ylabel("mean return (progress line)")
    ax.set_title(f"CartPole-v1, sync butterfly, {args.ranks} ranks, seeds "
                 f"{', '.join(map(str, args.seeds))}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "learning.png", dpi=110)
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
