"""Every second of every rank, in HDF5: the run log's schema, writer and reader.

Layout of a run directory (the schema, shared by the writer here and by ``analysis``):

``run.h5`` (written by rank 0)
    attrs: ``schema`` (int), ``mpirl_version``, ``git_commit``, ``mpi_library``,
    ``world_size``, ``mode``, ``topology``, ``env``, ``config_json`` (the resolved
    configuration), ``hostnames_json`` (one per rank), ``cores_per_node_json``,
    ``oversubscribed`` (bool: ranks outnumbered cores on some node; timings suspect),
    ``scheduler_json`` (Slurm job id, name, nodes... when run under Slurm; else ``{}``),
    ``start_unix_s``, ``end_unix_s`` (absent if the run did not finish),
    ``gradients_sent`` / ``gradients_applied`` / ``gradients_dropped`` (at the end),
    ``ranks_failed_json`` (launch ranks lost and survived, ``--on-failure shrink``).
    At the end these are written by the lowest surviving rank.
    ``/ranks/NNNN``: an HDF5 external link to ``rankNNNN.h5:/`` for every rank, so
    analysis opens this one file and reaches every rank's data.

``rankNNNN.h5`` (written by rank NNNN alone; no traffic between ranks)
    attrs: ``rank``, ``hostname``, ``role`` (``worker`` or ``server``), ``start_unix_s``.
    ``updates``: one row per update this rank took part in (:data:`UPDATE_DTYPE`).
    ``episodes``: one row per finished episode (:data:`EPISODE_DTYPE`).
    ``sim_steps``: one row per env step, for envs that time their simulator
    (:data:`SIM_STEP_DTYPE`; empty otherwise).
    ``failures``: one row per rank failure this rank survived (:data:`FAILURE_DTYPE`;
    schema 3; empty unless ``--on-failure shrink`` carried the run on).

Times are seconds; ``t_s`` columns count from the rank's ``start_unix_s``.  Datasets
are chunked and resizable; rows are buffered in memory and every table is appended
and flushed each ``flush_every`` updates (and at the end; a table whose buffer fills
earlier is flushed then).  The files are
opened in SWMR mode (single writer, multiple readers): a crash or SIGKILL loses at most
the rows not yet flushed, the file stays readable, and analysis can read it while the
run is still going.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np

SCHEMA_VERSION = 3

#: HDF5 file-format bounds for every file mpirl writes: the 1.10 format is the oldest
#: with SWMR, and capping it there keeps the files readable by HDF5 1.10's tools
#: (Debian's ``h5dump``) although h5py's own library (HDF5 2.x) would write newer ones.
LIBVER = ("v110", "v110")

#: per-update record; ``-1`` where a field does not apply (e.g. staleness in sync mode).
#: Schema 2 added ``exchange_t_s``, ``wait_s`` and ``other_s``.
UPDATE_DTYPE = np.dtype([
    ("update", "i8"),          # this rank's update counter (server: parameter version)
    ("t_s", "f8"),             # start of the update, seconds since the rank's start
    ("env_s", "f8"),           # stepping environments
    ("forward_s", "f8"),       # policy/value inference while collecting
    ("straggle_s", "f8"),      # injected slowdown (--straggler)
    ("backward_s", "f8"),      # loss and backward pass
    ("exchange_s", "f8"),      # the topology call (waiting for others + moving data)
    ("exchange_t_s", "f8"),    # when the exchange began, seconds since the rank's start
    ("wait_s", "f8"),          # part of exchange_s spent waiting for a peer's message;
                               # NaN where the topology cannot tell (collectives: analysis
                               # derives it from every rank's exchange_t_s)
    ("optimizer_s", "f8"),     # clipping and the optimizer step
    ("other_s", "f8"),         # the rest of the update: rollout bookkeeping, advantages,
                               # progress reports (t_s + all phases = the next row's t_s
                               # minus that row's log_s: every second is in some column)
    ("bytes_sent", "i8"),      # by this rank's topology calls during the update
    ("bytes_recv", "i8"),
    ("env_steps", "i8"),       # env steps this rank collected for the update
    ("param_version", "i8"),   # version of the parameters the gradient was computed on
    ("staleness", "i8"),       # server: version applied minus version computed on
    ("dropped", "i8"),         # server: 1 if this gradient was dropped, not applied
    ("log_s", "f8"),           # time this rank spent logging the previous row (overhead)
])
PHASES = ("env_s", "forward_s", "straggle_s", "backward_s", "exchange_s", "optimizer_s",
          "other_s")

EPISODE_DTYPE = np.dtype([
    ("update", "i8"),          # the update (sync) or push (async/quorum worker) whose
                               # rollout the episode ended in
    ("t_s", "f8"),
    ("return", "f8"),
    ("length", "i8"),
])

#: one row per environment step of an env that reports its simulation time
#: (``info["sim_s"]``: L2Run-v0, Delay-v0), so stragglers' causes can be seen step by step
SIM_STEP_DTYPE = np.dtype([
    ("update", "i8"),          # the update whose rollout took the step
    ("env", "i8"),             # which of the rank's envs
    ("sim_s", "f8"),           # seconds inside the simulator (summed over action repeats)
])

#: one row per failure this rank survived (``--on-failure shrink``; schema 3): what it
#: saw, how long detection and recovery took, and who was left
FAILURE_DTYPE = np.dtype([
    ("update", "i8"),          # the update whose exchange saw the failure
    ("t_s", "f8"),             # when recovery ended, seconds since the rank's start
    ("unix_s", "f8"),          # the same, wall clock (to compare with a kill's time)
    ("detect_s", "f8"),        # from entering the failed operation to the error
    ("recover_s", "f8"),       # revoke + shrink + agreement + topology rebuild
    ("size_after", "i8"),      # ranks left
    ("failed", "S64"),         # launch ranks lost, comma-separated
])

TABLES = (("updates", UPDATE_DTYPE), ("episodes", EPISODE_DTYPE),
          ("sim_steps", SIM_STEP_DTYPE), ("failures", FAILURE_DTYPE))


def git_commit() -> str:
    """The checkout's commit, or '' when not in a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


