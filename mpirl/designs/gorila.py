"""gorila (and async with ``--servers S > 1``): a sharded parameter server.

Wiring: ranks ``0..S-1`` (``--servers S``) are parameter servers, server ``k`` holding
the contiguous shard ``k`` of the flat parameter vector and that shard's optimizer
(:class:`~mpirl.parts.server.ShardOptimizer`); every other rank is a worker with its
envs and a full replica.  What travels
(:class:`topologies.shardedps.ShardedParameterServer`): each worker pushes shard ``k``
of its gradient to server ``k`` and pulls shard ``k`` of the parameters back, for every
``k`` at once; each server applies every push on arrival and answers that worker
alone, independently of the other servers (Gorila / DistBelief's asynchronous
per-shard updates).  A worker therefore acts with shards of different ages.

* ``gorila``: each worker is an actor-learner running Gorila's learner, the n-step
  double DQN of :mod:`mpirl.parts.learner.dqn` (Ape-X's), over its own local replay
  (``--gorila-replay local``: a :class:`~mpirl.parts.replay.PrioritizedReplay`; set
  ``--replay-alpha 0`` for Gorila's uniform one), with epsilon-greedy exploration
  (Ape-X's per-worker epsilons) and a target network re-synced from the parameters it
  pulled every ``--target-update`` of its pushes.
  ``--target-return`` is judged on the greediest worker's episodes (the last one).
* ``async --servers S``: A3C's workers (:class:`mpirl.designs.paramserver.Worker`)
  with their gradients split over S servers: the same workload as ``async``, so the
  effect of sharding the master's traffic can be measured.

Clipping by global norm happens on the worker, where the gradient is whole; servers do
not clip.  Server 0 keeps the books (env steps, episodes, the stop flags of every
push's meta) and decides the end: it answers each worker's next push with STOP, and
the worker leaves the other shards (a leaving push, ``leave`` set in its meta, which
they answer with STOP).  A shard other than 0 may so apply a worker's last gradient
that shard 0 dropped: the shards end within one push of each other, as asynchronous
sharded servers do.  Accounting, checked on every shard: pushes received = applied +
dropped (leaving pushes are counted apart).  No checkpoints yet (refused at start).
Every shard records the order of the pushes it took (``--replay-schedule``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

from topologies.shardedps import ShardedParameterServer

from ..config import Config
from ..parts.learner.dqn import EpsilonGreedy, apex_epsilon
from ..parts.replay import PrioritizedReplay, beta_at
from ..parts.server import AsyncPolicy, ShardOptimizer
from ..parts.transitions import TransitionLayout, as_batch, fill
from ..resilience.guard import Guard
from ..resilience.schedule import Schedule
from ..telemetry.progress import Progress
from ..telemetry.runlog import RunLogger
from ..telemetry.timing import PhaseTimer, add_phases
from .apex import build_dqn
from .common import Episodes, Summary, build_replica, check_same_model, final_mean_return
from .paramserver import _PUSHES, _STEPS, META, AccountingError, ServerBook, Worker

#: a worker's push meta: the parameter server's, plus "this push only leaves the shard"
GORILA_META = (*META, "leave")
_LEAVE = len(META)
LEFT = -2            # a shard's schedule: the version of a leaving push


def run_gorila(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    return run_sharded(cfg, comm, run_dir, dqn=True)


def run_sharded(cfg: Config, comm: MPI.Comm, run_dir: Path, *, dqn: bool) -> Summary:
    """gorila (``dqn``) or async over ``--servers`` shards."""
    rank, size, servers = comm.Get_rank(), comm.Get_size(), cfg.servers
    is_server = rank < servers
    if dqn:
        learner, actor = build_dqn(cfg, rank, with_actor=not is_server)
    else:
        learner, actor = build_replica(cfg, rank, with_actor=not is_server)
    check_same_model(comm, learner)
    leave = np.zeros(len(GORILA_META))
    leave[_LEAVE] = 1.0
    sps = ShardedParameterServer(comm, servers, learner.params.size, meta_len=len(GORILA_META),
                                 leave_meta=leave)
    summary = Summary(mode=cfg.mode, topology=cfg.topology, ranks=size,
                      gradient_bytes=learner.grad.nbytes)
    episodes = None
    if is_server:
        part = ShardServer(cfg, sps, learner, run_dir)
        part.serve()
    else:
        part = (GorilaWorker if dqn else ShardedA3CWorker)(cfg, sps, learner, actor, run_dir)
        part.work()
        episodes = part.episodes
    _settle(summary, comm, sps, part, learner)
    summary.final_mean_return = final_mean_return(comm, episodes)
    part.log.close(summary.totals())
    sps.free()
    return summary


def _settle(summary: Summary, comm: MPI.Comm, sps: ShardedParameterServer, part,
            learner) -> None:
    """Totals over every rank, checked; rank 0 holds shard 0's books."""
    pushes = comm.allreduce(0 if sps.is_server else part.pushes)
    summary.phase_s = comm.bcast(part.phases if comm.Get_rank() == sps.servers else None,
                                 root=sps.servers)
    shards = comm.gather(sps.slice(learner.params, sps.shard).copy() if sps.is_server
                         else None, root=0)
    if comm.Get_rank() != 0:
        return
    part.fill(summary)
    summary.gradients_sent = pushes
    summary.param_digest = hashlib.sha256(
        np.concatenate(shards[:sps.servers]).tobytes()).hexdigest()
    if pushes != summary.gradients_applied + summary.gradients_dropped:
        raise AccountingError(f"workers sent {pushes} gradients but shard 0 applied "
                              f"{summary.gradients_applied} and dropped "
                              f"{summary.gradients_dropped}")


