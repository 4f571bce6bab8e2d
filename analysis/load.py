"""Sweeps as tidy tables (pandas): every run under a directory, one row per run, and
the aggregates the figures draw.  One run's records are read by
:mod:`mpirl.telemetry.read` (the schema's reader), re-exported here.

    from analysis import load_sweep, load_run
    sweep = load_sweep("runs/sweeps/topologies")
    sweep.runs          # one row per run: design, group, ranks, throughput, efficiency, shares
    sweep.updates       # one row per update per rank per run, with derived columns
    sweep.episodes      # one row per finished episode, with global env steps and time
    scaling(sweep.runs) # mean/std over seeds per group and rank count

Runs are grouped by their whole configuration apart from what only names or places a
run (:data:`NOT_CONFIG`: the seed, the run's name and directory, the resume path) and
the rank count, which is the scaling axis: a group's runs are seeds of one experiment,
and nothing is averaged across groups (so never across envs, budgets or learning
rates).  Each group's ``group_label`` is its design's label plus the fields that tell
it apart from the other groups loaded (:func:`group_labels`).

The derived columns of ``updates`` (``t_run_s``, ``wait_s`` / ``transfer_s``,
``compute_s``, ``busy_s``) are described in :mod:`mpirl.telemetry.read`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from mpirl.telemetry.read import (COMPUTE_PHASES, Run, find_bench, find_runs, load_bench,
                                  load_run)
from mpirl.telemetry.schema import EXPERIENCE_ROLES, PHASES

__all__ = ["COMPUTE_PHASES", "DESIGN", "NOT_CONFIG", "Run", "Sweep", "add_efficiency",
           "breakdown", "config_diff", "find_bench", "find_runs", "group_labels", "group_of",
           "load_bench", "load_run", "load_sweep", "role_breakdown", "run_row", "scaling"]

#: what identifies a design (the first part of every label)
DESIGN = ("topology", "mode")
#: config fields that only name or place a run: runs differing in nothing else are seeds
#: of one experiment
NOT_CONFIG = ("seed", "run_name", "run_dir", "resume")
#: fields that define the task: named in a label wherever they differ between the groups
#: drawn, whatever the designs (other fields are named between groups of one design)
TASK_FIELDS = ("env", "env_arg", "total_steps", "straggler")


def experiment(config: dict) -> dict:
    """The configuration that defines a run's experiment: all of it but :data:`NOT_CONFIG`."""
    return {k: v for k, v in config.items() if k not in NOT_CONFIG}


def group_of(config: dict) -> str:
    """A short stable id of the experiment a run belongs to (equal configurations apart
    from :data:`NOT_CONFIG`, whatever their rank counts)."""
    text = json.dumps(experiment(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def config_diff(a: dict, b: dict) -> dict[str, tuple]:
    """The experiment fields whose values differ: ``{field: (a's, b's)}`` (a field one
    configuration lacks, from an older run, is None there)."""
    a, b = experiment(a), experiment(b)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def shown(v) -> str:
    """A configuration value as labels and comparisons print it: lists joined by commas
    (``none`` when empty), floats in ``%g``."""
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v)) or "none"
    return f"{v:g}" if isinstance(v, float) else str(v)


def group_labels(groups: dict[str, tuple[str, dict]]) -> dict[str, str]:
    """``{group: label}`` for ``{group: (design label, config)}``: the design's label, then
    ``field=value`` for every task field (:data:`TASK_FIELDS`) that differs between any
    two groups (an empty one, no env arguments or no straggler, left out), and for every
    other field that tells the group apart from another of the same design and task.
    (Across tasks a design's settings differ anyway; ``python -m analysis.compare RUN_A
    RUN_B`` prints every difference of two runs.)"""
    configs = {g: experiment(c) for g, (_, c) in groups.items()}
    keys = sorted({k for c in configs.values() for k in c})
    task = [k for k in TASK_FIELDS
            if len({json.dumps(c.get(k), default=str) for c in configs.values()}) > 1]
    labels = {}
    for g, (design, config) in groups.items():
        same_task = [k for k in TASK_FIELDS if k in task]
        peers = [configs[h] for h, (d, _) in groups.items() if d == design and h != g
                 and all(configs[h].get(k) == configs[g].get(k) for k in same_task)]
        named = [k for k in keys if k in task or k not in DESIGN and
                 any(p.get(k) != configs[g].get(k) for p in peers)]
        named = sorted({k for k in named if k not in TASK_FIELDS or config.get(k) != []},
                       key=lambda k: (k not in TASK_FIELDS, keys.index(k)))
        parts = [f"{k}={shown(config.get(k))}" for k in named]
        labels[g] = design + (", " + " ".join(parts) if parts else "")
    return labels


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

    def figure(key: str) -> float:
        """A summary figure; NaN where the run has none (null, or not its design's)."""
        value = run.summary.get(key)
        return np.nan if value is None else value

    wall = run.summary.get("wall_s") or float(u["t_run_s"].max() + u["busy_s"].iloc[-1])
    steps = run.summary.get("env_steps", int(workers["env_steps"].sum()))
    updates = run.summary.get("updates", int(u["update"].max()) if len(u) else 0)
    busy = workers["busy_s"].sum()
    row = {"run": run.name, "topology": cfg["topology"], "mode": cfg["mode"],
           "group": group_of(cfg),
           "ranks": int(run.meta["world_size"]),
           "workers": int(workers["rank"].nunique()),
           "seed": cfg["seed"], "straggler": ",".join(cfg.get("straggler") or []) or "none",
           "env": cfg["env"], "finished": bool(run.summary),
           "oversubscribed": bool(run.meta.get("oversubscribed", False)),
           "env_steps": steps, "updates": updates, "wall_s": wall,
           "env_steps_per_s": steps / wall if wall else np.nan,
           "updates_per_s": updates / wall if wall else np.nan,
           "final_mean_return": figure("final_mean_return"),
           "mean_staleness": figure("mean_staleness"),
           "label": run.label,
           # every rank's bytes sent (topologies and channels alike) per env step
           "bytes_per_env_step": u["bytes_sent"].sum() / steps if steps else np.nan,
           "mean_policy_lag": figure("mean_policy_lag")}
    for col in ("compute_s", "wait_s", "transfer_s", "exchange_s"):
        row[f"{col.removesuffix('_s')}_share"] = workers[col].sum() / busy if busy else np.nan
    return row


