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

The projection (``--project-cpus 56 --project-days 3``: the book's server and its
training time) puts each run's own measurements into the scaling model of
``mpirl.simulate``: a round of a sync design takes the slowest of P ranks' compute (the
run's logged per-round compute seconds, drawn independently for every rank: OpenSim's
slow steps are rare, and at 56 ranks one of them is in most rounds) plus the round's
allreduces, each costed by the alpha-beta-gamma model fitted on the emulated cluster
without a rate cap (``docs/figures/cluster/params.json``, ``8n-8r-off``: the closest
fitted fabric to one server's).  The same model at the run's own 2 ranks is printed
against the measured rate, as its check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpirl.launch import mpiexec_command, run_for  # noqa: E402
from mpirl.telemetry.progress import read_progress  # noqa: E402

#: design -> (ranks, configuration, label)
DESIGNS = {"ppo": (2, "l2run_a2c.yaml", "PPO, sync, 2 ranks"),
           "sac": (2, "l2run_sac.yaml", "SAC, sync-replay, 2 ranks"),
           "apex": (4, "l2run_apex_sac.yaml", "SAC, apex, 4 ranks")}
OUT = ROOT / "docs" / "figures" / "l2run"
#: the cost-model fit the projection uses (one of docs/figures/cluster/params.json's keys)
FABRIC = ("docs/figures/cluster/params.json", "8n-8r-off")


def run_path(runs: Path, design: str, seed: int) -> Path | None:
    """The design's run directory (its progress.csv, logs and summary.json), or None."""
    found = sorted((runs / f"{design}-s{seed}").glob("*/progress.csv"))
    return found[-1].parent if found else None


def progress(run_dir: Path | None) -> np.ndarray | None:
    """The run's progress lines (env_steps, wall_s, mean_return), or None."""
    return None if run_dir is None else read_progress(run_dir)


def run(design: str, minutes: float, seed: int, runs: Path) -> np.ndarray:
    ranks, config, _ = DESIGNS[design]
    run_dir = runs / f"{design}-s{seed}"
    rows = progress(run_path(runs, design, seed))
    if rows is not None and rows["wall_s"][-1] >= 0.95 * minutes * 60:
        return rows
    cmd = mpiexec_command(ranks, [sys.executable, "-m", "mpirl.run", "--config",
                                  str(ROOT / "experiments" / config), "--seed", str(seed),
                                  "--run-dir", str(run_dir)])
    print(" ".join(cmd), flush=True)
    try:
        run_for(cmd, minutes * 60, cwd=ROOT)     # stopped as a time limit stops a batch job
    except RuntimeError as err:
        raise SystemExit(f"{design}: {err}") from None
    rows = progress(run_path(runs, design, seed))
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


def project(run_dir: Path, cpus: int, rounds: int = 4000, seed: int = 0) -> dict:
    """Env steps/s of the run's design at ``cpus`` ranks and at its own rank count, from
    its logged compute per round and the fitted exchange cost (see the module doc).

    A round is one rollout and the updates learned from it
    (:func:`mpirl.study.simulate.compute_from_run`: PPO logs each update repeat as its own
    row, sync-replay each update; the round's compute is the sum of its rows', its
    allreduces the rows that exchanged).  A run stopped by a time limit has no
    summary.json: its rate is its last progress line's."""
    import json

    from mpirl.study.costmodel import Params
    from mpirl.study.simulate import Compute, compute_from_run, simulate_sync
    from mpirl.telemetry.read import load_run

    run = load_run(run_dir)
    ranks = int(run.meta["world_size"])
    if ranks != 2 or run.config["topology"] != "butterfly":
        raise SystemExit(f"{run_dir}: the projection reads a 2-rank butterfly run's bytes")
    found = compute_from_run(run_dir)
    # stopped by the time limit, the run has no summary.json: at 2 ranks the butterfly
    # receives the whole gradient once per allreduce
    u = run.updates
    nbytes = found.nbytes or float(u.loc[u["bytes_recv"] > 0, "bytes_recv"].median())
    samples, exchanges, steps = found.samples, found.exchanges, float(found.steps)
    params = Params(**json.loads((ROOT / FABRIC[0]).read_text())[FABRIC[1]])

    def rate(p: int) -> float:
        return simulate_sync(params, "butterfly", p, nbytes, Compute(samples=samples, seed=seed),
                             steps, updates=rounds, exchanges=exchanges).env_steps_per_s

    rows = progress(run_dir)
    return {"ranks": ranks, "model_at_ranks": rate(ranks), "cpus": cpus,
            "model_at_cpus": rate(cpus), "per_rank_alone": rate(1),
            "measured": rows["env_steps"][-1] / rows["wall_s"][-1],
            "gradient_bytes": nbytes, "exchanges": exchanges, "steps_per_round": steps}


def projection_table(results: dict[str, np.ndarray], projections: dict[str, dict],
                     days: float) -> str:
    cpus = next(iter(projections.values()))["cpus"]
    lines = ["", f"Projected to the book's budget ({cpus} CPUs, {days:g} days), each run's own "
             f"compute per round and the fitted exchange cost ({FABRIC[1]}); "
             "the model at the run's own ranks is its check against the measured rate.", "",
             f"| design | measured env steps/s | model at the run's ranks | model at {cpus} "
             f"| efficiency at {cpus} | env steps in {days:g} days | the hour's env steps at "
             f"{cpus} CPUs take |", "|---|---|---|---|---|---|---|"]
    for design, pr in projections.items():
        hour = results[design]["env_steps"][-1]
        eff = pr["model_at_cpus"] / (cpus * pr["per_rank_alone"])
        lines.append(f"| {DESIGNS[design][2]} | {pr['measured']:.1f} | "
                     f"{pr['model_at_ranks']:.1f} | {pr['model_at_cpus']:.0f} | {eff:.0%} | "
                     f"{pr['model_at_cpus'] * days * 86400 / 1e6:.0f}M | "
                     f"{hour / pr['model_at_cpus'] / 60:.1f} min |")
    return "\n".join(lines) + "\n"


def figure(curves: dict[str, np.ndarray], path: Path) -> None:
    """The mean return against env steps and against wall time, a line per run (label ->
    its progress lines); experiments/study_integrator_learning.py draws with it too."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_steps, by_time) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, (label, rows) in enumerate(curves.items()):
        color = f"C{i}"
        ret = rows["mean_return"]
        # each progress line averages a few episodes: drawn faint, with a running mean
        # over 20 lines (episodes without an end in a line are skipped)
        kept = np.isfinite(ret)
        for ax, x in ((by_steps, rows["env_steps"][kept] / 1e3),
                      (by_time, rows["wall_s"][kept] / 60)):
            few = kept.sum() < 20     # ('valid' of fewer lines is not a running mean)
            ax.plot(x, ret[kept], color=color, alpha=0.25, lw=0.7,
                    label=f"{label} (each line)" if few else None)
            if not few:
                smooth = np.convolve(ret[kept], np.ones(20) / 20, mode="valid")
                ax.plot(x[19:], smooth, color=color, lw=1.8, label=f"{label} (mean of 20 lines)")
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
    parser.add_argument("--designs", nargs="+", choices=list(DESIGNS), default=list(DESIGNS))
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "l2run_curves")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--project-cpus", type=int, default=56)
    parser.add_argument("--project-days", type=float, default=3.0)
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error(f"--minutes {args.minutes}: allowed: a number above 0")
    if args.project_cpus < 1 or args.project_days <= 0:
        parser.error("--project-cpus: allowed: an integer >= 1; --project-days: above 0")
    results = {d: run(d, args.minutes, args.seed, args.runs) for d in args.designs}
    args.out.mkdir(parents=True, exist_ok=True)
    text = table(results, args.minutes)
    # the scaling model covers the allreduce designs (sync, sync-replay), not apex
    projections = {d: project(run_path(args.runs, d, args.seed), args.project_cpus)
                   for d in results if d in ("ppo", "sac")}
    if projections:
        text += projection_table(results, projections, args.project_days)
    (args.out / "curves.md").write_text(text)
    figure({DESIGNS[design][2]: rows for design, rows in results.items()},
           args.out / "curves.png")
    print(text)


if __name__ == "__main__":
    main()