class ShardServer:
    """One shard's server: apply every push to this shard on arrival and answer its
    worker; shard 0 also keeps the books and decides the end."""

    def __init__(self, cfg: Config, sps: ShardedParameterServer, learner, run_dir: Path) -> None:
        self.cfg, self.sps, self.ps = cfg, sps, sps.server
        self.params = sps.slice(learner.params, sps.shard)        # a view: the shard
        self.opt = ShardOptimizer(self.params, cfg.lr)
        self.policy = AsyncPolicy()
        self.decides = sps.shard == 0
        self.book = ServerBook(self.ps.workers, sps.size)
        self.active = set(self.ps.workers)
        self.received = {w: 0 for w in self.ps.workers}
        self.leaves = 0
        self.stopping = False
        self.phases: dict[str, float] = {}
        self.run_dir = run_dir
        self.progress = Progress(run_dir, enabled=self.decides)
        self.log = RunLogger(cfg, sps.comm, run_dir, role="server")
        # the order of the pushes this shard took: recorded, or enforced (--replay-schedule)
        self.schedule = Schedule(run_dir, sps.rank, cfg.replay_schedule)

    def serve(self) -> None:
        ps, policy, cfg = self.ps, self.policy, self.cfg
        ps.open(self.params.size, self.params.dtype)
        for worker in ps.workers:
            ps.reply(worker, self.params)
            policy.sent(worker)
        timer = PhaseTimer()
        with Guard(cfg, self.sps.comm, self.sps.rank) as guard:
            self.log.begin()
            while self.active:
                stats = ps.stats
                sent, received, waited = stats.bytes_sent, stats.bytes_recv, stats.wait_s
                version = policy.version
                scheduled = self.schedule.next()       # a replay: this worker's push next
                with timer("exchange_s"):
                    worker, buf, meta = ps.wait_push(
                        timeout_s=cfg.wait_timeout_s,
                        only=None if scheduled is None else (scheduled,))
                if meta[_LEAVE]:
                    self.schedule.take(worker, LEFT)
                    self.leaves += 1
                    self._stop(worker)
                    continue
                computed_on, applied = policy.sent_version[worker], policy.applied
                self.schedule.take(worker, computed_on)
                with timer("optimizer_s"):
                    self._handle(worker, buf, meta, guard.stop_requested)
                add_phases(self.phases, self.log.record(
                    policy.version, timer, bytes_sent=stats.bytes_sent - sent,
                    bytes_recv=stats.bytes_recv - received, wait_s=stats.wait_s - waited,
                    env_steps=int(meta[_STEPS]), param_version=computed_on,
                    staleness=version - computed_on, dropped=int(policy.applied == applied)))
                guard.beat(policy.version, "waiting for pushes")
        ps.close(timeout_s=cfg.wait_timeout_s)
        self.schedule.save()
        if self.decides:
            self._report()
        self.progress.close()

    def _handle(self, worker: int, buf: np.ndarray, meta: np.ndarray, signalled: bool) -> None:
        self.received[worker] += 1
        if self.decides:
            asks_stop = self.book.account(worker, meta)
        elif int(meta[_PUSHES]) != self.received[worker]:
            raise AccountingError(f"shard {self.sps.shard}: worker {worker} says this is its "
                                  f"push {int(meta[_PUSHES])}, but it is the "
                                  f"{self.received[worker]}th this shard took")
        if self.stopping:
            self.policy.drop()
            self._stop(worker)
            return
        self.policy.push(worker, buf)
        self.opt.step(buf)
        self.policy.stepped()
        if self.decides:
            if self.policy.version % self.cfg.log_every == 0:
                self._report()
            book = self.book
            self.stopping = (book.env_steps >= self.cfg.total_steps or book.solved
                             or asks_stop or signalled)
        if self.stopping:
            self._stop(worker)
        else:
            self.ps.reply(worker, self.params)
            self.policy.sent(worker)

    def _stop(self, worker: int) -> None:
        self.ps.stop(worker)
        self.active.discard(worker)

    def _report(self) -> None:
        # gorila: judged on the greediest worker alone (the others explore by design)
        judges = 1 if self.cfg.mode == "gorila" else len(self.ps.workers)
        self.book.report(self.progress, self.policy, self.cfg.target_return, judges)

    def fill(self, summary: Summary) -> None:
        self.book.fill(summary, self.policy, self.progress)
        np.save(self.run_dir / "staleness.npy",
                np.asarray(self.policy.staleness, dtype=np.int64))


