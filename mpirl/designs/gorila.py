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
  double DQN of :mod:`mpirl.parts.learner.dqn` (Ape-X's), with epsilon-greedy
  exploration (Ape-X's per-worker epsilons) and a target network re-synced from the
  parameters it pulled every ``--target-update`` of its pushes.  Its replay memory:

  - ``--gorila-replay local``: its own :class:`~mpirl.parts.replay.PrioritizedReplay`
    (set ``--replay-alpha 0`` for Gorila's uniform one);
  - ``--gorila-replay service``: Gorila's distributed replay memory, as the
    :mod:`~mpirl.kit.replayservice` ranks Ape-X uses.  Ranks ``S..S+R-1``
    (``--replay-ranks R``) are replay ranks; worker ``i`` inserts its rollouts into
    replay ``S + i mod R`` (one block in flight) and samples its batches from it (one
    request in flight, carrying the previous batch's priorities; the next request
    leaves as soon as a gradient is computed, so it travels during the push).  A
    worker waits for a batch once its replay reported its warm-up size (with
    ``--train-intensity``, never: it polls, and collects more while held).
  ``--target-return`` is judged on the greediest worker's episodes (the last one).
* ``async --servers S``: A3C's workers (:class:`mpirl.kit.pushpull.Worker`)
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
Every shard records the order of the pushes it took (``--replay-schedule``); with replay
ranks, each replay rank records its order of blocks, requests and answers, and each
worker whether each look for its batch found it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

from topologies.shardedps import ShardedParameterServer

from ..config import Config
from ..errors import AccountingError
from ..kit.common import Episodes, Summary, build_dqn
from ..kit.pushpull import PUSH_META
from ..kit.memory import LocalMemory
from ..kit.replayservice import BlockSender, SampleClient, replay_warmup
from ..kit.shards import GORILA_META, ShardComms, run_sharded
from ..parts.replay import beta_at
from ..parts.transitions import BATCH_META, TransitionLayout, as_batch, initial_priorities
from ..resilience.guard import Guard
from ..resilience.schedule import BATCH, Schedule
from ..telemetry.runlog import RunLogger
from ..telemetry.schema import LOSSES
from ..telemetry.timing import PhaseTimer, add_phases


def run_gorila(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    return run_sharded(cfg, comm, run_dir, build=build_dqn, make_worker=_worker,
                       transitions=True)


def _worker(cfg: Config, comms: ShardComms, sps: ShardedParameterServer, learner, actor,
            layout: TransitionLayout, run_dir: Path) -> "GorilaWorker":
    """A worker with its replay memory: its own, or its replay rank's client."""
    rank = comms.world.Get_rank()
    memory = (ServiceMemory(cfg, comms.world, comms.samples, comms.replay_of(rank), layout,
                            run_dir)
              if comms.replays else LocalMemory(cfg, layout, rank, len(comms.workers)))
    return GorilaWorker(cfg, comms.world, sps, learner, actor, memory, run_dir)


class ServiceMemory:
    """``--gorila-replay service``: one replay rank of :mod:`.replayservice`, inserted
    into and sampled from over MPI."""

    def __init__(self, cfg: Config, comm: MPI.Comm, samples_comm: MPI.Comm, replay: int,
                 layout: TransitionLayout, run_dir: Path) -> None:
        self.sender = BlockSender(comm, replay, layout, cfg.wait_timeout_s)
        self.sampler = SampleClient(samples_comm, replay, layout, cfg.wait_timeout_s)
        self.warmup, self.replay = replay_warmup(cfg), replay
        self.waits = not cfg.train_intensity  # else the replay may hold a request long
        self.slots: tuple = ()
        # whether each look found the batch there: recorded, or enforced (a replay)
        self.schedule = Schedule(run_dir, comm.Get_rank(), cfg.replay_schedule)

    @property
    def channels(self) -> tuple:
        return (self.sender, self.sampler)

    def insert(self, trans: dict, prios: np.ndarray, version: int, timer) -> int:
        return self.sender.ship(trans, prios, version, timer)

    def batch(self, beta: float, timer) -> dict | None:
        """The batch asked for last, once it is here; None while the replay holds it
        (the worker collects more meanwhile)."""
        sampler, schedule = self.sampler, self.schedule
        if not sampler.in_flight:
            sampler.ask(beta)
        with timer("data_wait_s"):
            if schedule.replaying:              # there when the recorded run found it
                got = schedule.upcoming() == (BATCH, 1)
            else:
                got = self.waits and self.sender.size >= self.warmup
            if got:
                sampler.wait()
            elif not schedule.replaying:
                got = sampler.poll()
        schedule.take(BATCH, int(got))
        if not got:
            return None
        reply = sampler.batch[0]
        if int(reply["meta"][BATCH_META["count"]]) == 0:
            raise AccountingError(f"replay rank {self.replay} sent an empty batch while "
                                  "this worker inserts")
        self.slots = (reply["idx"].copy(), reply["stamp"].copy())
        return as_batch(reply["trans"], reply["weight"])

    def priorities(self, td: np.ndarray, beta: float) -> None:
        """The batch's new priorities travel with the next request, sent now."""
        self.sampler.owe(*self.slots, td)
        self.sampler.ask(beta)

    def size(self) -> int:
        return self.sender.size

    def leave(self, timer) -> None:
        self.sender.leave(timer)
        self.sampler.end()
        self.schedule.save()

    def counts(self) -> dict:
        return {"transitions_sent": self.sender.transitions,
                "priority_sent": self.sampler.prio_sent}


class GorilaWorker:
    """Gorila's actor-learner: roll out epsilon-greedily into its replay memory (local,
    or a replay rank), take a batch, compute the double-DQN gradient, push its shards,
    pull the parameters."""

    def __init__(self, cfg: Config, comm: MPI.Comm, sps: ShardedParameterServer, learner,
                 actor, memory: LocalMemory | ServiceMemory, run_dir: Path) -> None:
        self.cfg, self.comm, self.ps, self.learner, self.actor = cfg, comm, sps, learner, actor
        self.memory = memory
        index = sps.rank - sps.servers
        generator = torch.Generator().manual_seed(cfg.seed + 10000 * comm.Get_rank() + 1)
        self.policy = learner.actor_policy(index, len(sps.workers), generator)
        self.greediest = index == len(sps.workers) - 1   # judges --target-return
        self.episodes = Episodes()
        self.owed = np.zeros(3)
        self.pushes = self.rollouts = self.inserted = self.skipped = 0
        self.phases: dict[str, float] = {}
        self.log = RunLogger(cfg, comm, run_dir, role="worker")

    def run(self) -> None:
        cfg, ps, learner = self.cfg, self.ps, self.learner
        timer, meta = PhaseTimer(), np.zeros(len(GORILA_META))
        with Guard(cfg, self.comm, self.comm.Get_rank()) as guard:
            with timer("exchange_s"):
                alive = ps.pull(learner.params, timeout_s=cfg.wait_timeout_s)
            learner.sync_target()
            # its waits are the exchange's (a replay rank's waits are data_wait_s)
            self.log.watch(ps, *self.memory.channels, waits=(ps,))
            self.log.begin(timer, self.phases)
            while alive:
                # a rollout is progress too (a warm-up pushes nothing)
                guard.beat(self.pushes, f"collecting rollout {self.rollouts + 1}")
                self._collect(timer)
                for _ in range(cfg.update_repeat):
                    losses = self._gradient(timer)
                    if losses is None:
                        break                  # no batch yet: collect more
                    if not guard.check(self.pushes + self.skipped + 1, learner.grad):
                        self.skipped += 1      # --nan-policy skip: not pushed
                        continue
                    alive = self._exchange(meta, timer, guard.stop_requested, losses)
                    guard.beat(self.pushes, "between pushes")
                    if not alive:
                        break
            self.memory.leave(timer)

    def _collect(self, timer) -> None:
        cfg, actor = self.cfg, self.actor
        rollout = actor.collect(self.policy, cfg.rollout_steps, timer)
        with timer("backward_s"):
            trans = self.learner.transitions(rollout, actor.obs)
            prios = initial_priorities(self.learner, trans, cfg.replay_alpha)
        self.inserted += self.memory.insert(trans, prios, self.pushes, timer)
        self.rollouts += 1
        finished = actor.drain_episodes()
        self.episodes.add(finished)
        self.log.episodes(self.pushes + 1, finished)
        self.log.sim_times(self.pushes + 1, actor.drain_sim_times())
        self.owed += (cfg.steps_per_batch, len(finished), sum(r for r, _ in finished))

    def _gradient(self, timer) -> dict | None:
        cfg, learner = self.cfg, self.learner
        with timer("backward_s"):
            beta = beta_at(self.pushes, cfg.replay_beta, cfg.beta_anneal_steps)
            batch = self.memory.batch(beta, timer)
        if batch is None:
            return None
        parts, td = learner.gradient(batch, timer)
        with timer("backward_s"):
            self.memory.priorities(td, beta)
            if cfg.max_grad_norm > 0:
                learner.clip_grad(cfg.max_grad_norm)
        return parts

    def counts(self) -> dict:
        """Its ledger's counts: its pushes and its replay memory's."""
        return {"gradients_sent": self.pushes, "updates_skipped": self.skipped,
                **self.memory.counts()}

    def _exchange(self, meta: np.ndarray, timer, stop: bool, losses: dict) -> bool:
        cfg, ps, learner = self.cfg, self.ps, self.learner
        meta[:] = 0.0
        meta[PUSH_META["env_steps"]:PUSH_META["env_steps"] + 3] = self.owed
        meta[PUSH_META["pushes"]] = self.pushes + 1
        recent = self.episodes.recent_mean()
        meta[PUSH_META["recent_mean"]] = (np.nan if recent is None or not self.greediest
                                           else recent)
        meta[PUSH_META["stop"]] = stop
        meta[PUSH_META["busy_s"]] = sum(self.phases.values()) + timer.total()
        meta[PUSH_META["exchange_s"]] = self.phases.get("exchange_s", 0.0)
        with timer("exchange_s"):
            ps.push(learner.grad, meta)
            self.pushes += 1
            alive = ps.pull(learner.params, timeout_s=cfg.wait_timeout_s)
        learner.update_target(self.pushes)
        add_phases(self.phases, self.log.record(
            self.pushes, timer, env_steps=int(self.owed[0]), inserted=self.inserted,
            sampled=cfg.replay_batch, replay_size=self.memory.size(),
            **{k: v for k, v in losses.items() if k in LOSSES}))
        self.owed[:] = 0.0
        self.inserted = 0
        return alive
