"""Sweeps as tidy tables (pandas): every run under a directory, one row per run, and
the aggregates the figures draw.  One run's records are read by
:mod:`mpirl.telemetry.read` (the schema's reader), re-exported here.

    from analysis import load_sweep, load_run
    sweep = load_sweep("runs/sweeps/topologies")
    sweep.runs          # one row per run: design, ranks, throughput, efficiency, shares
    sweep.updates       # one row per update per rank per run, with derived columns
    sweep.episodes      # one row per finished episode, with global env steps and time
    scaling(sweep.runs) # mean/std over seeds per design and rank count

The derived columns of ``updates`` (``t_run_s``, ``wait_s`` / ``transfer_s``,
``compute_s``, ``busy_s``) are described in :mod:`mpirl.telemetry.read`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from mpirl.telemetry.read import (COMPUTE_PHASES, Run, find_bench, find_runs, load_bench,
                                  load_run)
from mpirl.telemetry.schema import EXPERIENCE_ROLES, PHASES

__all__ = ["COMPUTE_PHASES", "DESIGN", "Run", "Sweep", "add_efficiency", "breakdown",
           "find_bench", "find_runs", "load_bench", "load_run", "load_sweep", "role_breakdown",
           "run_row", "scaling"]

#: what identifies a design in tables and legends.
DESIGN = ("topology", "mode")


@dataclass
class Sweep:
    """Every run found under a directory."""

    path: Path
    runs: pd.DataFrame
    updates: pd.DataFrame
    episodes: pd.DataFrame
    by_name: dict[str, Run]


def run_row(run: Run) -> dict:
    """The one-line description of a run used by ``Sweep.runs``."""
    u, cfg = run.updates, run.config
    workers = u[u["role"].isin(EXPERIENCE_ROLES)]
    wall = run.summary.get("wall_s") or float(u["t_run_s"].max() + u["busy_s"].iloc[-1])
    steps = run.summary.get("env_steps", int(workers["env_steps"].sum()))
    updates = run.summary.get("updates", int(u["update"].max()) if len(u) else 0)
    busy = workers["busy_s"].sum()
    row = {"run": run.name, "topology": cfg["topology"], "mode": cfg["mode"],
           "ranks": int(run.meta["world_size"]),
           "workers": int(workers["rank"].nunique()),
           "seed": cfg["seed"], "straggler": ",".join(cfg.get("straggler") or []) or "none",
           "env": cfg["env"], "finished": bool(run.summary),
           "oversubscribed": bool(run.meta.get("oversubscribed", False)),
           "env_steps": steps, "updates": updates, "wall_s": wall,
           "env_steps_per_s": steps / wall if wall else np.nan,
           "updates_per_s": updates / wall if wall else np.nan,
           "final_mean_return": run.summary.get("final_mean_return", np.nan),
           "mean_staleness": run.summary.get("mean_staleness", np.nan),
           "label": run.label,
           # every rank's bytes sent (topologies and channels alike) per env step
           "bytes_per_env_step": u["bytes_sent"].sum() / steps if steps else np.nan,
           "mean_policy_lag": run.summary.get("mean_policy_lag", np.nan)}
    for col in ("compute_s", "wait_s", "transfer_s", "exchange_s"):
        row[f"{col.removesuffix('_s')}_share"] = workers[col].sum() / busy if busy else np.nan
    return row


def load_sweep(*paths: str | Path) -> Sweep:
    """Every run under ``paths`` (sweep directories, run directories, or parents of them)."""
    dirs = find_runs(*paths)
    if not dirs:
        raise FileNotFoundError(f"no run (run.h5) found under {', '.join(map(str, paths))}")
    runs = {d.name: load_run(d) for d in dirs}
    table = pd.DataFrame([run_row(r) for r in runs.values()])
    table = add_efficiency(table)
    return Sweep(Path(paths[0]), table,
                 pd.concat([r.updates for r in runs.values()], ignore_index=True),
                 pd.concat([r.episodes for r in runs.values()], ignore_index=True), runs)


def add_efficiency(runs: pd.DataFrame) -> pd.DataFrame:
    """Add ``ideal_env_steps_per_s`` and ``efficiency`` (measured / ideal).

    Ideal linear scaling multiplies a reference throughput *per experience-collecting
    rank* by the run's experience ranks.  The reference is the mean 1-rank sync run of
    the same env and straggler setting when the table has one (on one rank every
    topology does the same work), else the design's own smallest rank count."""
    runs = runs.copy()
    per_worker = runs["env_steps_per_s"] / runs["workers"]
    ref = pd.Series(np.nan, index=runs.index)
    single = runs[(runs["ranks"] == 1) & (runs["mode"] == "sync")]
    for idx, row in runs.iterrows():
        same = single[(single["env"] == row["env"]) & (single["straggler"] == "none")]
        if len(same):
            ref[idx] = (same["env_steps_per_s"] / same["workers"]).mean()
        else:
            design = runs[(runs["topology"] == row["topology"]) & (runs["mode"] == row["mode"])
                          & (runs["env"] == row["env"]) & (runs["straggler"] == row["straggler"])]
            smallest = design[design["ranks"] == design["ranks"].min()]
            ref[idx] = (smallest["env_steps_per_s"] / smallest["workers"]).mean()
    runs["ideal_env_steps_per_s"] = ref * runs["workers"]
    runs["efficiency"] = per_worker / ref
    return runs


def scaling(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and std over seeds per design, straggler setting and rank count (finished
    runs only: an unfinished run's throughput is not comparable)."""
    keys = [*DESIGN, "straggler", "ranks"]
    agg = runs[runs["finished"]].groupby(keys, as_index=False).agg(
        seeds=("seed", "nunique"),
        env_steps_per_s=("env_steps_per_s", "mean"),
        env_steps_per_s_std=("env_steps_per_s", "std"),
        updates_per_s=("updates_per_s", "mean"),
        updates_per_s_std=("updates_per_s", "std"),
        ideal_env_steps_per_s=("ideal_env_steps_per_s", "mean"),
        efficiency=("efficiency", "mean"),
        oversubscribed=("oversubscribed", "any"))
    return agg.fillna({"env_steps_per_s_std": 0.0, "updates_per_s_std": 0.0})


def breakdown(updates: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Mean seconds per update of each phase, worker ranks, per design and rank count;
    the exchange split into wait and transfer."""
    parts = [p for p in COMPUTE_PHASES] + ["wait_s", "transfer_s"]
    workers = updates[updates["role"].isin(EXPERIENCE_ROLES)]
    per_run = workers.groupby("run")[parts].mean().reset_index()
    merged = per_run.merge(runs[["run", *DESIGN, "straggler", "ranks"]], on="run")
    return merged.groupby([*DESIGN, "straggler", "ranks"], as_index=False)[parts].mean()


def role_breakdown(updates: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Share of each role's logged time in each phase, per run and role (summed over the
    role's ranks): where an actor, a learner, an inference rank, a worker or a server
    spends its seconds.  Columns: run, label, ranks, role, one per phase."""
    totals = updates.groupby(["run", "role"])[list(PHASES)].sum()
    shares = totals.div(totals.sum(axis=1).replace(0.0, np.nan), axis=0).reset_index()
    return shares.merge(runs[["run", "label", "ranks"]], on="run")
