"""async (A3C) and quorum (DPPO's leader): a parameter server at rank 0, workers elsewhere.

Rank 0 owns the parameters and the Adam state and runs no environment; ranks 1..N-1
collect experience.  A worker loops: receive parameters -> roll out -> gradient ->
push it (with a few numbers of metadata) -> wait for the reply.  The exchange is
:class:`topologies.paramserver.ParameterServer`; what the server does with a push is
decided here:

* ``async``: apply it at once (one Adam step), answer that worker alone with the new
  parameters.  Nobody waits for anybody; the price is *staleness*: the number of
  updates the server made between sending a worker its parameters and applying the
  gradient computed on them.
* ``quorum``: hold each push until ``K`` *fresh* ones (computed on the current
  parameters) have arrived, average what is held, take one step, answer every held
  worker.  A *late* push (computed on older parameters) is dropped, or with
  ``--late apply`` averaged in with its staleness; its worker waits for the round.

Accounting: every push a worker sends is either applied or dropped, and the totals are
checked at the end (sent == applied + dropped); every push also carries its worker's
push count, which the server checks against the pushes it took from that worker.
Shutdown: once the env-step budget is reached, each worker's next push is taken,
counted as dropped, and answered with STOP, so no message is left in flight when MPI
finalizes.

Checkpoints: a consistent snapshot without stopping the world
--------------------------------------------------------------
Every worker has at most one push in flight, so a cut can be taken one worker at a time.
Every ``--checkpoint-every`` server updates (and when a stop is requested) the server
starts *snapshot generation G*: the reply to each live worker's next push carries tag
``SNAPSHOT`` instead of ``PARAMS`` (``SNAPSHOT_STOP`` for a stop).  A worker that gets
it logs the push's row, then writes ``checkpoints/gG/rankNNNN.pt``: the parameters just
received, torch's RNG, env and rollout state, episode statistics, its push count (its
log position) and, mid ``--update-repeat``, the batch still being used.  It then goes on
(or, after ``SNAPSHOT_STOP``, stops).  While the snapshot is open the server takes
pushes from not-yet-flagged workers only; a flagged worker's next push waits in MPI,
after the cut on both sides (the price: a fast worker may wait up to one rollout of the
slowest, once per snapshot).  When every live worker is flagged, the server writes its
own file of generation G (parameters, Adam state, version, env steps, applied/dropped
counts, pushes taken per worker, the staleness list, the version each worker was last
sent, its log row count) and the snapshot is closed.  Every push is thus before the cut
on both sides (sent and taken, counted by both) or after it on both (not counted by
either); nothing is in flight across it.

In quorum mode a held push cannot be answered before its round completes, so a
snapshot is one *barrier round*: the round that starts after the due update completes
only once every live worker's push is held (and the quorum of fresh ones is met), then
all are answered, flagged, at once, and the server's checkpoint holds nothing held.
That round waits for the slowest worker, like a sync step, once per snapshot.

Generations: G counts snapshots (the server's and every worker's count agree, since each
snapshot flags every live worker once); the server's file records the version at the cut.
When the server closes generation G, every worker has pushed since it wrote G-1, so G-1
is complete on every rank; the server then deletes generations older than G-1.  A crash
at any moment therefore leaves at least one complete generation once the first has been
written, and ``--resume`` takes the newest complete one (deleting the partial ones
after it).  A push in flight when the job died is after the cut: never counted as sent,
its experience collected again by the resumed worker.  Continuation is not bit-identical
to an uninterrupted run (which push arrives first depends on timing), but the totals
are: sent == applied + dropped over the whole run, before and after the resume.

Stop (SIGTERM/SIGINT): a signalled server opens a ``SNAPSHOT_STOP`` generation (after
the one that may be open); a signalled worker sets ``stop`` in its next push's metadata,
and the server does the same.  Every rank writes its checkpoint, closes its log and ends
with :class:`~mpirl.faults.StopRequested` (exit 143).  A budget already spent wins: the
run then ends normally.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

from topologies.paramserver import TAG_PARAMS, TAG_SNAPSHOT, TAG_SNAPSHOT_STOP, ParameterServer

from .. import checkpoint
from ..a2c import Batch
from ..config import Config
from ..progress import Progress
from ..replica import Replica
from ..timing import PhaseTimer
from ..faults import FaultInjector, StopFlag, StopRequested, Watchdog, check_gradient
from .common import (Episodes, RunLogger, Summary, check_same_model, final_mean_return,
                     reached_target)

#: the numbers a worker sends with every push (float64).
META = ("env_steps", "episodes", "return_sum", "pushes", "exchange_s", "busy_s",
        "recent_mean", "stop")   # recent_mean: NaN until the worker has finished 20
                                 # episodes; stop: 1 once the worker got SIGTERM/SIGINT
_STEPS, _EPISODES, _RETURNS, _PUSHES, _EXCHANGE, _BUSY, _RECENT, _STOP = range(len(META))


class AccountingError(RuntimeError):
    """Gradients sent by workers do not add up to gradients applied plus dropped."""


def run_async(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    return _run(cfg, comm, run_dir, quorum=None)


def run_quorum(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    return _run(cfg, comm, run_dir, quorum=cfg.quorum_size(comm.Get_size()))


def _resume_generation(comm: MPI.Comm, run_dir: Path) -> int:
    """The newest generation every rank wrote (collective); rank 0 deletes the
    incomplete ones after it, so the resumed run's snapshots do not mix with them."""
    generation = None
    if comm.Get_rank() == 0:
        generation = checkpoint.latest_complete(run_dir, comm.Get_size())
        if generation is not None:
            checkpoint.remove_generations(run_dir, lambda g: g <= generation)
    generation = comm.bcast(generation, root=0)
    if generation is None:
        raise FileNotFoundError(f"{run_dir}: no checkpoint generation that every rank wrote")
    return generation


