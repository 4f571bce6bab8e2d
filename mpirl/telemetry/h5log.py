"""Every second of every rank, in HDF5: the writer of the log whose schema is
:mod:`mpirl.telemetry.schema`.

Crash safety.  A rank's file is *closed* except while rows are being appended: rows are
buffered in memory, and every ``flush_every`` updates (or when a table's buffer fills,
and at the end) the file is opened, every table's new rows appended, and the file
closed again.  A ``kill -9`` at any moment therefore leaves a file that any HDF5 reader
opens as it is (plain ``h5py.File(path, "r")``, ``h5dump``, pandas via PyTables), with
every row of the last completed flush: at most ``flush_every`` update rows are lost.

Two choices make that hold:

* The file format is capped at HDF5 1.8's (``LIBVER``): superblock version 2, which has
  no "file open for write" flag.  The 1.10 format (superblock 3, needed for SWMR) sets
  that flag while a writer has the file open, and a writer killed then leaves a file
  that plain readers refuse until ``h5clear`` is run; that was this log before schema
  4 (SWMR, file kept open).  A test kills ranks mid-run and reads every file back with
  plain h5py, h5dump and pandas.
* Without SWMR, HDF5 writes a flush's metadata in no guaranteed order, so a kill
  *inside* a flush (about 1 ms in every ``flush_every`` updates) can leave two things.
  A table's new extent on disk without the rows in it: those rows read as the table's
  fill value (update -1, NaN: :func:`mpirl.telemetry.schema.fill_row`), visibly, in
  any reader, and the project's readers drop them (the flush's rows are lost, which the
  promise above allows for).  Or new objects past the end-of-file address the
  superblock records, which makes reading those tables fail: the rank's sentinel mends
  that as the rank dies (:mod:`mpirl.telemetry.superblock`).
* The writer opens the file without HDF5's file locks, so a reader that holds a log
  open while the run goes on (a notebook) never makes a flush fail.  Such a reader
  must not hold it across flushes: tables it reads after a flush it did not see can
  fail ("addr overflow"); reopen to see newer rows.  :func:`mpirl.telemetry.access.read_h5`
  reads in one open, again when a flush changed the file under it.
* Between flushes the file is kept longer than its end-of-file address by what the
  next flush can add (:func:`_keep_ahead`; a hole, no disk used).  Without it a plain
  reader opening the file as a flush ends finds it "truncated" (46 of 42,045 opens
  with flushes back to back); with it, 0 of 43,882 idle but 49 of 100,000 with both
  cores busy, so live files are read with ``read_h5``, which reads again
  (docs/log-schema.md; experiments/bench_live_open.py).  ``close`` leaves the file at
  its address.

Opening and closing the file at every flush is paid for by appending through h5py's
low-level interface with each table's memory type built once (what it costs:
docs/log-schema.md).
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
from h5py import h5d, h5f, h5p, h5s, h5t

from ..launch import on_emulated_cluster
from .access import rows_until
from .schema import (BENCH_DTYPE, BENCH_KIND, EPISODE_DTYPE, FAILURE_DTYPE, SCHEMA_VERSION,
                     SIM_STEP_DTYPE, TABLES, UPDATE_DTYPE, UPDATE_UNSET, fill_row)

#: HDF5 file-format bounds for every file mpirl writes: the 1.8 format (superblock 2, no
#: write-open flag; see the module doc), readable by HDF5 1.8 and every later library.
LIBVER = ("v108", "v108")


def git_commit() -> str:
    """The checkout's commit, or '' when not in a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def rank_file(run_dir: Path, rank: int) -> Path:
    """The log file rank ``rank`` writes alone."""
    return Path(run_dir) / f"rank{rank:04d}.h5"


def run_file(run_dir: Path) -> Path:
    """The run's metadata file, linking every rank's log."""
    return Path(run_dir) / "run.h5"


def _append_access() -> h5p.PropFAID:
    """File access for appending: the format bounds, and no HDF5 file locks."""
    fapl = h5p.create(h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5f.LIBVER_V18, h5f.LIBVER_V18)
    fapl.set_file_locking(False, True)
    return fapl


