"""``python -m analysis.plot RUN_OR_SWEEP_DIR ... -o OUT``: the figures of a study, PNG + PDF.

Reads every run (a directory with ``run.h5``) and every microbenchmark file
(``mpirl.bench --out FILE.h5``) at or below the given paths and writes, into OUT:

``scaling``        env steps/s and updates/s vs ranks, one line per group, with ideal
                   linear scaling and parallel efficiency from each group's measured base
                   (needs runs at 2+ rank counts);
``timeline-RUN``   compute / waiting / transfer along time, rank by rank, for a window
                   of updates of the largest run of each mode (``--timeline RUN`` to choose);
``breakdown``      mean seconds per update stacked by phase, per group x ranks;
``staleness``      histogram of applied gradients' staleness (async / quorum runs);
``learning``       return vs env steps and vs wall-clock, one line per run;
``losses``         policy loss, value loss, entropy and approximate KL per gradient;
``sim_steps``      distribution of per-step simulator time (L2Run-v0, Delay-v0 runs);
``latency``        collective latency and bandwidth vs message size (benchmark files).

Runs are grouped by their whole configuration apart from the seed and the run's name
(``analysis.load``): seeds of one experiment are averaged, nothing else is, and each
group is labelled with its design and the fields that tell it apart from the others.
A figure whose data is absent is skipped with a line saying why; a summary table of
the runs is written as ``runs.csv``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")     # files only, no screen needed
import matplotlib.pyplot as plt  # noqa: E402

from . import figures  # noqa: E402
from .load import find_bench, find_runs, load_bench, load_sweep, scaling  # noqa: E402


def pick_timeline_runs(sweep, names: list[str] | None) -> list:
    """The named runs, else per mode the run with the most ranks (a straggler run first)."""
    if names:
        missing = [n for n in names if n not in sweep.by_name]
        if missing:
            raise SystemExit(f"analysis.plot: error: --timeline {', '.join(missing)}: no such "
                             f"run; runs: {', '.join(sorted(sweep.by_name))}")
        return [sweep.by_name[n] for n in names]
    picked = []
    runs = sweep.runs[sweep.runs["ranks"] > 1]
    for _, d in runs.groupby("mode"):
        d = d.assign(has_straggler=d["straggler"] != "none")
        best = d.sort_values(["ranks", "has_straggler"], ascending=False).iloc[0]
        picked.append(sweep.by_name[best["run"]])
    return picked


def run_figures(sweep, args, out: Path, save, skipped: list[str]) -> None:
    """Every figure of the runs (``save(fig, name)``); why one is left out goes to
    ``skipped``."""
    runs = list(sweep.by_name.values())
    sweep.runs.to_csv(out / "runs.csv", index=False)
    if sweep.runs["ranks"].nunique() >= 2:
        save(figures.scaling_figure(sweep.runs), "scaling")
    else:
        skipped.append("scaling: runs at one rank count only")
    for run in pick_timeline_runs(sweep, args.timeline):
        save(figures.timeline_figure(run, tuple(args.window) if args.window else None),
             f"timeline-{run.name}")
    if not args.timeline and not (sweep.runs["ranks"] > 1).any():
        skipped.append("timeline: no run with more than one rank")
    save(figures.breakdown_figure(sweep.updates, sweep.runs), "breakdown")
    save(figures.roles_figure(sweep.updates, sweep.runs), "roles")
    save(figures.bytes_figure(sweep.runs), "bytes")
    optional = [
        ("staleness", [r for r in runs if r.config["mode"] != "sync"],
         figures.staleness_figure, "no async, quorum, impala, seed or ga3c run"),
        ("learning", runs, figures.learning_figure, "no run"),
        ("losses", [r for r in runs if figures.has_losses(r)], figures.losses_figure,
         "no run that logged its losses (schema 4)"),
        ("sim_steps", [r for r in runs if len(r.sim_steps)], figures.sim_steps_figure,
         "no run of an env that times its steps (L2Run, Delay)")]
    for name, chosen, draw, why_not in optional:
        if chosen:
            save(draw(chosen), name)
        else:
            skipped.append(f"{name}: {why_not}")
    print(scaling(sweep.runs)[["group_label", "ranks", "seeds", "env_steps_per_s",
                               "updates_per_s", "efficiency", "efficiency_base"]]
          .to_string(index=False))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.plot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="run directories, sweep directories, or "
                                                 "benchmark .h5 files (searched recursively)")
    parser.add_argument("-o", "--out", required=True, help="directory for the figures")
    parser.add_argument("--formats", nargs="+", default=["png", "pdf"],
                        choices=["png", "pdf", "svg"], help="file formats (default png pdf)")
    parser.add_argument("--timeline", nargs="+", metavar="RUN",
                        help="runs (directory names) to draw timelines of")
    parser.add_argument("--window", nargs=2, type=float, metavar=("FROM_S", "TO_S"),
                        help="timeline window in seconds since the run started")
    args = parser.parse_args(argv)
    for path in args.paths:
        if not Path(path).exists():
            print(f"analysis.plot: error: {path}: no such file or directory", file=sys.stderr)
            return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written, skipped = [], []

    def save(fig, name: str) -> None:
        for fmt in args.formats:
            path = out / f"{name}.{fmt}"
            fig.savefig(path, dpi=130, bbox_inches="tight")
            written.append(path)
        plt.close(fig)

    run_dirs = [p for p in args.paths if Path(p).is_dir()]
    if find_runs(*run_dirs):
        run_figures(load_sweep(*run_dirs), args, out, save, skipped)
    else:
        skipped.append("scaling, timeline, breakdown, staleness, learning, losses: no run "
                       "(run.h5)")
    if find_bench(*args.paths):
        save(figures.latency_figure(load_bench(*args.paths)), "latency")
    else:
        skipped.append("latency: no benchmark file (python -m mpirl.bench --out FILE.h5)")
    for path in written:
        print(f"wrote {path}")
    for why in skipped:
        print(f"skipped {why}")
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