class _Table:
    """An append-only, chunked 1-D compound dataset with an in-memory row buffer."""

    def __init__(self, group: h5py.Group, name: str, dtype: np.dtype, chunk_rows: int) -> None:
        self.dataset = group.create_dataset(name, shape=(0,), maxshape=(None,), dtype=dtype,
                                            chunks=(chunk_rows,))
        self.rows = np.zeros(chunk_rows, dtype=dtype)
        self._blank = np.zeros((), dtype=dtype)
        self.count = 0

    def append(self) -> np.void:
        """A fresh row to fill in place (valid until the next flush)."""
        if self.count == len(self.rows):
            self.flush()
        self.rows[self.count] = self._blank
        row = self.rows[self.count]
        self.count += 1
        return row

    def extend(self, rows: np.ndarray) -> None:
        """Append many rows at once."""
        if self.count + len(rows) > len(self.rows):
            self.flush()
        if len(rows) > len(self.rows):
            self._write(rows)
        else:
            self.rows[self.count:self.count + len(rows)] = rows
            self.count += len(rows)

    def flush(self) -> None:
        if self.count:
            self._write(self.rows[:self.count])
            self.count = 0

    def _write(self, rows: np.ndarray) -> None:
        n = self.dataset.shape[0]
        self.dataset.resize((n + len(rows),))
        self.dataset[n:] = rows
        self.dataset.flush()      # SWMR: makes the new rows visible to readers


