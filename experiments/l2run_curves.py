"""Learning to Run, learned: long runs of the book's setup and their learning curves.

    python experiments/l2run_curves.py [--designs ppo sac ...] [--minutes 60]
                                       [--seed 1] [--runs DIR]

Each design is one run of its configuration, launched as users launch it (``mpiexec -n
RANKS python -m mpirl.run --config ...``), for ``--minutes`` of wall time; then the run
is stopped as Slurm's time limit stops it (SIGTERM to mpiexec: every rank ends at its
next boundary, its logs closed).  A run whose ``progress.csv`` already covers the minutes
is not run again.

- ``ppo``: experiments/l2run_a2c.yaml, sync PPO at 2 ranks (the five tricks);
- ``sac``: experiments/l2run_sac.yaml, SAC on sync-replay at 2 ranks (every rank its
  own replay, gradients averaged);
- ``apex``: experiments/l2run_apex_sac.yaml, SAC over a replay rank at 4 ranks.

The figure (docs/figures/l2run/curves.png) draws the mean episode return (metres the
pelvis moved forward, less the small ligament penalty) against env steps and against
wall time, one line per design; the table (curves.md) gives each run's env steps/s and
its best and last progress-line returns.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpirl.launch import mpi_env, mpiexec_command  # noqa: E402

#: design -> (ranks, configuration, label)
DESIGNS = {"ppo": (2, "l2run_a2c.yaml", "PPO, sync, 2 ranks"),
           "sac": (2, "l2run_sac.yaml", "SAC, sync-replay, 2 ranks"),
           "apex": (4, "l2run_apex_sac.yaml", "SAC, apex, 4 ranks")}
OUT = ROOT / "docs" / "figures" / "l2run"


def progress(run_dir: Path) -> np.ndarray | None:
    """The run's progress lines (env_steps, wall_s, mean_return), or None."""
    found = sorted(run_dir.glob("*/progress.csv"))
    if not found:
        return None
    rows = np.genfromtxt(found[-1], delimiter=",", names=True, ndmin=1)
    return rows if rows.size else None


def run(design: str, minutes: float, seed: int, runs: Path) -> np.ndarray:
    ranks, config, _ = DESIGNS[design]
    run_dir = runs / f"{design}-s{seed}"
    rows = progress(run_dir)
    if rows is not None and rows["wall_s"][-1] >= 0.95 * minutes * 60:
        return rows
    cmd = mpiexec_command(ranks, [sys.executable, "-m", "mpirl.run", "--config",
                                  str(ROOT / "experiments" / config), "--seed", str(seed),
                                  "--run-dir", str(run_dir)])
    print(" ".join(cmd), flush=True)
    job = subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(), stdout=subprocess.DEVNULL)
    try:
        job.wait(timeout=minutes * 60)
    except subprocess.TimeoutExpired:
        job.send_signal(signal.SIGTERM)      # as a time limit stops a batch job
        try:
            job.wait(timeout=300)
        except subprocess.TimeoutExpired:
            job.kill()
            raise SystemExit(f"{design}: no exit within 300 s of SIGTERM") from None
    rows = progress(run_dir)
    if rows is None:
        raise SystemExit(f"{design}: no progress line in {run_dir}")
    return rows


def table(results: dict[str, np.ndarray], minutes: float) -> str:
    lines = [f"Learning to Run (L2Run-v0, difficulty 0), each design for {minutes:g} minutes "
             "on this machine; returns are the mean over a progress line's episodes.", "",
             "| design | env steps | env steps/s | best return | last return |",
             "|---|---|---|---|---|"]
    for design, rows in results.items():
        ret = rows["mean_return"][np.isfinite(rows["mean_return"])]
        best = f"{ret.max():.2f}" if ret.size else "n/a"
        last = f"{ret[-1]:.2f}" if ret.size else "n/a"
        lines.append(f"| {DESIGNS[design][2]} | {int(rows['env_steps'][-1]):,} | "
                     f"{rows['env_steps'][-1] / rows['wall_s'][-1]:.1f} | {best} | {last} |")
    return "\n".join(lines) + "\n"


def figure(results: dict[str, np.ndarray], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_steps, by_time) = plt.subplots(1, 2, figsize=(10, 3.8))
    for design, rows in results.items():
        label = DESIGNS[design][2]
        by_steps.plot(rows["env_steps"] / 1e3, rows["mean_return"], label=label)
        by_time.plot(rows["wall_s"] / 60, rows["mean_return"], label=label)
    by_steps.set(xlabel="env steps (thousands)", ylabel="mean episode return (m walked)")
    by_time.set(xlabel="wall time (minutes)", ylabel="mean episode return (m walked)")
    for ax in (by_steps, by_time):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--designs", nargs="+", choices=list(DESIGNS), default=list(DESIGNS))
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "l2run_curves")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error(f"--minutes {args.minutes}: allowed: a number above 0")
    results = {d: run(d, args.minutes, args.seed, args.runs) for d in args.designs}
    args.out.mkdir(parents=True, exist_ok=True)
    text = table(results, args.minutes)
    (args.out / "curves.md").write_text(text)
    figure(results, args.out / "curves.png")
    print(text)


if __name__ == "__main__":
    main()