def unique_names(dirs: list[Path]) -> list[str]:
    """A name for each run directory: its own name, or where two share it, the shortest
    tail of their paths that tells them apart (``seed1/butterfly-sync-2r-...``)."""
    dirs = [d.resolve() for d in dirs]
    names = []
    for d in dirs:
        depth = 1
        while depth < len(d.parts) and sum(
                o.parts[-depth:] == d.parts[-depth:] for o in dirs) > 1:
            depth += 1
        names.append("/".join(d.parts[-depth:]))
    return names


def load_sweep(*paths: str | Path) -> Sweep:
    """Every run under ``paths`` (sweep directories, run directories, or parents of them)."""
    dirs = find_runs(*paths)
    if not dirs:
        raise FileNotFoundError(f"no run (run.h5) found under {', '.join(map(str, paths))}")
    runs = {}
    for d, name in zip(dirs, unique_names(dirs), strict=True):
        run = load_run(d)
        if name != d.name:                  # another run loaded has the same directory name
            run.alias = name
            for table in (run.updates, run.episodes, run.sim_steps, run.failures):
                table["run"] = name
        runs[name] = run
    table = pd.DataFrame([run_row(r) for r in runs.values()])
    designs = {row.group: (row.label, runs[row.run].config) for row in table.itertuples()}
    table["group_label"] = table["group"].map(group_labels(designs))
    for row in table.itertuples():
        runs[row.run].group_label = row.group_label
    table = add_efficiency(table, {name: r.config for name, r in runs.items()})
    return Sweep(Path(paths[0]), table,
                 pd.concat([r.updates for r in runs.values()], ignore_index=True),
                 pd.concat([r.episodes for r in runs.values()], ignore_index=True), runs)


#: fields in which a 1-rank sync run may differ from the runs it is the base of: on one
#: rank every topology and mode does the same work, and there is nobody to straggle
BASE_FREE = (*DESIGN, "straggler")


def add_efficiency(runs: pd.DataFrame, configs: dict[str, dict]) -> pd.DataFrame:
    """Add ``ideal_env_steps_per_s``, ``efficiency`` (measured / ideal) and
    ``efficiency_base`` (what ideal was scaled from), given every run's configuration.

    Ideal linear scaling multiplies a base throughput *per experience-collecting rank*
    by the run's experience ranks.  The base is measured, never assumed: the mean of the
    1-rank sync runs of the same experiment apart from the design and stragglers
    (:data:`BASE_FREE`) where the table has them (``"1-rank sync"``), else the runs of
    the run's own group at its smallest rank count (``"own N ranks"``: efficiency is 1
    there by construction)."""
    runs = runs.copy()

    def base_key(name: str) -> str:
        return json.dumps({k: v for k, v in experiment(configs[name]).items()
                           if k not in BASE_FREE}, sort_keys=True, default=str)

    keys = runs["run"].map(base_key)
    per_worker = runs["env_steps_per_s"] / runs["workers"]
    single = (runs["ranks"] == 1) & (runs["mode"] == "sync")
    ref = pd.Series(np.nan, index=runs.index)
    base = pd.Series("", index=runs.index, dtype=object)
    for idx, row in runs.iterrows():
        same = single & (keys == keys[idx])
        if same.any():
            ref[idx], base[idx] = per_worker[same].mean(), "1-rank sync"
        else:
            group = runs["group"] == row["group"]
            smallest = group & (runs["ranks"] == runs.loc[group, "ranks"].min())
            ref[idx] = per_worker[smallest].mean()
            n = runs.loc[smallest, "ranks"].iloc[0]
            base[idx] = f"own {n} rank{'s' if n > 1 else ''}"
    runs["ideal_env_steps_per_s"] = ref * runs["workers"]
    runs["efficiency"] = per_worker / ref
    runs["efficiency_base"] = base
    return runs


def scaling(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and std over seeds per group (one experiment) and rank count (finished runs
    only: an unfinished run's throughput is not comparable)."""
    keys = ["group", "group_label", *DESIGN, "straggler", "env", "ranks", "efficiency_base"]
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
    keys = ["group", "group_label", *DESIGN, "straggler", "ranks"]
    merged = per_run.merge(runs[["run", *keys]], on="run")
    return merged.groupby(keys, as_index=False)[parts].mean()


def role_breakdown(updates: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Share of each role's logged time in each phase, per run and role (summed over the
    role's ranks): where an actor, a learner, an inference rank, a worker or a server
    spends its seconds.  Columns: run, label, group_label, seed, ranks, role, one per
    phase."""
    totals = updates.groupby(["run", "role"])[list(PHASES)].sum()
    shares = totals.div(totals.sum(axis=1).replace(0.0, np.nan), axis=0).reset_index()
    return shares.merge(runs[["run", "label", "group_label", "seed", "ranks"]], on="run")