class RankLog:
    """This rank's ``rankNNNN.h5``; ``new_update()`` / ``episode()`` add rows."""

    def __init__(self, run_dir: Path, rank: int, role: str, flush_every: int,
                 resume_update: int | None = None, resume_rows: int | None = None) -> None:
        """``resume_update``: continue an existing log, keeping only its rows up to that
        update (those after the checkpoint are re-done by the resumed run);
        ``resume_rows``: keep only the first that many ``updates`` rows (a parameter
        server's rows are per push received, several may share a version)."""
        self.path = Path(run_dir) / f"rank{rank:04d}.h5"
        kept, start_unix = {}, time.time()
        resuming = resume_update is not None or resume_rows is not None
        if resuming and self.path.is_file():
            kept, start_unix = _rows_until(self.path, resume_update, resume_rows)
        # t_s columns keep counting from the first start, across resumes
        self.start = time.perf_counter() - (time.time() - start_unix)
        tmp = self.path.with_suffix(".h5.tmp")
        self.file = h5py.File(tmp if kept else self.path, "w", libver=LIBVER)
        self.file.attrs.update(rank=rank, hostname=socket.gethostname(), role=role,
                               start_unix_s=start_unix, schema=SCHEMA_VERSION)
        self.updates = _Table(self.file, "updates", UPDATE_DTYPE, flush_every)
        self.episodes = _Table(self.file, "episodes", EPISODE_DTYPE, flush_every)
        self.sim_steps = _Table(self.file, "sim_steps", SIM_STEP_DTYPE, 64 * flush_every)
        self.failures = _Table(self.file, "failures", FAILURE_DTYPE, 8)
        for name, rows in kept.items():
            if len(rows):
                getattr(self, name)._write(rows)
        if kept:                  # the cut log replaces the old one in one rename
            self.file.close()
            os.replace(tmp, self.path)
            self.file = h5py.File(self.path, "a", libver=LIBVER)
            self.updates.dataset = self.file["updates"]
            self.episodes.dataset = self.file["episodes"]
            self.sim_steps.dataset = self.file["sim_steps"]
            self.failures.dataset = self.file["failures"]
        self.file.swmr_mode = True

    def now(self) -> float:
        return time.perf_counter() - self.start

    def new_update(self, update: int, t_s: float, phases: dict) -> np.void:
        """Append an update row with its phase times; the caller fills the other fields.

        Every ``flush_every`` updates all tables are written out together."""
        if self.updates.count == len(self.updates.rows):
            self.flush()
        row = self.updates.append()
        row["update"] = update
        row["t_s"] = t_s
        for phase in PHASES:
            row[phase] = phases.get(phase, 0.0)
        row["param_version"] = row["staleness"] = -1
        row["exchange_t_s"] = row["wait_s"] = np.nan
        return row

    def episode(self, update: int, ret: float, length: int) -> None:
        row = self.episodes.append()
        row["update"], row["t_s"], row["return"], row["length"] = update, self.now(), ret, length

    def sim_times(self, update: int, times: np.ndarray) -> None:
        """``times[step, env]``: seconds each env step spent in the simulator."""
        if not times.size:
            return
        rows = np.empty(times.size, dtype=SIM_STEP_DTYPE)
        rows["update"] = update
        rows["env"] = np.tile(np.arange(times.shape[1]), times.shape[0])
        rows["sim_s"] = times.reshape(-1)
        self.sim_steps.extend(rows)

    def failure(self, update: int, *, unix_s: float, detect_s: float, recover_s: float,
                size_after: int, failed: list[int]) -> None:
        """A survived failure; written out at once (rare, and worth keeping)."""
        row = self.failures.append()
        row["update"], row["t_s"], row["unix_s"] = update, self.now(), unix_s
        row["detect_s"], row["recover_s"], row["size_after"] = detect_s, recover_s, size_after
        row["failed"] = ",".join(map(str, failed)).encode()[:64]
        self.failures.flush()

    def flush(self) -> None:
        self.updates.flush()
        self.episodes.flush()
        self.sim_steps.flush()
        self.failures.flush()
        self.file.flush()

    def close(self) -> None:
        if self.file.id.valid:
            self.flush()
            self.file.close()


def _rows_until(path: Path, update: int | None, count: int | None = None
                ) -> tuple[dict, float]:
    """Rows of a rank log (also one left by a crash) with ``update <= update`` (any
    update when None); of ``updates``, at most the first ``count`` rows of those."""
    with h5py.File(path, "r", libver="latest", swmr=True) as f:
        start = float(f.attrs["start_unix_s"])
        out = {}
        for name, dtype in TABLES:
            rows = f[name][...] if name in f else np.zeros(0, dtype)
            if update is not None:
                rows = rows[rows["update"] <= update]
            if name == "updates" and count is not None:
                rows = rows[:count]
            out[name] = rows.astype(dtype)
    return out, start


