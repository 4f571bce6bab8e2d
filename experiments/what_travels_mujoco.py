"""What travels, on a task where learning matters: every design that takes Hopper-v5's
Box actions, the same wall-time budget and seeds, learning curves against wall time.

    python experiments/what_travels_mujoco.py [--minutes 4] [--seeds 1 2 3]
                                              [--designs sync apex ...] [--runs DIR]

The points are those of ``experiments/what_travels_mujoco.yaml`` (each design with its
learner's reference settings at 4 ranks; ``python -m mpirl.sweep`` runs the same file to
its 300k-step budget, about 8 hours here).  This script gives every point the same
budget in wall time instead: each is launched as users launch it (``mpiexec -n 4 python
-m mpirl.run --config ...``) and, after ``--minutes``, stopped as a batch system's time
limit stops it (SIGTERM: every rank ends at its next boundary, logs closed).  What a
design's traffic, waits and learner cost is then read where it matters: the return
reached per second of the machine.  A point whose logs already cover the minutes (or
whose run ended by itself) is not run again.  ``--sweep`` takes another sweep file of
Hopper points (``experiments/obs_norm_mujoco.yaml``: observation normalization on and off
in async and impala); a curve's label is its design plus every field whose value differs
between that design's points, so two settings never share a line.

The curves come from the runs' HDF5 logs (every episode of every rank, with its time
and the env steps of all ranks by then), not from progress lines, so a run stopped
between two lines loses nothing.  Into ``--out`` (docs/figures/what_travels_mujoco):
``curves.png``, the return (running mean of 20 episodes) of every seed against wall time
and against env steps, one colour per design; and ``results.md``, per design the mean +-
std over seeds of env steps reached, env steps/s and the final return (every rank's last
20 episodes).  27 points of 4 minutes: 1 h 35 min on a 2-core machine (the results:
docs/learning.md, "What travels, on MuJoCo").
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpirl.launch import mpiexec_command, run_for  # noqa: E402
from mpirl.study.sweep import Point, load  # noqa: E402

SWEEP = ROOT / "experiments" / "what_travels_mujoco.yaml"
OUT = ROOT / "docs" / "figures" / "what_travels_mujoco"


def design(point: Point) -> str:
    """The design a point runs: its mode, with the topology where the mode takes one."""
    mode = point.config["mode"]
    return f"{point.config['topology']}/{mode}" if mode in ("sync", "async", "quorum",
                                                            "sync-replay") else mode


def labels(points: list[Point]) -> dict[str, str]:
    """Each point's curve label: its design and the fields that tell its group apart
    (analysis's :func:`~analysis.load.group_labels`), so two settings never share a line."""
    from analysis.load import group_labels

    return group_labels({p.name: (design(p), p.config) for p in points})


def curve(run_dir: Path) -> dict | None:
    """The run's episodes from its HDF5 logs (every rank's, in time order: wall seconds,
    env steps of all ranks by then, return), its env steps and wall time, and its final
    mean return (the last 20 episodes of every rank, as summary.json's); None before the
    run has logged an episode."""
    from mpirl.telemetry.read import load_run
    from mpirl.telemetry.schema import EXPERIENCE_ROLES

    if not (run_dir / "run.h5").is_file():
        return None
    run = load_run(run_dir)
    e = run.episodes
    if not len(e):
        return None
    u = run.updates
    # the experience ranks' rows: a parameter server's row repeats its worker's steps
    steps = int(u.loc[u["role"].isin(EXPERIENCE_ROLES), "env_steps"].sum())
    last = e.groupby("rank").tail(20)["return"].mean()
    return {"t_s": e["t_run_s"].to_numpy(), "env_steps": e["env_steps"].to_numpy(),
            "return": e["return"].to_numpy(), "steps": steps, "final": float(last),
            "wall_s": float(max(e["t_run_s"].max(), u["t_run_s"].max()))}


def run_point(point: Point, minutes: float, runs: Path) -> dict:
    """The point's curve, run first (for ``minutes``) when it has not been."""
    run_dir = point.run_dir(runs)
    found = curve(run_dir)
    if found is not None and ((run_dir / "summary.json").is_file()
                              or found["wall_s"] >= 0.95 * minutes * 60):
        return found
    if run_dir.exists():              # a run cut short by something else: start afresh
        shutil.rmtree(run_dir)
    config = runs / "configs" / f"{point.name}.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(point.config, sort_keys=False))
    cmd = mpiexec_command(point.ranks, [sys.executable, "-m", "mpirl.run", "--config",
                                        str(config), "--run-dir", str(runs), "--run-name",
                                        point.name])
    print(" ".join(cmd), flush=True)
    with open(runs / f"{point.name}.log", "w") as log:
        try:
            run_for(cmd, minutes * 60, cwd=ROOT, stdout=log)
        except RuntimeError as err:
            raise SystemExit(f"{point.name}: {err}; see {runs / point.name}.log") from None
    found = curve(run_dir)
    if found is None:
        raise SystemExit(f"{point.name}: no episode within {minutes:g} minutes")
    return found


def table(results: dict[str, list[tuple[int, dict]]], minutes: float, sweep: Path,
          ranks: list[int]) -> str:
    def cell(values: list[float], fmt: str) -> str:
        v = np.array(values, dtype=float)
        std = v.std(ddof=1) if len(v) > 1 else 0.0
        return f"{format(v.mean(), fmt)} +- {format(std, fmt)}"

    at = " or ".join(str(r) for r in ranks)
    lines = [f"Hopper-v5 at {at} ranks, every design for at most {minutes:g} minutes of wall "
             f"time on this machine (experiments/{sweep.name}'s settings); mean +- std "
             "over seeds.  Final return: the mean of every rank's last 20 episodes.", "",
             "| design | seeds | env steps | env steps/s | final return |",
             "|---|---|---|---|---|"]
    for name, runs in results.items():
        steps = [c["steps"] for _, c in runs]
        rates = [c["steps"] / c["wall_s"] for _, c in runs]
        finals = [c["final"] for _, c in runs]
        lines.append(f"| {name} | {len(runs)} | {cell(steps, ',.0f')} | {cell(rates, '.0f')} "
                     f"| {cell(finals, '.0f')} |")
    return "\n".join(lines) + "\n"


def smooth(values: np.ndarray, n: int = 20) -> np.ndarray:
    """Running mean over ``n`` episodes (fewer at the start)."""
    csum = np.cumsum(np.insert(values, 0, 0.0))
    k = np.minimum(np.arange(1, len(values) + 1), n)
    return (csum[1:] - csum[np.arange(1, len(values) + 1) - k]) / k


def figure(results: dict[str, list[tuple[int, dict]]], path: Path,
           title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_steps) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (name, runs) in enumerate(results.items()):
        for j, (_seed, c) in enumerate(runs):
            ret = smooth(c["return"])
            by_time.plot(c["t_s"] / 60, ret, color=f"C{i}", lw=1,
                         label=name if j == 0 else None)
            by_steps.plot(c["env_steps"] / 1e3, ret, color=f"C{i}", lw=1)
    by_time.set(xlabel="wall time (minutes)",
                ylabel="episode return (running mean of 20, all ranks)")
    by_steps.set(xlabel="env steps of all ranks (thousands)",
                 ylabel="episode return (running mean of 20, all ranks)")
    for ax in (by_time, by_steps):
        ax.grid(alpha=0.3)
    by_time.legend(fontsize=7, ncol=2)
    fig.suptitle(f"{title} (one line per seed)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--seeds", nargs="+", type=int, default=None,
                        help="default: the sweep file's")
    parser.add_argument("--designs", nargs="+", default=None,
                        help="modes to run (default: every one in the sweep file)")
    parser.add_argument("--sweep", type=Path, default=SWEEP)
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "what_travels_mujoco")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error(f"--minutes {args.minutes}: allowed: a number above 0")
    points = load(args.sweep).points
    modes = sorted({p.config["mode"] for p in points})
    unknown = sorted(set(args.designs or ()) - set(modes))
    if unknown:
        parser.error(f"--designs {' '.join(unknown)}: allowed: {' '.join(modes)}")
    points = [p for p in points
              if (args.designs is None or p.config["mode"] in args.designs)
              and (args.seeds is None or p.config["seed"] in args.seeds)]
    if not points:
        parser.error("no point of the sweep file has these designs and seeds")
    results: dict[str, list[tuple[int, dict]]] = {}
    label = labels(points)
    for point in points:
        found = run_point(point, args.minutes, args.runs)
        results.setdefault(label[point.name], []).append((point.config["seed"], found))
    args.out.mkdir(parents=True, exist_ok=True)
    text = table(results, args.minutes, args.sweep, sorted({p.ranks for p in points}))
    (args.out / "results.md").write_text(text)
    figure(results, args.out / "curves.png",
           " ".join(str(load(args.sweep).definition.get("description", "")).split()))
    print(text)


if __name__ == "__main__":
    main()