class ShardedA3CWorker(Worker):
    """async's worker over sharded servers: the same loop, the gradient clipped here."""

    def __init__(self, cfg: Config, sps: ShardedParameterServer, learner, actor,
                 run_dir: Path) -> None:
        super().__init__(cfg, sps, learner, actor, run_dir, generation=None)
        self.clip_norm = cfg.max_grad_norm


class GorilaWorker:
    """Gorila's actor-learner: roll out epsilon-greedily into a local replay, sample a
    batch, compute the double-DQN gradient, push its shards, pull the parameters."""

    def __init__(self, cfg: Config, sps: ShardedParameterServer, learner, actor,
                 run_dir: Path) -> None:
        self.cfg, self.ps, self.learner, self.actor = cfg, sps, learner, actor
        index = sps.rank - sps.servers
        generator = torch.Generator().manual_seed(cfg.seed + 10000 * sps.rank + 1)
        self.policy = EpsilonGreedy(learner.model, apex_epsilon(
            index, len(sps.workers), cfg.apex_eps, cfg.apex_eps_alpha), generator)
        self.greediest = index == len(sps.workers) - 1   # judges --target-return
        per_rollout = cfg.num_envs * cfg.rollout_steps
        self.layout = TransitionLayout(learner.obs_space.shape, per_rollout, cfg.replay_batch)
        self.replay = PrioritizedReplay(cfg.replay_capacity, self.layout.transition,
                                        alpha=cfg.replay_alpha, eps=cfg.replay_eps)
        self.block = np.zeros(per_rollout, dtype=self.layout.transition)
        self.sample = np.zeros(cfg.replay_batch, dtype=self.layout.transition)
        self.rng = np.random.default_rng(cfg.seed + 10000 * sps.rank)
        self.warmup = max(cfg.replay_batch, cfg.learning_starts // len(sps.workers))
        self.episodes = Episodes()
        self.owed = np.zeros(3)
        self.pushes = self.rollouts = self.inserted = self.skipped = 0
        self.phases: dict[str, float] = {}
        self.log = RunLogger(cfg, sps.comm, run_dir, role="worker")

    def work(self) -> None:
        cfg, ps, learner = self.cfg, self.ps, self.learner
        timer, meta = PhaseTimer(), np.zeros(len(GORILA_META))
        with Guard(cfg, ps.comm, ps.rank) as guard:
            with timer("exchange_s"):
                alive = ps.pull(learner.params, timeout_s=cfg.wait_timeout_s)
            learner.sync_target()
            add_phases(self.phases, timer.take())
            self.log.begin()
            while alive:
                guard.at(f"collecting rollout {self.rollouts + 1}")
                self._collect(timer)
                if len(self.replay) < self.warmup:
                    continue
                for _ in range(cfg.update_repeat):
                    losses = self._gradient(timer)
                    if not guard.check(self.pushes + self.skipped + 1, learner.grad):
                        self.skipped += 1      # --nan-policy skip: not pushed
                        continue
                    alive = self._exchange(meta, timer, guard.stop_requested, losses)
                    guard.beat(self.pushes, "between pushes")
                    if not alive:
                        break

    def _collect(self, timer) -> None:
        cfg, actor = self.cfg, self.actor
        rollout = actor.collect(self.policy, cfg.rollout_steps, timer)
        with timer("backward_s"):
            trans = self.learner.transitions(rollout, actor.obs)
            prios = self.learner.initial_priorities(trans["obs"], trans["action"], trans["ret"],
                                                    trans["disc"], trans["next_obs"])
            n = fill(self.block, trans, prios, self.pushes)
            self.replay.add(self.block[:n], prios)
        self.inserted += n
        self.rollouts += 1
        finished = actor.drain_episodes()
        self.episodes.add(finished)
        self.log.episodes(self.pushes + 1, finished)
        self.log.sim_times(self.pushes + 1, actor.drain_sim_times())
        self.owed += (cfg.steps_per_batch, len(finished), sum(r for r, _ in finished))

    def _gradient(self, timer) -> dict:
        cfg, learner = self.cfg, self.learner
        with timer("backward_s"):
            beta = beta_at(self.pushes, cfg.replay_beta, cfg.beta_anneal_steps)
            idx, stamps, weights = self.replay.sample(cfg.replay_batch, self.rng, beta,
                                                      out=self.sample)
            batch = as_batch(self.sample, weights)
        parts, td = learner.gradient(batch, timer)
        with timer("backward_s"):
            self.replay.update_priorities(idx, stamps, td)
            if cfg.max_grad_norm > 0:
                learner.clip_grad(cfg.max_grad_norm)
        return parts

    def _exchange(self, meta: np.ndarray, timer, stop: bool, losses: dict) -> bool:
        cfg, ps, learner = self.cfg, self.ps, self.learner
        meta[:] = 0.0
        meta[_STEPS:_STEPS + 3] = self.owed
        meta[_PUSHES] = self.pushes + 1
        recent = self.episodes.recent_mean()
        meta[META.index("recent_mean")] = (np.nan if recent is None or not self.greediest
                                           else recent)
        meta[META.index("stop")] = stop
        meta[META.index("busy_s")] = sum(self.phases.values()) + timer.total()
        meta[META.index("exchange_s")] = self.phases.get("exchange_s", 0.0)
        stats = ps.stats
        sent, received, waited = stats.bytes_sent, stats.bytes_recv, stats.wait_s
        with timer("exchange_s"):
            ps.push(learner.grad, meta)
            self.pushes += 1
            alive = ps.pull(learner.params, timeout_s=cfg.wait_timeout_s)
        if self.pushes % cfg.target_update == 0:
            learner.sync_target()
        add_phases(self.phases, self.log.record(
            self.pushes, timer, bytes_sent=stats.bytes_sent - sent,
            bytes_recv=stats.bytes_recv - received, wait_s=stats.wait_s - waited,
            env_steps=int(self.owed[0]), inserted=self.inserted,
            sampled=cfg.replay_batch, replay_size=len(self.replay),
            value_loss=losses["value_loss"]))
        self.owed[:] = 0.0
        self.inserted = 0
        return alive
