"""Runs and sweeps as tidy tables (pandas), read through ``mpirl.h5log``'s schema.

    from analysis import load_sweep, load_run
    sweep = load_sweep("runs/sweeps/topologies")
    sweep.runs          # one row per run: design, ranks, throughput, efficiency, shares
    sweep.updates       # one row per update per rank per run, with derived columns
    sweep.episodes      # one row per finished episode, with global env steps and time
    scaling(sweep.runs) # mean/std over seeds per design and rank count

Derived columns of ``updates`` (everything else is the log's own ``UPDATE_DTYPE``):

``run``, ``rank``, ``role``
    which run and rank the row came from; ``role`` is ``worker`` or ``server``.
``t_run_s``
    start of the update in seconds since the earliest rank of the run started
    (ranks' clocks are the hosts' clocks: exact on one node, NTP-close across nodes).
``wait_s``, ``transfer_s``
    the exchange split into waiting for other ranks and moving data.  Where the topology
    measured it (parameter server), ``wait_s`` is its own figure.  For a blocking
    collective (sync mode) no rank can finish before the last one has entered, so
    ``wait_s = max over ranks of exchange entry - this rank's entry`` for the same
    update (Score-P's "wait at N x N"), clipped to ``[0, exchange_s]``; the rest is
    ``transfer_s``.  This needs no extra message during the run.
``compute_s``
    env, forward, straggle, backward, optimizer and other seconds: all but the exchange.
``busy_s``
    ``compute_s + exchange_s``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

import h5py

from mpirl.h5log import (BENCH_KIND, EPISODE_DTYPE, FAILURE_DTYPE, PHASES, SIM_STEP_DTYPE,
                         UPDATE_DTYPE, open_run)

COMPUTE_PHASES = tuple(p for p in PHASES if p != "exchange_s")
#: what identifies a design in tables and legends.
DESIGN = ("topology", "mode")


@dataclass
class Run:
    """One run directory: its metadata and its records."""

    path: Path
    meta: dict                      # run.h5 attributes (config_json etc. decoded)
    config: dict
    summary: dict                   # summary.json ({} if the run did not finish)
    updates: pd.DataFrame
    episodes: pd.DataFrame
    staleness: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: one row per env step of envs that time their simulator: run, rank, update, env, sim_s
    sim_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: one row per rank failure a survivor lived through (schema 3, --on-failure shrink):
    #: run, rank, update, t_s, unix_s, detect_s, recover_s, size_after, failed
    failures: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def label(self) -> str:
        return f"{self.config['topology']}/{self.config['mode']}"


@dataclass
class Sweep:
    """Every run found under a directory."""

    path: Path
    runs: pd.DataFrame
    updates: pd.DataFrame
    episodes: pd.DataFrame
    by_name: dict[str, Run]


def find_runs(*paths: str | Path) -> list[Path]:
    """Run directories (those holding a ``run.h5``) at or below each of ``paths``,
    leaving out runs set aside as incomplete by the sweep launcher."""
    found = []
    for path in map(Path, paths):
        if (path / "run.h5").is_file():
            found.append(path)
            continue
        if not path.is_dir():
            raise FileNotFoundError(f"{path}: no such run or sweep directory")
        found += sorted(p.parent for p in path.rglob("run.h5") if "incomplete" not in p.parts)
    return found


def load_run(path: str | Path) -> Run:
    """Read one run directory (also one that is still running or crashed)."""
    path = Path(path)
    with open_run(path / "run.h5") as f:
        meta = {k: (v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()}
        if meta.get("schema", 0) > 3 or meta.get("schema", 0) < 1:
            raise ValueError(f"{path}/run.h5 has log schema {meta.get('schema')}; this "
                             "analysis reads schemas 1-3")
        config = json.loads(meta["config_json"])
        for key in ("config_json", "hostnames_json", "cores_per_node_json",
                    "ranks_failed_json"):
            if key in meta:
                meta[key.removesuffix("_json")] = json.loads(meta.pop(key))
        ups, eps, sims, fails = [], [], [], []
        for r in range(int(meta["world_size"])):
            g = f[f"ranks/{r:04d}"]
            u = pd.DataFrame(_upgrade(g["updates"][...], UPDATE_DTYPE))
            u.insert(0, "rank", r)
            u.insert(1, "role", g.attrs["role"])
            u["t_unix_s"] = g.attrs["start_unix_s"] + u["t_s"]
            u["exchange_unix_s"] = g.attrs["start_unix_s"] + u["exchange_t_s"]
            e = pd.DataFrame(_upgrade(g["episodes"][...], EPISODE_DTYPE))
            e.insert(0, "rank", r)
            e["t_unix_s"] = g.attrs["start_unix_s"] + e["t_s"]
            ups.append(u)
            eps.append(e)
            if "sim_steps" in g:                  # schema 2 files from before it: absent
                sim = pd.DataFrame(g["sim_steps"][...])
                sim.insert(0, "rank", r)
                sims.append(sim)
            if "failures" in g:                   # schema 3
                fail = pd.DataFrame(g["failures"][...])
                fail["failed"] = fail["failed"].map(bytes.decode)
                fail.insert(0, "rank", r)
                fails.append(fail)
    summary_path = path / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    staleness_path = path / "staleness.npy"
    staleness = np.load(staleness_path) if staleness_path.is_file() else np.zeros(0, np.int64)
    updates = _derive(pd.concat(ups, ignore_index=True), config["mode"])
    t0 = min([updates["t_unix_s"].min()] + [e["t_unix_s"].min() for e in eps if len(e)])
    updates["t_run_s"] = updates["t_unix_s"] - t0
    episodes = _episode_progress(pd.concat(eps, ignore_index=True), updates, t0)
    if not sims:
        sims = [pd.DataFrame(np.zeros(0, SIM_STEP_DTYPE))]
        sims[0].insert(0, "rank", np.zeros(0, dtype=np.int64))
    sim_steps = pd.concat(sims, ignore_index=True)
    failures = pd.concat(fails, ignore_index=True) if fails else \
        pd.DataFrame(columns=["rank", *FAILURE_DTYPE.names])
    for table in (updates, episodes, sim_steps, failures):
        table.insert(0, "run", path.name)
    return Run(path, meta, config, summary, updates, episodes, staleness, sim_steps,
               failures)


def _upgrade(rows: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Rows of an older schema as ``dtype``: fields it lacks are NaN (floats) or -1."""
    if rows.dtype == dtype:
        return rows
    out = np.empty(len(rows), dtype=dtype)
    for name in dtype.names:
        if name in rows.dtype.names:
            out[name] = rows[name]
        else:
            out[name] = np.nan if dtype[name].kind == "f" else -1
    return out