def write_run_file(run_dir: Path, *, config: dict, world_size: int, hostnames: list[str],
                   cores: list[int], mpi_library: str, version: str) -> None:
    """Rank 0: create ``run.h5`` with the run's metadata and links to every rank's file."""
    cores_of = dict(zip(hostnames, cores, strict=True))
    oversubscribed = _oversubscribed(hostnames, cores)
    with h5py.File(Path(run_dir) / "run.h5", "w", libver=LIBVER) as f:
        f.attrs.update(schema=SCHEMA_VERSION, mpirl_version=version, git_commit=git_commit(),
                       mpi_library=mpi_library, world_size=world_size, mode=config["mode"],
                       topology=config["topology"], env=config["env"],
                       config_json=json.dumps(config), hostnames_json=json.dumps(hostnames),
                       cores_per_node_json=json.dumps(cores_of), oversubscribed=oversubscribed,
                       start_unix_s=time.time(), scheduler_json=json.dumps(scheduler_info()))
        ranks = f.create_group("ranks")
        for r in range(world_size):
            ranks[f"{r:04d}"] = h5py.ExternalLink(f"rank{r:04d}.h5", "/")


#: batch-system variables worth keeping with a run (Slurm's job, array task and nodes)
SCHEDULER_VARS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NAME",
                  "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_JOB_PARTITION",
                  "SLURM_CLUSTER_NAME")


def scheduler_info() -> dict:
    """The batch system's description of this job ({} outside one)."""
    return {k: os.environ[k] for k in SCHEDULER_VARS if k in os.environ}


def finish_run_file(run_dir: Path, totals: dict) -> None:
    """Rank 0, at the end: the end time and the gradient totals."""
    with h5py.File(Path(run_dir) / "run.h5", "a") as f:
        f.attrs.update(end_unix_s=time.time(), **totals)


def open_run(run_h5: Path) -> h5py.File:
    """Open ``run.h5`` for reading, also while the run is going or after it crashed.

    SWMR-read mode is what lets HDF5 open a file whose writer is still running or died
    without closing it; the external links to the rank files inherit it."""
    return h5py.File(run_h5, "r", libver="latest", swmr=True)



# -- microbenchmark results (python -m mpirl.bench --out FILE.h5) ------------------------------
#: one row per (topology, message size) of a benchmark run; latencies are each rank's mean
#: over the timed calls, reduced over ranks (the best of the rounds by average).
BENCH_DTYPE = np.dtype([
    ("op", "S16"),             # allreduce or bcast
    ("topology", "S48"),       # registry name; "native:ALGO" for MPICH with a forced algorithm
    ("bytes", "i8"),           # message size
    ("iters", "i8"),           # timed calls per round
    ("min_s", "f8"),
    ("avg_s", "f8"),
    ("max_s", "f8"),
])
BENCH_KIND = "mpirl.bench"


def write_bench_file(path: Path, rows: np.ndarray, *, op: str, world_size: int,
                     hostnames: list[str], cores: list[int], mpi_library: str,
                     rounds: int) -> None:
    """A benchmark's results: attrs ``kind`` (= ``mpirl.bench``), ``schema``, ``op`` (the
    ops measured, comma-separated),
    ``world_size``, ``mpi_library``, ``hostnames_json``, ``oversubscribed``, ``rounds``,
    ``git_commit``, ``unix_s``; dataset ``results`` of :data:`BENCH_DTYPE` rows."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w", libver=LIBVER) as f:
        f.attrs.update(kind=BENCH_KIND, schema=SCHEMA_VERSION, op=op, world_size=world_size,
                       mpi_library=mpi_library, hostnames_json=json.dumps(hostnames),
                       oversubscribed=_oversubscribed(hostnames, cores), rounds=rounds,
                       git_commit=git_commit(), unix_s=time.time())
        f.create_dataset("results", data=rows.astype(BENCH_DTYPE))


def _oversubscribed(hostnames: list[str], cores: list[int]) -> bool:
    """True when some node ran more ranks than it has cores."""
    per_node: dict[str, int] = {}
    for host in hostnames:
        per_node[host] = per_node.get(host, 0) + 1
    cores_of = dict(zip(hostnames, cores, strict=True))
    return any(n > cores_of[h] for h, n in per_node.items())
