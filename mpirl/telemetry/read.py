"""Reading the logs back: one run directory as tidy tables, and benchmark files.

The reader of the schema in :mod:`mpirl.telemetry.schema`, for everything that needs a
run's records: ``analysis`` (figures, sweeps), the simulator's validation, resuming a
log.  Files open with plain ``h5py.File(path, "r")``, also after a crash (see
:mod:`mpirl.telemetry.h5log`); rows a kill left unwritten (the fill value) are dropped.

Derived columns of :attr:`Run.updates` (everything else is the log's own
``UPDATE_DTYPE``):

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

import h5py
import numpy as np
import pandas as pd

# opening files (also live or crashed ones) is pandas-free, for the ranks' own use
from .access import LIVE_READ_DEADLINE_S, open_h5, open_run, read_h5, rows_until  # noqa: F401
from .. import registry
from .schema import (BENCH_KIND, EPISODE_DTYPE, EXPERIENCE_ROLES,
                     FAILURE_DTYPE, OLDEST_READABLE, PHASES, SCHEMA_VERSION, SIM_STEP_DTYPE,
                     UPDATE_DTYPE, upgrade, written)

COMPUTE_PHASES = tuple(p for p in PHASES if p != "exchange_s")


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
    #: impala/seed/ga3c: the policy lag of every unroll learned from (policy_lag.npy)
    policy_lag: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: one row per env step of envs that time their simulator: run, rank, update, env, sim_s
    sim_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: one row per rank failure a survivor lived through (--on-failure shrink):
    #: run, rank, update, t_s, unix_s, detect_s, recover_s, size_after, failed
    failures: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: set by ``analysis.load_sweep``: the design's label and the fields that tell this
    #: run's experiment apart from the others loaded with it
    group_label: str = ""
    #: set by ``analysis.load_sweep`` where two runs loaded together share a directory
    #: name: the shortest tail of the path that tells them apart
    alias: str = ""

    @property
    def name(self) -> str:
        return self.alias or self.path.name

    @property
    def title(self) -> str:
        """What figures call the run: its group's label where a sweep set one, else its
        design's label."""
        return self.group_label or self.label

    @property
    def label(self) -> str:
        """``topology/mode``; the actor-learner designs by mode alone (their topology
        only serves impala's several learners), the sharded servers with their count."""
        mode, servers = self.config["mode"], self.config.get("servers", 1)
        learners, design = self.config.get("learners", 1), registry.design(mode)
        if "servers" in design.options and servers > 1:
            return f"{mode} {servers} servers"
        if design.topology_use in ("allreduce", "star"):
            return f"{self.config['topology']}/{mode}"
        if design.topology_use == "learners" and learners > 1:
            return f"{mode} x{learners} {self.config['topology']}"
        return mode


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


def _read_meta(path: Path) -> dict:
    meta = read_h5(path / "run.h5", lambda f: {k: (v.item() if hasattr(v, "item") else v)
                                                for k, v in f.attrs.items()})
    schema = meta.get("schema", 0)
    if not OLDEST_READABLE <= schema <= SCHEMA_VERSION:
        raise ValueError(f"{path}/run.h5 has log schema {schema}; this reader reads schemas "
                         f"{OLDEST_READABLE}-{SCHEMA_VERSION}")
    for key in ("config_json", "hostnames_json", "cores_per_node_json", "ranks_failed_json",
                "attempts_json"):
        if key in meta:
            meta[key.removesuffix("_json")] = json.loads(meta.pop(key))
    return meta


def _read_rank(path: Path, rank: int) -> dict[str, pd.DataFrame]:
    """One rank file's tables, each with a ``rank`` column (and its role, start time)."""
    return read_h5(path / f"rank{rank:04d}.h5", lambda g: _rank_tables(g, rank))


def _rank_tables(g: h5py.File, rank: int) -> dict[str, pd.DataFrame]:
    start, role = g.attrs["start_unix_s"], g.attrs["role"]
    u = pd.DataFrame(written(upgrade(g["updates"][...], UPDATE_DTYPE)))
    u.insert(0, "rank", rank)
    u.insert(1, "role", role)
    u["t_unix_s"] = start + u["t_s"]
    u["exchange_unix_s"] = start + u["exchange_t_s"]
    e = pd.DataFrame(written(upgrade(g["episodes"][...], EPISODE_DTYPE)))
    e.insert(0, "rank", rank)
    e["t_unix_s"] = start + e["t_s"]
    sim = pd.DataFrame(written(g["sim_steps"][...]) if "sim_steps" in g
                       else np.zeros(0, SIM_STEP_DTYPE))   # schema 1: absent
    sim.insert(0, "rank", rank)
    fail = pd.DataFrame(written(g["failures"][...]) if "failures" in g
                        else np.zeros(0, FAILURE_DTYPE))   # schema 1-2: absent
    fail["failed"] = fail["failed"].map(bytes.decode)
    fail.insert(0, "rank", rank)
    return {"updates": u, "episodes": e, "sim_steps": sim, "failures": fail}