def _derive(u: pd.DataFrame, mode: str) -> pd.DataFrame:
    u["other_s"] = u["other_s"].fillna(0.0)          # schema 1 had no other_s
    u["compute_s"] = u[list(COMPUTE_PHASES)].sum(axis=1)
    u["busy_s"] = u["compute_s"] + u["exchange_s"]
    if mode == "sync" and u["wait_s"].isna().any():
        last_entry = u.groupby("update")["exchange_unix_s"].transform("max")
        derived = (last_entry - u["exchange_unix_s"]).clip(lower=0.0)
        u["wait_s"] = u["wait_s"].fillna(np.minimum(derived, u["exchange_s"]))
    u["wait_s"] = u["wait_s"].fillna(0.0)
    u["transfer_s"] = (u["exchange_s"] - u["wait_s"]).clip(lower=0.0)
    return u


def _episode_progress(e: pd.DataFrame, u: pd.DataFrame, t0: float) -> pd.DataFrame:
    """Add ``t_run_s`` and ``env_steps`` (env steps taken by all ranks by then) to episodes."""
    e["t_run_s"] = e["t_unix_s"] - t0
    collected = u[u["role"] == "worker"].sort_values("t_unix_s")
    if len(e) and len(collected):
        # an update's env steps are counted from the end of its rollout, roughly its start
        # plus its env+forward time; good to a fraction of one update
        done_at = collected["t_unix_s"] + collected["env_s"] + collected["forward_s"]
        order = np.argsort(done_at.to_numpy())
        steps = np.cumsum(collected["env_steps"].to_numpy()[order])
        idx = np.searchsorted(done_at.to_numpy()[order], e["t_unix_s"].to_numpy(), side="right")
        e["env_steps"] = np.where(idx > 0, steps[np.maximum(idx - 1, 0)], 0)
    else:
        e["env_steps"] = 0
    return e.sort_values("t_unix_s", ignore_index=True)


