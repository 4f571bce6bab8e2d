"""``python -m analysis.what_travels SWEEP_DIR -o OUT``: the what-travels study's figures
and results table (``experiments/what_travels.yaml``, ``docs/what_travels.md``).

Per env (CartPole-v1, Delay-v0), into OUT:

``ENV-scaling``    env steps/s, updates/s and efficiency vs ranks, one line per design
                   (mean and std over seeds);
``ENV-bytes``      bytes every rank sent per env step vs ranks;
``ENV-roles``      where each role's time goes, every design at the largest rank count
                   (first seed);
``ENV-lag``        staleness (gradient designs) and policy lag (actor-learner and replay
                   designs) at the largest rank count (first seed), one panel per design;
``ENV-learning``   return vs env steps and vs wall time at 4 ranks (first seed);
``results.md``     the table: design x ranks, throughput (mean +- std over seeds),
                   bytes per env step, mean staleness or policy lag, final mean return.

Every design is drawn by the same figure functions as ``analysis.plot`` (one palette:
a design looks the same everywhere).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from . import figures  # noqa: E402
from .load import load_sweep  # noqa: E402

#: the study's designs in the order of its table
ORDER = ["butterfly/sync", "star/async", "star/quorum", "impala", "seed", "ga3c", "apex",
         "gorila", "butterfly/sync-replay"]


def design_of(label: str) -> str:
    """A run's label without the shard count (gorila's servers vary with ranks)."""
    return "gorila" if label.startswith("gorila") else label


def results_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per env, design and rank count: means (and std of throughput) over seeds."""
    done = runs[runs["finished"]].assign(design=runs["label"].map(design_of))
    lag = done["mean_policy_lag"].where(done["mean_policy_lag"].notna(), done["mean_staleness"])
    done = done.assign(lag=lag)
    table = done.groupby(["env", "design", "ranks"], as_index=False).agg(
        seeds=("seed", "nunique"), steps_per_s=("env_steps_per_s", "mean"),
        steps_per_s_std=("env_steps_per_s", "std"), updates_per_s=("updates_per_s", "mean"),
        bytes_per_step=("bytes_per_env_step", "mean"), lag=("lag", "mean"),
        final_return=("final_mean_return", "mean"))
    table["order"] = table["design"].map({d: i for i, d in enumerate(ORDER)})
    return table.sort_values(["env", "ranks", "order"]).drop(columns="order")


def markdown(table: pd.DataFrame) -> str:
    lines = []
    for env, t in table.groupby("env", sort=False):
        lines += [f"### {env}", "",
                  "| ranks | design | seeds | env steps/s | updates/s | bytes/env step | "
                  "staleness or lag | final return |", "|---|---|---|---|---|---|---|---|"]
        for r in t.itertuples():
            std = 0.0 if pd.isna(r.steps_per_s_std) else r.steps_per_s_std
            lag = "-" if pd.isna(r.lag) else f"{r.lag:.1f}"
            lines.append(f"| {r.ranks} | {r.design} | {r.seeds} | {r.steps_per_s:.0f} +- "
                         f"{std:.0f} | {r.updates_per_s:.1f} | {r.bytes_per_step:.0f} | {lag} | "
                         f"{r.final_return:.1f} |")
        lines.append("")
    return "\n".join(lines)


def env_figures(sweep, env: str, save) -> None:
    runs = sweep.runs[sweep.runs["env"] == env]
    names = set(runs["run"])
    updates = sweep.updates[sweep.updates["run"].isin(names)]
    tag = env.split("-")[0].lower()
    save(figures.scaling_figure(runs), f"{tag}-scaling")
    save(figures.bytes_figure(runs), f"{tag}-bytes")
    first = runs[runs["seed"] == runs["seed"].min()]
    largest = first[first["ranks"] == first["ranks"].max()]
    save(figures.roles_figure(updates[updates["run"].isin(set(largest["run"]))], largest),
         f"{tag}-roles")
    lagged = [sweep.by_name[n] for n in largest.sort_values("label")["run"]
              if sweep.by_name[n].config["mode"] != "sync"]
    if lagged:
        save(figures.staleness_figure(lagged), f"{tag}-lag")
    at4 = [sweep.by_name[n] for n in first[first["ranks"] == 4]["run"]]
    if at4:
        save(figures.learning_figure(at4), f"{tag}-learning")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.what_travels", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", help="the study's sweep directory")
    parser.add_argument("-o", "--out", required=True)
    args = parser.parse_args(argv)
    if not Path(args.sweep).is_dir():
        print(f"analysis.what_travels: error: {args.sweep}: no such directory", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sweep = load_sweep(args.sweep)

    def save(fig, name: str) -> None:
        fig.savefig(out / f"{name}.png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        print(f"wrote {out / name}.png")

    for env in sorted(sweep.runs["env"].unique()):
        env_figures(sweep, env, save)
    table = results_table(sweep.runs)
    (out / "results.md").write_text(markdown(table))
    print(markdown(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
