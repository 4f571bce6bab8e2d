"""One rank's log of one run: the rows a design records, in the files of the schema."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from mpi4py import MPI

from .. import __version__
from ..launch import cpu_count, mpi_library
from . import tensorboard
from .h5log import RankLog, finish_run_file, note_attempt, write_run_file
from .schema import LOSSES
from .timing import PhaseTimer, add_phases


#: the update columns that are a rank waiting for a peer (the exchange's measured wait
#: and each role's own: an actor's for actions or the learner's reply, an inference
#: rank's for a batch, a learner's for data)
WAITING = ("wait_s", "infer_wait_s", "param_wait_s", "batch_wait_s", "data_wait_s")


def waited(row: dict) -> float:
    """A row's seconds of waiting for peers: its role's waiting phases, or the watched
    sources' ``wait_s`` where that is more (an async worker's waits are inside its
    exchange; an actor's client waits inside its ``infer_wait_s`` or ``param_wait_s``,
    so the two are not added)."""
    own = sum(row[k] for k in WAITING[1:] if k in row and row[k] == row[k])
    peer = row.get("wait_s", 0.0)
    return max(own, peer if peer == peer else 0.0)


class RunLogger:
    """The HDF5 log of one rank in one run: ``run.h5`` (rank 0) and ``rankNNNN.h5``.

    Opening is collective (hostnames and core counts are gathered once, before any
    exchange); every later call is local, so logging adds no traffic to the exchange
    being measured.  ``record`` times itself: each row carries the seconds the
    previous row cost to log (``log_s``), so the overhead is in the data.

    Traffic is counted here, not at each caller: a role hands the logger its channels
    or exchange once (:meth:`watch`), and every row then carries the bytes they sent and
    received, and the seconds they waited for a peer, since the row before."""

    def __init__(self, cfg, comm: MPI.Comm, run_dir: Path, role: str,
                 resume_update: int | None = None,
                 resume_rows: dict[str, int] | None = None) -> None:
        hosts = comm.allgather(socket.gethostname())
        cores = comm.allgather(cpu_count())
        resuming = resume_update is not None or resume_rows is not None
        if comm.Get_rank() == 0 and not resuming:
            write_run_file(run_dir, config=cfg.to_dict(), world_size=comm.Get_size(),
                           hostnames=hosts, cores=cores, version=__version__,
                           mpi_library=mpi_library())
        elif comm.Get_rank() == 0:
            note_attempt(run_dir, hosts, cores, resume_update)
        self.run_dir = run_dir
        self.rank = comm.Get_rank()
        self.log = RankLog(run_dir, self.rank, role, cfg.log_flush_every, resume_update,
                           resume_rows)
        self._log_s = 0.0
        self.update_start = self.log.now()
        self._sources: tuple = ()
        self._waits: tuple = ()
        self._marks: list[tuple] = []
        self.role = role
        self._seconds = [0.0, 0.0]           # waiting, all logged, since waiting_share()

    def watch(self, *sources, waits=None, from_zero: bool = False) -> None:
        """Count traffic in every later row, from now: the bytes ``sources`` sent and
        received fill ``bytes_sent`` and ``bytes_recv``, and the seconds ``waits``
        (default: every source) spent blocked on a peer fill ``wait_s`` (``waits=()``:
        the role measures no waits, ``wait_s`` stays unset).  A source is anything with
        a ``stats`` (:class:`topologies.base.CommStats`, or counters read live like
        one), read at each row.  ``from_zero``: the first row also holds what the
        sources moved before this call (a sync rank's first broadcast, made before its
        log)."""
        self._sources = sources
        self._waits = sources if waits is None else tuple(waits)
        self._mark()
        if from_zero:
            self._marks = [(0, 0, 0.0)] * len(sources)

    def unlogged(self) -> None:
        """The traffic since the last row belongs to no row (a message that ends a
        peer's stream, not an update of this rank)."""
        self._mark()

    def bytes_sent(self) -> int:
        """Bytes the watched sources sent since they were made (the run's total)."""
        return sum(source.stats.bytes_sent for source in self._sources)

    def _mark(self) -> None:
        self._marks = [(s.stats.bytes_sent, s.stats.bytes_recv, s.stats.wait_s)
                       for s in self._sources]

    def _traffic(self) -> dict:
        """The row's traffic since the last mark."""
        if not self._sources:
            return {}
        moved = {"bytes_sent": 0, "bytes_recv": 0}
        waited = 0.0
        for source, (sent, received, wait) in zip(self._sources, self._marks, strict=True):
            stats = source.stats
            moved["bytes_sent"] += stats.bytes_sent - sent
            moved["bytes_recv"] += stats.bytes_recv - received
            if any(source is w for w in self._waits):
                waited += stats.wait_s - wait
        self._mark()
        return {**moved, "wait_s": waited} if self._waits else moved

    def waiting_share(self) -> tuple[str, float]:
        """This rank's role and the share of its logged seconds it spent waiting for
        peers (:data:`WAITING`) since the last call: the progress line's figure on ranks
        that see no one else's time (a learner, an inference rank)."""
        waited, total = self._seconds
        self._seconds = [0.0, 0.0]
        return self.role, waited / total if total else 0.0

    def begin(self, timer: PhaseTimer | None = None, totals: dict | None = None) -> None:
        """The first update starts now; each later one starts where the last record ended.
        What ``timer`` holds from before (a first wait for parameters) is no row's: it is
        taken into the run's ``totals``, so rows hold only their own time."""
        if timer is not None:
            add_phases(totals, timer.take())
        self.update_start = self.log.now()

    def record(self, update: int, timer: PhaseTimer, **fields) -> dict[str, float]:
        """One update row: the phase seconds ``timer`` holds (taken from it, and
        returned), when its exchange began, and any of the row's other fields.

        The update's time not in any phase is its ``other_s``; the next update starts
        when this call returns, so consecutive rows tile the rank's time."""
        t0 = time.perf_counter()            # one clock reading ends the update ...
        exchange_at = timer.started_at("exchange_s")
        phases = timer.take()
        start = self.update_start
        row = {"update": update, "t_s": start, **phases, **self._traffic(), **fields,
               "log_s": self._log_s,
               "other_s": max(0.0, t0 - self.log.start - start - sum(phases.values()))}
        if exchange_at is not None:
            row["exchange_t_s"] = exchange_at - self.log.start
        if tensorboard.active() and "policy_loss" in row:
            tensorboard.scalars({f"loss/{k.removesuffix('_loss')}": row[k] for k in LOSSES
                                 if k in row}, update)
        self._seconds[0] += waited(row)
        self._seconds[1] += sum(phases.values()) + row["other_s"] + row["log_s"]
        self.log.add_update(row)            # (may flush)
        end = time.perf_counter()           # ... and one starts the next: rows tile time
        self._log_s = end - t0
        self.update_start = end - self.log.start
        return phases

    def episodes(self, update: int, finished: list[tuple[float, int]]) -> None:
        for ret, length in finished:
            self.log.episode(update, ret, length)

    def sim_times(self, update: int, times) -> None:
        self.log.sim_times(update, times)

    def failure(self, update: int, event) -> None:
        """A failure this rank survived (an :class:`mpirl.resilience.ulfm.FailureEvent`)."""
        self.log.failure(update, unix_s=event.unix_s, detect_s=event.detect_s,
                         recover_s=event.recover_s, size_after=event.size_after,
                         failed=event.failed)

    def flush(self) -> None:
        """Every row so far on disk (before a checkpoint that covers them)."""
        self.log.flush()

    def close(self, totals: dict | None = None, writer: bool | None = None) -> None:
        """``writer``: this rank finishes run.h5 (default: rank 0; after a failure the
        lowest survivor)."""
        self.log.close()
        if (self.rank == 0 if writer is None else writer) and totals is not None:
            finish_run_file(self.run_dir, totals)