def _run(cfg: Config, comm: MPI.Comm, run_dir: Path, quorum: int | None) -> Summary:
    rank = comm.Get_rank()
    ps = ParameterServer(comm, root=0, meta_len=len(META))
    replica = Replica(cfg, rank, with_envs=not ps.is_server)
    check_same_model(comm, replica)
    state = None
    if cfg.resume:
        generation = _resume_generation(comm, run_dir)
        state = checkpoint.load(run_dir, rank, generation)
        if state["generation"] != generation or state["world_size"] != comm.Get_size():
            raise RuntimeError(f"checkpoint {checkpoint.path_for(run_dir, rank, generation)} "
                               f"is of generation {state['generation']} of a "
                               f"{state['world_size']}-rank run")
    summary = Summary(mode=cfg.mode, topology=cfg.topology, ranks=comm.Get_size(),
                      gradient_bytes=replica.flat.grad_np.nbytes)
    logger = RunLogger(cfg, comm, run_dir, role="server" if ps.is_server else "worker",
                       resume_update=None if state is None or ps.is_server else state["pushes"],
                       resume_rows=state["rows"] if state is not None and ps.is_server
                       else None)
    episodes = None
    if ps.is_server:
        progress = Progress(run_dir, enabled=True, resume=state is not None,
                            elapsed_s=state["wall_s"] if state is not None else 0.0)
        server = _Server(cfg, ps, replica, progress, quorum, logger, run_dir, state)
        server.serve()
        if server.stopped:
            logger.close()
            raise StopRequested(server.version, run_dir)
        server.fill(summary)
        # staleness of every applied gradient, in the order they were applied
        np.save(run_dir / "staleness.npy", np.asarray(server.staleness, dtype=np.int64))
    else:
        episodes = Episodes()
        worker = _Worker(cfg, ps, replica, episodes, logger, run_dir, state)
        worker.work()
        if worker.stopped:
            logger.close()
            raise StopRequested(worker.pushes, run_dir)
        summary.gradients_sent = worker.pushes
        summary.updates_skipped = worker.skipped
        if rank == 1:
            summary.phase_s = worker.phases
    # Collective bookkeeping after the exchange has ended: no traffic during it.
    sent = comm.allreduce(summary.gradients_sent if not ps.is_server else 0)
    summary.updates_skipped = comm.allreduce(summary.updates_skipped)
    summary.final_mean_return = final_mean_return(comm, episodes)
    summary.phase_s = comm.bcast(summary.phase_s, root=1)
    if ps.is_server:
        summary.gradients_sent = sent
        if sent != summary.gradients_applied + summary.gradients_dropped:
            raise AccountingError(
                f"workers sent {sent} gradients but the server applied "
                f"{summary.gradients_applied} and dropped {summary.gradients_dropped}")
        # every rank is done writing: a snapshot cut short by the budget's end is dropped
        last = checkpoint.latest_complete(run_dir, comm.Get_size())
        checkpoint.remove_generations(run_dir, lambda g: last is not None and g <= last)
    logger.close(summary.totals())
    return summary