#: room for the metadata one table's append can add (B-tree nodes, header messages; HDF5
#: allocates small metadata from 2 KiB blocks)
_META_SLACK = 64 * 1024


def _keep_ahead(path: Path, room: int) -> None:
    """Lengthen the file by ``room`` bytes past its end (a hole: no disk is used).

    A reader opening the file takes its length first and reads the superblock's
    end-of-file address after; a flush in between (the writer's ``h5f.close``
    writes a larger address) makes the file look shorter than the address, and the
    reader refuses it: "truncated file".  A file kept longer than anything the next
    flush can allocate never looks so.  HDF5 allocates at the address, not at the file's
    length, and cuts the file back to the address when it closes it; so this runs after
    every close, and before an open when a write needs more than that room."""
    os.truncate(path, os.stat(path).st_size + room)


class _Table:
    """An append-only, chunked 1-D compound dataset and its in-memory row buffer."""

    __slots__ = ("name", "dtype", "rows", "count", "chunk_rows", "_mtype", "_blank",
                 "_unset", "_index")

    def __init__(self, name: str, dtype: np.dtype, buffer_rows: int,
                 unset: dict | None = None) -> None:
        self.name, self.dtype = name, dtype
        self.chunk_rows = buffer_rows
        self.rows = np.zeros(buffer_rows, dtype=dtype)
        self.count = 0
        self._mtype = h5t.py_create(dtype)     # built once: h5py would build it per write
        self._blank = np.zeros((), dtype=dtype)
        self._index = {field: i for i, field in enumerate(dtype.names)}
        # the values of a row nobody filled in, as a list to copy and fill by position
        self._unset = [(unset or {}).get(field, 0) for field in dtype.names]

    @property
    def full(self) -> bool:
        return self.count == len(self.rows)

    def append(self) -> np.void:
        """A fresh row to fill in place (valid until the next flush); the caller flushes
        first when the buffer is :attr:`full`."""
        self.rows[self.count] = self._blank
        row = self.rows[self.count]
        self.count += 1
        return row

    def put(self, values: dict) -> None:
        """Append one row from ``field: value`` (the rest unset), in one assignment: a
        dozen numpy field writes would cost several times as much."""
        row = self._unset.copy()
        index = self._index
        for field, value in values.items():
            row[index[field]] = value
        self.rows[self.count] = tuple(row)
        self.count += 1

    def headroom(self, rows: int) -> int:
        """Bytes the file can grow by when ``rows`` rows are appended: every chunk they
        can touch, whole, and room for the index and header blocks a flush adds."""
        return (rows // self.chunk_rows + 2) * self.chunk_rows * self.dtype.itemsize + _META_SLACK

    def write(self, fid, rows: np.ndarray) -> None:
        """Append ``rows`` to this table's dataset in the open file ``fid``."""
        if not len(rows):
            return
        dataset = h5d.open(fid, self.name.encode())
        try:
            n = dataset.shape[0]
            dataset.set_extent((n + len(rows),))
            space = dataset.get_space()
            space.select_hyperslab((n,), (len(rows),))
            dataset.write(h5s.create_simple((len(rows),)), space,
                          np.ascontiguousarray(rows), mtype=self._mtype)
        finally:
            dataset.close()


class RankLog:
    """This rank's ``rankNNNN.h5``; ``add_update()`` / ``episode()`` add rows."""

    def __init__(self, run_dir: Path, rank: int, role: str, flush_every: int,
                 resume_update: int | None = None,
                 resume_rows: dict[str, int] | None = None) -> None:
        """``resume_update``: continue an existing log, keeping only its rows up to that
        update (those after the checkpoint are re-done by the resumed run);
        ``resume_rows``: of each table it names, keep only the first that many rows (a
        parameter server's update rows are per push received, several may share a
        version; sync-replay's warm-up rows and episodes all have update 0)."""
        self.path = rank_file(run_dir, rank)
        kept, start_unix = {}, time.time()
        resuming = resume_update is not None or resume_rows is not None
        if resuming and self.path.is_file():
            kept, start_unix = rows_until(self.path, resume_update, resume_rows)
        # t_s columns keep counting from the first start, across resumes
        self.start = time.perf_counter() - (time.time() - start_unix)
        self.updates = _Table("updates", UPDATE_DTYPE, flush_every, UPDATE_UNSET)
        self.episodes = _Table("episodes", EPISODE_DTYPE, flush_every)
        self.sim_steps = _Table("sim_steps", SIM_STEP_DTYPE, 64 * flush_every)
        self.failures = _Table("failures", FAILURE_DTYPE, 8)
        self._tables = (self.updates, self.episodes, self.sim_steps, self.failures)
        self._fapl = _append_access()
        #: what one flush of full buffers can add to the file (see _keep_ahead)
        self._room = sum(table.headroom(len(table.rows)) for table in self._tables)
        self._create(rank, role, start_unix, kept)

    def _create(self, rank: int, role: str, start_unix: float, kept: dict) -> None:
        """A new file with empty tables (and, on resume, the rows kept), written beside
        the old one and renamed over it: a crash here leaves the old log whole."""
        tmp = self.path.with_suffix(".h5.tmp")
        with h5py.File(tmp, "w", libver=LIBVER) as f:
            f.attrs.update(rank=rank, hostname=socket.gethostname(), role=role,
                           start_unix_s=start_unix, schema=SCHEMA_VERSION)
            for table in self._tables:
                f.create_dataset(table.name, shape=(0,), maxshape=(None,),
                                 dtype=table.dtype, chunks=(table.chunk_rows,),
                                 fillvalue=fill_row(table.dtype))
            for table in self._tables:
                table.write(f.id, kept.get(table.name, np.zeros(0, table.dtype)))
        _keep_ahead(tmp, self._room)
        os.replace(tmp, self.path)

    def now(self) -> float:
        return time.perf_counter() - self.start

    def add_update(self, values: dict) -> None:
        """Append an update row: ``field: value`` for any fields of
        :data:`~mpirl.telemetry.schema.UPDATE_DTYPE` (``update`` and ``t_s`` at least;
        the others default to :data:`~mpirl.telemetry.schema.UPDATE_UNSET`, else 0).

        Every ``flush_every`` updates all tables are written out together."""
        if self.updates.full:
            self.flush()
        self.updates.put(values)

    def episode(self, update: int, ret: float, length: int) -> None:
        row = self._row(self.episodes)
        row["update"], row["t_s"], row["return"], row["length"] = update, self.now(), ret, length

    def sim_times(self, update: int, times: np.ndarray) -> None:
        """``times[step, env]``: seconds each env step spent in the simulator."""
        if not times.size:
            return
        rows = np.empty(times.size, dtype=SIM_STEP_DTYPE)
        rows["update"] = update
        rows["env"] = np.tile(np.arange(times.shape[1]), times.shape[0])
        rows["sim_s"] = times.reshape(-1)
        table = self.sim_steps
        if table.count + len(rows) > len(table.rows):
            self.flush(only=table)
        if len(rows) > len(table.rows):       # more than a whole buffer: straight out
            self._write({table: rows})
            return
        table.rows[table.count:table.count + len(rows)] = rows
        table.count += len(rows)

    def failure(self, update: int, *, unix_s: float, detect_s: float, recover_s: float,
                size_after: int, failed: list[int]) -> None:
        """A survived failure; written out at once (rare, and worth keeping)."""
        row = self._row(self.failures)
        row["update"], row["t_s"], row["unix_s"] = update, self.now(), unix_s
        row["detect_s"], row["recover_s"], row["size_after"] = detect_s, recover_s, size_after
        row["failed"] = ",".join(map(str, failed)).encode()[:64]
        self.flush()

    def _row(self, table: _Table) -> np.void:
        """A new row of ``table``.  A full ``updates`` buffer flushes every table; another
        table's full buffer is written out alone, so the update rows on disk are always
        whole flushes of ``flush_every``."""
        if table.full:
            self.flush(only=None if table is self.updates else table)
        return table.append()

    def flush(self, only: _Table | None = None, *, last: bool = False) -> None:
        """Append every buffered row (or ``only`` that table's) to the file, in one open
        and close of it.  ``last``: no flush follows, so no room is kept for one and the
        file is opened even with nothing to append (opening cuts it back to its end)."""
        tables = self._tables if only is None else (only,)
        pending = {t: t.rows[:t.count] for t in tables if t.count}
        if last:
            self._room = 0
        if pending or last:
            self._write(pending)
            for table in pending:
                table.count = 0

    def _write(self, rows: dict) -> None:
        need = sum(table.headroom(len(block)) for table, block in rows.items())
        if need > self._room:                     # a straight-out write of many rows
            _keep_ahead(self.path, need)
        fid = h5f.open(str(self.path).encode(), h5f.ACC_RDWR, fapl=self._fapl)
        try:
            for table, block in rows.items():
                table.write(fid, block)
        finally:
            fid.close()
            if self._room:
                _keep_ahead(self.path, self._room)

    def close(self) -> None:
        self.flush(last=True)


def write_run_file(run_dir: Path, *, config: dict, world_size: int, hostnames: list[str],
                   cores: list[int], mpi_library: str, version: str) -> None:
    """Rank 0: create ``run.h5`` with the run's metadata and links to every rank's file."""
    oversubscribed = _oversubscribed(hostnames, cores)
    first = attempt(hostnames, cores, from_update=None)
    with h5py.File(run_file(run_dir), "w", libver=LIBVER) as f:
        f.attrs.update(schema=SCHEMA_VERSION, mpirl_version=version, git_commit=git_commit(),
                       mpi_library=mpi_library, world_size=world_size, mode=config["mode"],
                       topology=config["topology"], env=config["env"],
                       config_json=json.dumps(config), hostnames_json=json.dumps(hostnames),
                       cores_per_node_json=json.dumps(first["cores_per_node"]),
                       oversubscribed=oversubscribed, start_unix_s=first["start_unix_s"],
                       scheduler_json=json.dumps(first["scheduler"]),
                       cluster_json=json.dumps(first["cluster"]),
                       attempts_json=json.dumps([first]))
        ranks = f.create_group("ranks")
        for r in range(world_size):
            ranks[f"{r:04d}"] = h5py.ExternalLink(f"rank{r:04d}.h5", "/")
    if oversubscribed:
        crowd, have = _crowding(hostnames, cores)
        print(f"mpirl: warning: {crowd} ranks share {have} cores (oversubscribed): timings "
              "and throughput are suspect", flush=True)


#: batch-system variables worth keeping with a run (Slurm's job, array task and nodes)
SCHEDULER_VARS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NAME",
                  "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_JOB_PARTITION",
                  "SLURM_CLUSTER_NAME")


