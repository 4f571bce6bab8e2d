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
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from l2run_curves import figure  # noqa: E402  (this directory: the same two panels)
from mpirl.launch import mpi_env, mpiexec_command, stop_job  # noqa: E402
from mpirl.telemetry.progress import read_progress  # noqa: E402

CONFIG = ROOT / "experiments" / "l2run_sac.yaml"
OUT = ROOT / "docs" / "figures" / "l2run"
#: progress lines a return is averaged over (each line averages the episodes it saw end),
#: as l2run_curves' running mean
LINES = 20
#: seconds a run may take to end after SIGTERM (a checkpoint of its replay is written)
GRACE_S = 300


def run_path(runs: Path, accuracy: float) -> Path:
    return runs / f"sac-acc{accuracy:g}"


def done(accuracy: float, opts) -> bool:
    """The run at ``accuracy`` ran its minutes (then its progress is read, not rerun); a
    directory holding anything else is refused before any run starts."""
    where = run_path(opts.runs, accuracy)
    ran = where / "minutes.txt"           # written once the time limit stopped the run
    if ran.is_file() and float(ran.read_text()) >= opts.minutes:
        return True
    if where.exists():
        raise SystemExit(f"{where} holds a run shorter than {opts.minutes:g} minutes (or "
                         "an unfinished one); move it aside to run it again")
    return False


def launch(accuracy: float, opts) -> subprocess.Popen:
    where = run_path(opts.runs, accuracy)
    where.mkdir(parents=True)
    cmd = mpiexec_command(opts.ranks, [
        sys.executable, "-m", "mpirl.run", "--config", str(CONFIG), "--seed", str(opts.seed),
        "--env-arg", "difficulty=0", "--env-arg", f"integrator_accuracy={accuracy:g}",
        "--torch-threads", "1", "--run-dir", str(where), "--run-name", "r"])
    print(" ".join(cmd), flush=True)
    with open(where / "output.txt", "w") as log:
        return subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(), start_new_session=True,
                                stdout=log, stderr=subprocess.STDOUT)


def run_side_by_side(todo: list[float], opts) -> None:
    """The runs at ``todo``'s accuracies at once, each stopped by SIGTERM after
    ``opts.minutes`` (as a batch system's time limit: every rank ends at its next
    boundary, its logs closed); a run that ends by itself before is a failure, and so is
    Ctrl-C, which stops every run the same way first."""
    jobs = {accuracy: launch(accuracy, opts) for accuracy in todo}
    deadline = time.monotonic() + opts.minutes * 60
    try:
        while time.monotonic() < deadline:
            ended = {a: job.returncode for a, job in jobs.items() if job.poll() is not None}
            if ended:
                raise SystemExit(f"ended before the time limit (exit status): {ended}; see "
                                 f"{run_path(opts.runs, next(iter(ended)))}/output.txt")
            time.sleep(1.0)
    finally:
        stopped = {a: stop_job(job, GRACE_S) for a, job in jobs.items() if job.poll() is None}
    if not all(stopped.values()):
        raise SystemExit(f"no exit within {GRACE_S} s of SIGTERM (killed): {stopped}")
    for accuracy in todo:
        if read_progress(run_path(opts.runs, accuracy) / "r") is None:
            raise SystemExit(f"integrator_accuracy {accuracy:g}: no progress line")
        (run_path(opts.runs, accuracy) / "minutes.txt").write_text(f"{opts.minutes:g}\n")


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
    run_side_by_side([a for a in opts.accuracies if not done(a, opts)], opts)
    results = {a: read_progress(run_path(opts.runs, a) / "r") for a in opts.accuracies}
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "integrator-learning.md").write_text(table(results, opts))
    figure({f"integrator_accuracy {a:g}": rows for a, rows in results.items()},
           opts.out / "integrator-learning.png")
    print(table(results, opts))


if __name__ == "__main__":
    main()