def run_row(run: Run) -> dict:
    """The one-line description of a run used by ``Sweep.runs``."""
    u, cfg = run.updates, run.config
    workers = u[u["role"] == "worker"]
    wall = run.summary.get("wall_s") or float(u["t_run_s"].max() + u["busy_s"].iloc[-1])
    steps = run.summary.get("env_steps", int(workers["env_steps"].sum()))
    updates = run.summary.get("updates", int(u["update"].max()) if len(u) else 0)
    busy = workers["busy_s"].sum()
    row = {"run": run.name, "topology": cfg["topology"], "mode": cfg["mode"],
           "ranks": int(run.meta["world_size"]),
           "workers": int(run.meta["world_size"]) - (cfg["mode"] != "sync"),
           "seed": cfg["seed"], "straggler": ",".join(cfg.get("straggler") or []) or "none",
           "env": cfg["env"], "finished": bool(run.summary),
           "oversubscribed": bool(run.meta.get("oversubscribed", False)),
           "env_steps": steps, "updates": updates, "wall_s": wall,
           "env_steps_per_s": steps / wall if wall else np.nan,
           "updates_per_s": updates / wall if wall else np.nan,
           "final_mean_return": run.summary.get("final_mean_return", np.nan),
           "mean_staleness": run.summary.get("mean_staleness", np.nan)}
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
    workers = updates[updates["role"] == "worker"]
    per_run = workers.groupby("run")[parts].mean().reset_index()
    merged = per_run.merge(runs[["run", *DESIGN, "straggler", "ranks"]], on="run")
    return merged.groupby([*DESIGN, "straggler", "ranks"], as_index=False)[parts].mean()


def find_bench(*paths: str | Path) -> list[Path]:
    """``mpirl.bench --out`` files (HDF5 with ``kind = mpirl.bench``) at or below ``paths``."""
    found = []
    for path in map(Path, paths):
        candidates = [path] if path.is_file() else sorted(path.rglob("*.h5"))
        for candidate in candidates:
            if candidate.name == "run.h5" or candidate.name.startswith("rank"):
                continue
            try:
                with h5py.File(candidate, "r") as f:
                    if f.attrs.get("kind") == BENCH_KIND:
                        found.append(candidate)
            except OSError:
                continue       # not HDF5, or a file still being written
    return found


def load_bench(*paths: str | Path) -> pd.DataFrame:
    """Every benchmark result under ``paths`` as one table: one row per file, topology and
    size, with ``op``, ``ranks``, ``oversubscribed`` and ``file`` columns."""
    tables = []
    for path in find_bench(*paths):
        with h5py.File(path, "r") as f:
            t = pd.DataFrame(f["results"][...])
            t["topology"] = t["topology"].str.decode("ascii")
            if "op" in t:
                t["op"] = t["op"].str.decode("ascii")
            else:                                       # files from before the op column
                t["op"] = f.attrs["op"]
            t["ranks"] = int(f.attrs["world_size"])
            t["oversubscribed"] = bool(f.attrs["oversubscribed"])
            t["file"] = str(path)
        tables.append(t)
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