class _Worker:
    """A worker's loop: roll out, push, take the reply; writes its checkpoint when the
    reply says so."""

    def __init__(self, cfg: Config, ps: ParameterServer, replica: Replica,
                 episodes: Episodes, logger: RunLogger, run_dir: Path,
                 state: dict | None) -> None:
        self.cfg, self.ps, self.replica, self.episodes = cfg, ps, replica, episodes
        self.logger, self.run_dir = logger, run_dir
        self.phases: dict[str, float] = {}    # seconds per phase, over the whole run
        self.pushes = self.skipped = 0
        self.owed = np.zeros(3)     # env steps, episodes, return sum not yet reported
        self.batch: Batch | None = None       # the rollout being used (--update-repeat)
        self.repeat = 0                       # gradients computed on it so far
        self.generation = 0                   # snapshots written
        self.stopped = False                  # ended by a stop snapshot (SIGTERM/SIGINT)
        self.resumed = state is not None
        if state is not None:
            self._load(state)

    def work(self) -> None:
        cfg, ps, replica, logger = self.cfg, self.ps, self.replica, self.logger
        rank = ps.rank
        param, grad = replica.flat.param_np, replica.flat.grad_np
        meta = np.zeros(len(META))
        timer, phases, owed = PhaseTimer(), self.phases, self.owed
        faults = FaultInjector(cfg.fail, rank)
        watchdog = Watchdog(ps.comm, cfg.watchdog_s, rank)
        stop = StopFlag()
        alive = True
        if not self.resumed:       # a resumed worker holds the parameters of its checkpoint
            with timer("exchange_s"):
                alive = ps.pull(param, timeout_s=cfg.wait_timeout_s)   # the initial ones
            _merge(phases, timer.take())
        logger.mark_update_start()
        while alive:
            if self.batch is None:
                watchdog.at(f"computing push {self.pushes + 1}")
                self.batch, self.repeat = replica.collect(timer), 0
                finished = replica.roller.drain_episodes()
                self.episodes.add(finished)
                logger.episodes(self.pushes + 1, finished)
                logger.sim_times(self.pushes + 1, replica.roller.drain_sim_times())
                owed += (replica.steps_per_batch, len(finished), sum(r for r, _ in finished))
            while alive and self.repeat < cfg.update_repeat:
                self.repeat += 1
                replica.gradient(self.batch, timer)
                update = self.pushes + self.skipped + 1
                faults.before_exchange(update, grad)
                if not check_gradient(grad, cfg.nan_policy, rank, update):
                    self.skipped += 1     # not pushed; its env steps travel with the next push
                    continue
                this_push = timer.take()
                meta[_STEPS], meta[_EPISODES], meta[_RETURNS] = owed
                meta[_PUSHES] = self.pushes + 1
                meta[_EXCHANGE] = phases.get("exchange_s", 0.0)
                meta[_BUSY] = sum(phases.values()) + sum(this_push.values())
                recent = self.episodes.recent_mean()
                meta[_RECENT] = np.nan if recent is None else recent
                meta[_STOP] = stop.requested
                sent, received, waited = ps.stats.bytes_sent, ps.stats.bytes_recv, ps.stats.wait_s
                logger.mark_exchange_start()
                watchdog.at(f"waiting for the server's reply to push {self.pushes + 1}")
                with timer("exchange_s"):
                    ps.push(grad, meta)
                    self.pushes += 1
                    alive = ps.pull(param, timeout_s=cfg.wait_timeout_s)
                owed[:] = 0.0
                _merge(this_push, timer.take())
                _merge(phases, this_push)
                logger.record(self.pushes, this_push, bytes_sent=ps.stats.bytes_sent - sent,
                              bytes_recv=ps.stats.bytes_recv - received,
                              wait_s=ps.stats.wait_s - waited, env_steps=int(meta[_STEPS]))
                watchdog.beat(self.pushes, "between pushes")
                if ps.snapshot:           # the server's cut: write this worker's side of it
                    self.stopped = not alive
                    self._save()
            if self.repeat >= cfg.update_repeat:
                self.batch = None
        stop.restore()
        watchdog.stop()

    def _save(self) -> None:
        self.generation += 1
        self.logger.log.flush()           # the log holds every row the checkpoint covers
        replica = self.replica
        batch = None
        if self.batch is not None and self.repeat < self.cfg.update_repeat:
            batch = dict(vars(self.batch))
        checkpoint.save(self.run_dir, self.ps.rank, {
            "generation": self.generation, "world_size": self.ps.size,
            "pushes": self.pushes, "skipped": self.skipped, "phases": dict(self.phases),
            "owed": self.owed.tolist(), "batch": batch, "repeat": self.repeat,
            "params": torch.from_numpy(replica.flat.param_np.copy()),
            "torch_rng": torch.get_rng_state(),
            "envs": checkpoint.env_state(replica.envs), "roller": replica.roller.state(),
            "episodes": self.episodes.state()}, self.generation)

    def _load(self, state: dict) -> None:
        replica = self.replica
        self.generation, self.pushes, self.skipped = (state["generation"], state["pushes"],
                                                      state["skipped"])
        self.phases = dict(state["phases"])
        self.owed[:] = state["owed"]
        if state["batch"] is not None:
            self.batch, self.repeat = Batch(**state["batch"]), state["repeat"]
        replica.flat.param_np[:] = state["params"].numpy()
        torch.set_rng_state(state["torch_rng"])
        seed = self.cfg.seed + 10000 * self.ps.rank + self.pushes
        if checkpoint.restore_env_state(replica.envs, state["envs"], seed):
            replica.roller.load_state(state["roller"])
        else:                             # the env could not be saved: a fresh start of it
            replica.roller.start(seed)
        self.episodes.load_state(state["episodes"])


