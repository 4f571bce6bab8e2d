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
checked at the end (sent == applied + dropped).  Shutdown: once the env-step budget is
reached, each worker's next push is taken, counted as dropped, and answered with STOP,
so no message is left in flight when MPI finalizes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

from topologies.paramserver import ParameterServer

from ..config import Config
from ..progress import Progress
from ..replica import Replica
from ..timing import PhaseTimer
from ..faults import FaultInjector, Watchdog, check_gradient
from .common import (Episodes, RunLogger, Summary, check_same_model, final_mean_return,
                     reached_target)

#: the numbers a worker sends with every push (float64).
META = ("env_steps", "episodes", "return_sum", "pushes", "exchange_s", "busy_s",
        "recent_mean")   # recent_mean: NaN until the worker has finished 20 episodes
_STEPS, _EPISODES, _RETURNS, _PUSHES, _EXCHANGE, _BUSY, _RECENT = range(len(META))


class AccountingError(RuntimeError):
    """Gradients sent by workers do not add up to gradients applied plus dropped."""


def run_async(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    return _run(cfg, comm, run_dir, quorum=None)


def run_quorum(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    return _run(cfg, comm, run_dir, quorum=cfg.quorum_size(comm.Get_size()))


def _run(cfg: Config, comm: MPI.Comm, run_dir: Path, quorum: int | None) -> Summary:
    rank = comm.Get_rank()
    ps = ParameterServer(comm, root=0, meta_len=len(META))
    replica = Replica(cfg, rank, with_envs=not ps.is_server)
    check_same_model(comm, replica)
    summary = Summary(mode=cfg.mode, topology=cfg.topology, ranks=comm.Get_size(),
                      gradient_bytes=replica.flat.grad_np.nbytes)
    logger = RunLogger(cfg, comm, run_dir, role="server" if ps.is_server else "worker")
    episodes = None
    if ps.is_server:
        server = _Server(cfg, ps, replica, Progress(run_dir, enabled=True), quorum, logger)
        server.serve()
        server.fill(summary)
        # staleness of every applied gradient, in the order they were applied
        np.save(run_dir / "staleness.npy", np.asarray(server.staleness, dtype=np.int64))
    else:
        episodes = Episodes()
        pushes, phases, skipped = _work(cfg, ps, replica, episodes, logger)
        summary.gradients_sent = pushes
        summary.updates_skipped = skipped
        if rank == 1:
            summary.phase_s = phases
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
    logger.close(summary.totals())
    return summary


def _work(cfg: Config, ps: ParameterServer, replica: Replica, episodes: Episodes,
          logger: RunLogger) -> tuple[int, dict, int]:
    """A worker's loop; returns how many gradients it pushed, its seconds per phase and
    how many non-finite gradients it skipped (``--nan-policy skip``)."""
    rank = ps.rank
    param, grad = replica.flat.param_np, replica.flat.grad_np
    meta = np.zeros(len(META))
    timer, phases = PhaseTimer(), {}
    pushes = skipped = 0
    owed = np.zeros(3)          # env steps, episodes, return sum not yet reported
    faults = FaultInjector(cfg.fail, rank)
    watchdog = Watchdog(ps.comm, cfg.watchdog_s, rank)
    with timer("exchange_s"):
        alive = ps.pull(param, timeout_s=cfg.wait_timeout_s)      # the initial parameters
    _merge(phases, timer.take())
    logger.mark_update_start()
    while alive:
        watchdog.at(f"computing push {pushes + 1}")
        batch = replica.collect(timer)
        finished = replica.roller.drain_episodes()
        episodes.add(finished)
        logger.episodes(pushes, finished)
        logger.sim_times(pushes + 1, replica.roller.drain_sim_times())
        owed += (replica.steps_per_batch, len(finished), sum(r for r, _ in finished))
        for _repeat in range(cfg.update_repeat):
            replica.gradient(batch, timer)
            faults.before_exchange(pushes + skipped + 1, grad)
            if not check_gradient(grad, cfg.nan_policy, rank, pushes + skipped + 1):
                skipped += 1          # not pushed; its env steps travel with the next push
                continue
            this_push = timer.take()
            meta[_STEPS], meta[_EPISODES], meta[_RETURNS] = owed
            meta[_PUSHES] = pushes + 1
            meta[_EXCHANGE] = phases.get("exchange_s", 0.0)
            meta[_BUSY] = sum(phases.values()) + sum(this_push.values())
            recent = episodes.recent_mean()
            meta[_RECENT] = np.nan if recent is None else recent
            sent, received, waited = ps.stats.bytes_sent, ps.stats.bytes_recv, ps.stats.wait_s
            logger.mark_exchange_start()
            watchdog.at(f"waiting for the server's reply to push {pushes + 1}")
            with timer("exchange_s"):
                ps.push(grad, meta)
                pushes += 1
                alive = ps.pull(param, timeout_s=cfg.wait_timeout_s)
            owed[:] = 0.0
            _merge(this_push, timer.take())
            _merge(phases, this_push)
            logger.record(pushes, this_push, bytes_sent=ps.stats.bytes_sent - sent,
                          bytes_recv=ps.stats.bytes_recv - received,
                          wait_s=ps.stats.wait_s - waited, env_steps=int(meta[_STEPS]))
            watchdog.beat(pushes, "between pushes")
            if not alive:
                break
    watchdog.stop()
    return pushes, phases, skipped


def _merge(into: dict, phases: dict) -> dict:
    for phase, seconds in phases.items():
        into[phase] = into.get(phase, 0.0) + seconds
    return into


class _Server:
    """The parameter server's loop, for async (quorum=None) and quorum modes."""

    def __init__(self, cfg: Config, ps: ParameterServer, replica: Replica,
                 progress: Progress, quorum: int | None, logger: RunLogger) -> None:
        self.cfg, self.ps, self.replica, self.progress = cfg, ps, replica, progress
        self.logger = logger
        self._apply_timer = PhaseTimer()
        self.quorum = quorum
        self.version = 0
        self.sent_version: dict[int, int] = {}
        self.env_steps = 0
        self.applied = self.dropped = 0
        self.staleness: list[int] = []
        self.window = [0.0, 0.0]                 # episodes, return sum since last report
        self.worker_time: dict[int, tuple[float, float]] = {}   # exchange_s, busy_s
        self.recent_means: dict[int, float] = {}
        self.active = set(ps.workers)
        self.stopping = False
        self.solved = False
        # quorum state
        self.acc = np.zeros_like(replica.flat.grad_np)
        self.held: list[int] = []
        self.in_acc = 0
        self.fresh = 0

    def serve(self) -> None:
        param = self.replica.flat.param_np
        self.ps.open(param.size, param.dtype)
        for worker in self.ps.workers:
            self._answer(worker)
        timer = PhaseTimer()
        faults = FaultInjector(self.cfg.fail, self.ps.rank)
        watchdog = Watchdog(self.ps.comm, self.cfg.watchdog_s, self.ps.rank)
        self.logger.mark_update_start()
        while self.active:
            faults.before_exchange(self.version + 1, param)   # exit / raise / hang only
            stats = self.ps.stats
            sent, received, waited = stats.bytes_sent, stats.bytes_recv, stats.wait_s
            applied, version_at_receipt = self.applied, self.version
            self.logger.mark_exchange_start()
            with timer("exchange_s"):
                worker, buf, meta = self.ps.wait_push(timeout_s=self.cfg.wait_timeout_s)
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
            watchdog.beat(self.version, "waiting for pushes")
        watchdog.stop()
        self.ps.close(timeout_s=self.cfg.wait_timeout_s)
        self._report()
        self.progress.close()

    # -- the two policies -----------------------------------------------------------------
    def _apply_async(self, worker: int, buf: np.ndarray) -> None:
        self.staleness.append(self.version - self.sent_version[worker])
        self._step(buf)
        self.applied += 1
        if self._budget_spent():
            self.stopping = True
            self._stop(worker)
        else:
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
        np.divide(self.acc, self.in_acc, out=self.acc)
        self._step(self.acc)
        self.acc[:] = 0.0
        self.in_acc = self.fresh = 0
        held, self.held = self.held, []
        self.stopping = self._budget_spent()
        for w in held:
            if self.stopping:
                self._stop(w)
            else:
                self._answer(w)

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
        self.ps.reply(worker, self.replica.flat.param_np)
        self.sent_version[worker] = self.version

    def _stop(self, worker: int) -> None:
        self.ps.stop(worker)
        self.active.discard(worker)

    def _account(self, worker: int, meta: np.ndarray) -> None:
        self.env_steps += int(meta[_STEPS])
        self.window[0] += meta[_EPISODES]
        self.window[1] += meta[_RETURNS]
        self.worker_time[worker] = (meta[_EXCHANGE], meta[_BUSY])
        if not np.isnan(meta[_RECENT]):
            self.recent_means[worker] = float(meta[_RECENT])

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

