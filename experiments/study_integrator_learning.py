"""Whether OpenSim's ``integrator_accuracy`` changes what SAC learns on L2Run-v0.

    python experiments/study_integrator_learning.py [--accuracies 1e-3 5e-5]
                                                    [--minutes 55] [--ranks 1] [--seed 1]

experiments/study_integrator.py measures what a looser integrator buys (env steps/s) and
how far its open-loop dynamics move; this script asks the learner.  It runs the book's
SAC setup (experiments/l2run_sac.yaml: sync-replay, the five tricks as SAC takes them)
once per accuracy, all at once side by side (``--ranks`` ranks each, one torch thread
per rank, so the runs share the cores alike), each for ``--minutes`` of wall time, then
stops it as a batch system's time limit does (SIGTERM: every rank ends at its next
boundary, its logs closed).  A run whose progress already covers the minutes is not run
again.

Two comparisons, one table (docs/figures/l2run/integrator-learning.md) and a figure
(integrator-learning.png, the return against env steps and against wall time):

- **per env step** (does learning change?): each run's mean return over its last 20
  progress lines up to the env steps every run reached;
- **per minute** (what the speed buys): each run's env steps/s and its return at the end.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpirl.launch import mpiexec_command, run_for  # noqa: E402
from mpirl.telemetry.progress import read_progress  # noqa: E402

CONFIG = ROOT / "experiments" / "l2run_sac.yaml"
OUT = ROOT / "docs" / "figures" / "l2run"
#: progress lines a return is averaged over (each line averages the episodes it saw end)
LINES = 20


def run_path(runs: Path, accuracy: float) -> Path:
    return runs / f"sac-acc{accuracy:g}"


def run(accuracy: float, opts) -> np.ndarray:
    """The run at ``accuracy``: launched (or found done) and its progress lines."""
    where = run_path(opts.runs, accuracy)
    ran = where / "minutes.txt"           # written once the time limit stopped the run
    if ran.is_file() and float(ran.read_text()) >= opts.minutes:
        return read_progress(where / "r")
    if where.exists():
        raise SystemExit(f"{where} holds a run shorter than {opts.minutes:g} minutes; "
                         "move it aside to run it again")
    where.mkdir(parents=True)
    cmd = mpiexec_command(opts.ranks, [
        sys.executable, "-m", "mpirl.run", "--config", str(CONFIG), "--seed", str(opts.seed),
        "--env-arg", "difficulty=0", "--env-arg", f"integrator_accuracy={accuracy:g}",
        "--torch-threads", "1", "--run-dir", str(where), "--run-name", "r"])
    print(" ".join(cmd), flush=True)
    with open(where / "output.txt", "w") as log:
        try:
            run_for(cmd, opts.minutes * 60, cwd=ROOT, stdout=log)
        except RuntimeError as err:
            raise SystemExit(f"integrator_accuracy {accuracy:g}: {err}") from None
    rows = read_progress(where / "r")
    if rows is None:
        raise SystemExit(f"integrator_accuracy {accuracy:g}: no progress line in {where}")
    ran.write_text(f"{opts.minutes:g}\n")
    return rows


def last_mean(rows: np.ndarray, upto: float) -> float:
    """The mean return over the last LINES progress lines at ``upto`` env steps or before
    (lines without an episode's end are skipped)."""
    ret = rows["mean_return"][rows["env_steps"] <= upto]
    ret = ret[np.isfinite(ret)][-LINES:]
    return float(ret.mean()) if ret.size else float("nan")


def table(results: dict[float, np.ndarray], opts) -> str:
    common = min(float(rows["env_steps"][-1]) for rows in results.values())
    lines = [f"SAC on L2Run-v0 (experiments/l2run_sac.yaml, difficulty 0), seed {opts.seed}, "
             f"{opts.ranks} rank(s) per run, the runs side by side for {opts.minutes:g} "
             f"minutes; returns are the mean of the last {LINES} progress lines.", "",
             f"| integrator_accuracy | env steps | env steps/s | return at {common:,.0f} "
             "env steps | return at the end |", "|---|---|---|---|---|"]
    for accuracy, rows in results.items():
        end = float(rows["env_steps"][-1])
        lines.append(f"| {accuracy:g} | {end:,.0f} | {end / rows['wall_s'][-1]:.1f} | "
                     f"{last_mean(rows, common):.3f} | {last_mean(rows, end):.3f} |")
    return "\n".join(lines) + "\n"


def figure(results: dict[float, np.ndarray], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_steps, by_time) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, (accuracy, rows) in enumerate(results.items()):
        ret, color = rows["mean_return"], f"C{i}"
        kept = np.isfinite(ret)
        smooth = np.convolve(ret[kept], np.ones(LINES) / LINES, mode="valid")
        for ax, x in ((by_steps, rows["env_steps"][kept] / 1e3),
                      (by_time, rows["wall_s"][kept] / 60)):
            ax.plot(x, ret[kept], color=color, alpha=0.25, lw=0.7)
            if kept.sum() >= LINES:
                ax.plot(x[LINES - 1:], smooth, color=color, lw=1.8,
                        label=f"integrator_accuracy {accuracy:g} (mean of {LINES} lines)")
    by_steps.set(xlabel="env steps: simulator steps (thousands)",
                 ylabel="mean episode return (m walked)")
    by_time.set(xlabel="wall time (minutes)", ylabel="mean episode return (m walked)")
    for ax in (by_steps, by_time):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accuracies", nargs="+", type=float, default=[1e-3, 5e-5])
    parser.add_argument("--minutes", type=float, default=55.0)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "integrator_learning")
    parser.add_argument("--out", type=Path, default=OUT)
    opts = parser.parse_args(argv)
    if not all(0 < a < 1 for a in opts.accuracies) or len(set(opts.accuracies)) < 2:
        parser.error(f"--accuracies {opts.accuracies}: give two or more different numbers "
                     "in (0, 1)")
    if opts.minutes <= 0 or opts.ranks < 1:
        parser.error(f"--minutes {opts.minutes:g} --ranks {opts.ranks}: allowed: minutes > 0, "
                     "ranks >= 1")
    with ThreadPoolExecutor(len(opts.accuracies)) as pool:
        found = list(pool.map(lambda a: run(a, opts), opts.accuracies))
    results = dict(zip(opts.accuracies, found, strict=True))
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "integrator-learning.md").write_text(table(results, opts))
    figure(results, opts.out / "integrator-learning.png")
    print(table(results, opts))


if __name__ == "__main__":
    main()