def _merge(into: dict, phases: dict) -> dict:
    for phase, seconds in phases.items():
        into[phase] = into.get(phase, 0.0) + seconds
    return into


class _Snapshot:
    """An open snapshot: the workers whose flagged reply is still to be sent."""

    def __init__(self, generation: int, workers: set[int], stop: bool) -> None:
        self.generation, self.pending, self.stop = generation, set(workers), stop
        self.start = time.perf_counter()


class _Server:
    """The parameter server's loop, for async (quorum=None) and quorum modes."""

    def __init__(self, cfg: Config, ps: ParameterServer, replica: Replica,
                 progress: Progress, quorum: int | None, logger: RunLogger,
                 run_dir: Path, state: dict | None = None) -> None:
        self.cfg, self.ps, self.replica, self.progress = cfg, ps, replica, progress
        self.logger, self.run_dir = logger, run_dir
        self._apply_timer = PhaseTimer()
        self.quorum = quorum
        self.version = 0
        self.sent_version: dict[int, int] = {}
        self.received = {w: 0 for w in ps.workers}   # pushes taken, per worker
        self.rows = 0                                # rows in this rank's log
        self.env_steps = 0
        self.applied = self.dropped = 0
        self.staleness: list[int] = []
        self.window = [0.0, 0.0]                 # episodes, return sum since last report
        self.worker_time: dict[int, tuple[float, float]] = {}   # exchange_s, busy_s
        self.recent_means: dict[int, float] = {}
        self.active = set(ps.workers)
        self.stopping = False                    # the budget is spent: STOP every worker
        self.solved = False
        # snapshots
        self.generation = 0
        self.snap: _Snapshot | None = None
        self.stop_requested = False              # SIGTERM/SIGINT here or on a worker
        self.stopped = False                     # ended by a stop snapshot
        self.snapshots, self.snapshot_s = 0, 0.0
        # quorum state
        self.acc = np.zeros_like(replica.flat.grad_np)
        self.held: list[int] = []
        self.in_acc = 0
        self.fresh = 0
        self.resumed = state is not None
        if state is not None:
            self._load(state)

    def serve(self) -> None:
        param = self.replica.flat.param_np
        self.ps.open(param.size, param.dtype)
        if not self.resumed:      # resumed workers hold their checkpoint's parameters
            for worker in self.ps.workers:
                self._answer(worker)
        timer = PhaseTimer()
        faults = FaultInjector(self.cfg.fail, self.ps.rank)
        watchdog = Watchdog(self.ps.comm, self.cfg.watchdog_s, self.ps.rank)
        signals = StopFlag()
        self.logger.mark_update_start()
        while self.active:
            if signals.requested and not self.stop_requested:
                self._request_stop()
            faults.before_exchange(self.version + 1, param)   # exit / raise / hang only
            stats = self.ps.stats
            sent, received, waited = stats.bytes_sent, stats.bytes_recv, stats.wait_s
            applied, version_at_receipt = self.applied, self.version
            self.logger.mark_exchange_start()
            with timer("exchange_s"):
                worker, buf, meta = self.ps.wait_push(
                    timeout_s=self.cfg.wait_timeout_s,
                    only=None if self.snap is None else self.snap.pending)
            computed_on = self.sent_version[worker]
            self._account(worker, meta)
            with timer("optimizer_s"):
                if self.stopping:
                    self.dropped += 1
                    self._stop(worker)
                elif self.quorum is None:
                    self._apply_async(worker, buf)
                else:
                    self._hold_for_quorum(worker, buf)
            # one row per gradient received: the version it was computed on, its staleness
            self.logger.record(self.version, timer.take(),
                               bytes_sent=self.ps.stats.bytes_sent - sent,
                               bytes_recv=self.ps.stats.bytes_recv - received,
                               wait_s=stats.wait_s - waited,
                               env_steps=int(meta[_STEPS]), param_version=computed_on,
                               staleness=version_at_receipt - computed_on,
                               dropped=int(self.applied == applied))
            self.rows += 1
            if self.snap is not None and not self.snap.pending:
                self._close_snapshot()
            watchdog.beat(self.version, "waiting for pushes")
        signals.restore()
        watchdog.stop()
        self.ps.close(timeout_s=self.cfg.wait_timeout_s)
        if not self.stopped:
            self._report()
        self.progress.close()

    # -- the two policies -----------------------------------------------------------------
    def _apply_async(self, worker: int, buf: np.ndarray) -> None:
        self.staleness.append(self.version - self.sent_version[worker])
        self._step(buf)
        self.applied += 1
        if self._end_now():
            self._stop(worker)
            return
        if self._checkpoint_due():
            self._open_snapshot()       # this worker's reply is the snapshot's first flag
        self._answer(worker)

    def _hold_for_quorum(self, worker: int, buf: np.ndarray) -> None:
        staleness = self.version - self.sent_version[worker]
        if staleness == 0 or self.cfg.late == "apply":
            np.add(self.acc, buf, out=self.acc)
            self.in_acc += 1
            self.applied += 1
            self.staleness.append(staleness)
        else:
            self.dropped += 1
        self.fresh += staleness == 0
        self.held.append(worker)
        if self.fresh < self.quorum:
            return
        if self.snap is not None and len(self.held) < len(self.active):
            return                # a snapshot's round waits for every live worker
        np.divide(self.acc, self.in_acc, out=self.acc)
        self._step(self.acc)
        self.acc[:] = 0.0
        self.in_acc = self.fresh = 0
        held, self.held = self.held, []
        end = self._end_now()
        for w in held:
            if end:
                self._stop(w)
            else:
                self._answer(w)
        if not end and self._checkpoint_due():
            self._open_snapshot()       # the next round is the snapshot's

    # -- snapshots ----------------------------------------------------------------------------
    def _checkpoint_due(self) -> bool:
        every = self.cfg.checkpoint_every
        return (self.snap is None and bool(every) and self.version % every == 0) or \
            (self.snap is None and self.stop_requested)

    def _open_snapshot(self) -> None:
        self.generation += 1
        self.snap = _Snapshot(self.generation, self.active, stop=self.stop_requested)

    def _request_stop(self) -> None:
        self.stop_requested = True
        if self.snap is None and not self.stopping:
            self._open_snapshot()       # else: after the open one, or the run ends anyway

    def _close_snapshot(self) -> None:
        """Every live worker has been flagged: write the server's side of the cut."""
        snap, self.snap = self.snap, None
        assert not self.held, "a snapshot cut with pushes held"
        self.logger.log.flush()       # the log holds every row the checkpoint covers
        self.snapshots += 1
        self.snapshot_s += time.perf_counter() - snap.start
        saving = time.perf_counter()
        checkpoint.save(self.run_dir, self.ps.rank, self._state(snap.generation),
                        snap.generation)
        self.snapshot_s += time.perf_counter() - saving
        # every worker pushed again after writing generation G-1 before it could be
        # flagged for G: G-1 is complete on every rank, older ones are not needed
        checkpoint.remove_generations(self.run_dir, lambda g: g >= snap.generation - 1)
        if snap.stop:
            self.stopped = True
        elif self.stop_requested and not self.stopping:
            self._open_snapshot()

    def _end_now(self) -> bool:
        """The budget is spent (and no stop snapshot is under way): STOP every worker.
        A regular snapshot still open is dropped (its files are an incomplete generation)."""
        if self.snap is not None and self.snap.stop:
            return False
        self.stopping = self._budget_spent()
        if self.stopping:
            self.snap = None
        return self.stopping

    def _state(self, generation: int) -> dict:
        return {"generation": generation, "world_size": self.ps.size,
                "version": self.version, "env_steps": self.env_steps,
                "applied": self.applied, "dropped": self.dropped,
                "staleness": torch.tensor(self.staleness, dtype=torch.int64),
                "sent_version": dict(self.sent_version), "received": dict(self.received),
                "rows": self.rows, "window": [float(x) for x in self.window],
                "worker_time": {w: [float(e), float(b)]
                                for w, (e, b) in self.worker_time.items()},
                "recent_means": dict(self.recent_means), "solved": self.solved,
                "wall_s": self.progress.elapsed(), "snapshots": self.snapshots,
                "snapshot_s": self.snapshot_s,
                "params": torch.from_numpy(self.replica.flat.param_np.copy()),
                "adam": self.replica.opt.state_dict()}

    def _load(self, state: dict) -> None:
        self.replica.flat.param_np[:] = state["params"].numpy()
        self.replica.opt.load_state_dict(state["adam"])
        self.generation, self.version = state["generation"], state["version"]
        self.env_steps, self.applied, self.dropped = (state["env_steps"], state["applied"],
                                                      state["dropped"])
        self.staleness = state["staleness"].tolist()
        self.sent_version = dict(state["sent_version"])
        self.received = dict(state["received"])
        self.rows, self.window = state["rows"], list(state["window"])
        self.worker_time = {w: tuple(t) for w, t in state["worker_time"].items()}
        self.recent_means = dict(state["recent_means"])
        self.solved = state["solved"]
        self.snapshots, self.snapshot_s = state["snapshots"], state["snapshot_s"]

    # -- helpers ------------------------------------------------------------------------------
    def _step(self, grad: np.ndarray) -> None:
        """One Adam step on ``grad`` (read in place, no copy), then report if due."""
        flat = self.replica.flat.flat
        own_grad, flat.grad = flat.grad, torch.from_numpy(grad)
        try:
            self.replica.apply(self._apply_timer)   # serve() times the whole handling
        finally:
            flat.grad = own_grad
        self.version += 1
        if self.version % self.cfg.log_every == 0:
            self._report()

    def _answer(self, worker: int) -> None:
        """Send ``worker`` the parameters; flagged while a snapshot waits for it."""
        tag = TAG_PARAMS
        if self.snap is not None and worker in self.snap.pending:
            self.snap.pending.discard(worker)
            tag = TAG_SNAPSHOT
            if self.snap.stop:
                tag = TAG_SNAPSHOT_STOP       # its last reply: it pushes no more
                self.active.discard(worker)
        self.ps.reply(worker, self.replica.flat.param_np, tag=tag)
        self.sent_version[worker] = self.version

    def _stop(self, worker: int) -> None:
        self.ps.stop(worker)
        self.active.discard(worker)

    def _account(self, worker: int, meta: np.ndarray) -> None:
        self.received[worker] += 1
        if int(meta[_PUSHES]) != self.received[worker]:
            raise AccountingError(f"worker {worker} says this is its push {int(meta[_PUSHES])}"
                                  f", but it is the {self.received[worker]}th the server took")
        self.env_steps += int(meta[_STEPS])
        self.window[0] += float(meta[_EPISODES])
        self.window[1] += float(meta[_RETURNS])
        self.worker_time[worker] = (float(meta[_EXCHANGE]), float(meta[_BUSY]))
        if not np.isnan(meta[_RECENT]):
            self.recent_means[worker] = float(meta[_RECENT])
        if meta[_STOP] and not self.stop_requested:
            self._request_stop()          # this worker's reply is then flagged too

    def _budget_spent(self) -> bool:
        return self.env_steps >= self.cfg.total_steps or self.solved

    def _comm_share(self) -> float:
        exchange = sum(e for e, _ in self.worker_time.values())
        busy = sum(b for _, b in self.worker_time.values())
        return exchange / busy if busy else 0.0

    def _report(self) -> None:
        self.solved = self.solved or reached_target(
            self.cfg.target_return, list(self.recent_means.values()), len(self.ps.workers))
        recent = self.staleness[-100:]
        self.progress.report(update=self.version, env_steps=self.env_steps,
                             episodes=self.window[0], return_sum=self.window[1],
                             comm_share=self._comm_share(),
                             mean_staleness=float(np.mean(recent)) if recent else 0.0)
        self.window = [0.0, 0.0]

    def fill(self, summary: Summary) -> None:
        summary.updates = self.version
        summary.env_steps = self.env_steps
        summary.wall_s = self.progress.elapsed()
        summary.gradients_applied = self.applied
        summary.gradients_dropped = self.dropped
        summary.mean_staleness = float(np.mean(self.staleness)) if self.staleness else 0.0
        summary.comm_share = self._comm_share()
        summary.param_digest = self.replica.param_digest()
        summary.reached_target = self.solved
        summary.snapshots, summary.snapshot_s = self.snapshots, self.snapshot_s