def load_run(path: str | Path) -> Run:
    """Read one run directory (also one that is still running or crashed)."""
    path = Path(path)
    meta = _read_meta(path)
    config = meta["config"]
    ranks = [_read_rank(path, r) for r in range(int(meta["world_size"]))]
    tables = {name: pd.concat([r[name] for r in ranks], ignore_index=True)
              for name in ("updates", "episodes", "sim_steps", "failures")}
    summary_path = path / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    staleness_path = path / "staleness.npy"
    staleness = np.load(staleness_path) if staleness_path.is_file() else np.zeros(0, np.int64)
    lag_path = path / "policy_lag.npy"
    lag = np.load(lag_path) if lag_path.is_file() else np.zeros(0, np.int64)
    updates = _derive(tables["updates"], config["mode"])
    episodes = tables["episodes"]
    t0 = min([updates["t_unix_s"].min()] +
             ([episodes["t_unix_s"].min()] if len(episodes) else []))
    updates["t_run_s"] = updates["t_unix_s"] - t0
    episodes = _episode_progress(episodes, updates, t0)
    out = {"updates": updates, "episodes": episodes, "sim_steps": tables["sim_steps"],
           "failures": tables["failures"]}
    for table in out.values():
        table.insert(0, "run", path.name)
    return Run(path, meta, config, summary, out["updates"], out["episodes"], staleness, lag,
               out["sim_steps"], out["failures"])


def _derive(u: pd.DataFrame, mode: str) -> pd.DataFrame:
    u["other_s"] = u["other_s"].fillna(0.0)          # schema 1 had no other_s
    u["compute_s"] = u[list(COMPUTE_PHASES)].sum(axis=1)
    u["busy_s"] = u["compute_s"] + u["exchange_s"]
    if registry.design(mode).topology_use == "allreduce" and u["wait_s"].isna().any():
        # an old log of an allreduce design: its waits from when each rank entered
        last_entry = u.groupby("update")["exchange_unix_s"].transform("max")
        derived = (last_entry - u["exchange_unix_s"]).clip(lower=0.0)
        u["wait_s"] = u["wait_s"].fillna(np.minimum(derived, u["exchange_s"]))
    u["wait_s"] = u["wait_s"].fillna(0.0)
    u["transfer_s"] = (u["exchange_s"] - u["wait_s"]).clip(lower=0.0)
    return u


def _episode_progress(e: pd.DataFrame, u: pd.DataFrame, t0: float) -> pd.DataFrame:
    """Add ``t_run_s`` and ``env_steps`` (env steps taken by all ranks by then) to episodes."""
    e["t_run_s"] = e["t_unix_s"] - t0
    collected = u[u["role"].isin(EXPERIENCE_ROLES)].sort_values("t_unix_s")
    if len(e) and len(collected):
        # an update's env steps are counted from the end of its rollout, roughly its start
        # plus its env+forward time (+ waiting for actions, seed/ga3c); good to a
        # fraction of one update
        done_at = collected["t_unix_s"] + collected["env_s"] + collected["forward_s"] \
            + collected["infer_wait_s"]
        order = np.argsort(done_at.to_numpy())
        steps = np.cumsum(collected["env_steps"].to_numpy()[order])
        idx = np.searchsorted(done_at.to_numpy()[order], e["t_unix_s"].to_numpy(), side="right")
        e["env_steps"] = np.where(idx > 0, steps[np.maximum(idx - 1, 0)], 0)
    else:
        e["env_steps"] = 0
    return e.sort_values("t_unix_s", ignore_index=True)


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
    size, with ``op``, ``ranks``, ``oversubscribed``, ``nodes`` (hosts the ranks ran on),
    ``rate`` (an emulated cluster's link cap, else "") and ``file`` columns."""
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
            cluster = json.loads(f.attrs.get("cluster_json", "{}"))
            t["nodes"] = len(cluster.get("ranks_on", {})) or 1
            t["rate"] = cluster.get("rate", "")     # an emulated cluster's link cap
            t["file"] = str(path)
        tables.append(t)
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