def scheduler_info() -> dict:
    """The batch system's description of this job ({} outside one)."""
    return {k: os.environ[k] for k in SCHEDULER_VARS if k in os.environ}


def cluster_info(hostnames: list[str]) -> dict:
    """Where the ranks ran: the emulated cluster's description when launched on one
    (``MPIRL_CLUSTER``, set by ``python -m mpirl.cluster``: its name, the nodes of the
    job, the link cap, the MPI) and, always, how many ranks each host had."""
    try:
        info = json.loads(os.environ.get("MPIRL_CLUSTER", "{}"))
    except json.JSONDecodeError:
        info = {}
    per_host: dict[str, int] = {}
    for host in hostnames:
        per_host[host] = per_host.get(host, 0) + 1
    return {**info, "ranks_on": per_host}


def attempt(hostnames: list[str], cores: list[int], from_update: int | None) -> dict:
    """One start of a run, as ``attempts_json`` of run.h5 lists it: when, on which hosts
    (one per rank), with how many cores each, under which scheduler job and on which
    emulated cluster and placement; ``from_update``: the update a resumed sync run went
    on from (None for the first start, and for a parameter server's run, which resumes
    from a checkpoint generation)."""
    return {"start_unix_s": time.time(), "from_update": from_update,
            "hostnames": hostnames, "cores_per_node": dict(zip(hostnames, cores, strict=True)),
            "scheduler": scheduler_info(), "cluster": cluster_info(hostnames)}


def note_attempt(run_dir: Path, hostnames: list[str], cores: list[int],
                 from_update: int | None) -> None:
    """Rank 0 of a resumed run: add this start to run.h5's ``attempts_json`` (the
    top-level ``hostnames_json``, ``scheduler_json`` and ``cluster_json`` stay the first
    start's; a resume may land on other hosts, another job, another placement).  A file
    written before ``attempts_json`` existed gets its first start rebuilt from those (what
    it has of them).  Without run.h5 there is nothing to add to: a warning, and the run
    goes on (metadata never stops a resume)."""
    path = run_file(run_dir)
    if not path.is_file():
        print(f"mpirl: warning: {path} is missing; this start is not recorded", flush=True)
        return
    with h5py.File(path, "r+", libver=LIBVER, locking=False) as f:
        if "attempts_json" in f.attrs:
            attempts = json.loads(f.attrs["attempts_json"])
        else:
            old = {key: json.loads(f.attrs.get(f"{key}_json", empty)) for key, empty in
                   (("hostnames", "[]"), ("cores_per_node", "{}"), ("scheduler", "{}"),
                    ("cluster", "{}"))}
            attempts = [{"start_unix_s": float(f.attrs.get("start_unix_s", 0.0)),
                         "from_update": None, **old}]
        attempts.append(attempt(hostnames, cores, from_update))
        f.attrs["attempts_json"] = json.dumps(attempts)


def finish_run_file(run_dir: Path, totals: dict) -> None:
    """The writing rank, at the end: the end time and the gradient totals."""
    with h5py.File(run_file(run_dir), "a", libver=LIBVER, locking=False) as f:
        f.attrs.update(end_unix_s=time.time(), **totals)


def write_bench_file(path: Path, rows: np.ndarray, *, op: str, world_size: int,
                     hostnames: list[str], cores: list[int], mpi_library: str,
                     rounds: int) -> None:
    """A benchmark's results: attrs ``kind`` (= ``mpirl.bench``), ``schema``, ``op`` (the
    ops measured, comma-separated), ``world_size``, ``mpi_library``, ``hostnames_json``,
    ``oversubscribed``, ``rounds``, ``git_commit``, ``unix_s``, ``cluster_json`` (as
    run.h5's); dataset ``results`` of
    :data:`~mpirl.telemetry.schema.BENCH_DTYPE` rows."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w", libver=LIBVER) as f:
        f.attrs.update(kind=BENCH_KIND, schema=SCHEMA_VERSION, op=op, world_size=world_size,
                       mpi_library=mpi_library, hostnames_json=json.dumps(hostnames),
                       oversubscribed=_oversubscribed(hostnames, cores), rounds=rounds,
                       git_commit=git_commit(), unix_s=time.time(),
                       cluster_json=json.dumps(cluster_info(hostnames)))
        f.create_dataset("results", data=rows.astype(BENCH_DTYPE))


def _crowding(hostnames: list[str], cores: list[int]) -> tuple[int, int]:
    """The ranks and cores of the most crowded node.  The nodes of an emulated cluster
    (``MPIRL_CLUSTER`` set) share one machine's cores: there, all ranks count."""
    if on_emulated_cluster():
        return len(hostnames), max(cores)
    cores_of = dict(zip(hostnames, cores, strict=True))
    host = max(cores_of, key=lambda h: hostnames.count(h) / cores_of[h])
    return hostnames.count(host), cores_of[host]


def _oversubscribed(hostnames: list[str], cores: list[int]) -> bool:
    """True when some node ran more ranks than it has cores."""
    ranks, have = _crowding(hostnames, cores)
    return ranks > have


__all__ = ["EPISODE_DTYPE", "FAILURE_DTYPE", "LIBVER", "RankLog", "SIM_STEP_DTYPE", "TABLES",
           "UPDATE_DTYPE", "attempt", "finish_run_file", "note_attempt", "scheduler_info",
           "write_bench_file", "write_run_file"]
