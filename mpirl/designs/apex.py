"""apex (Ape-X): actors ship prioritized n-step transitions to replay ranks; one learner
samples them by priority, trains an n-step double DQN and sends priorities back.

Wiring: rank 0 is the learner (a :class:`~mpirl.parts.learner.dqn.DqnLearner`, no env),
ranks ``1..R`` (``--replay-ranks R``) are replay ranks, each a
:class:`~mpirl.parts.replay.PrioritizedReplay` of ``--replay-capacity / R`` transitions
served over MPI; every other rank is an actor.  ``--target-return`` is judged on the
greediest actor's last 20 episodes (the last one, epsilon ``eps ** (1 + alpha)``): the
others explore by design, an epsilon of 0.4 keeps any policy's returns low.  Actor
``a`` sends to replay ``1 + (a - R - 1) mod R`` (transitions sharded by actor), and
acts epsilon-greedily with the paper's epsilon ``eps ** (1 + alpha * i / (N - 1))``
for actor ``i`` of ``N``.

What travels (:mod:`mpirl.parts.transitions`; each message one contiguous record):

* actor -> replay: a block of ``rollout_steps x num_envs`` n-step transitions with
  the actor's initial priorities (|n-step TD error| on its own copy of the network);
  the replay answers with a short acknowledgement, so an actor has one block in flight;
* actor -> learner, every ``--actor-refresh-steps`` env steps: a parameter request
  carrying the env steps, episodes and returns since the last one; the reply is the
  learner's parameters (taken at the actor's next refresh point: one in flight; with
  ``--param-delivery broadcast`` only its version, :mod:`mpirl.kit.delivery`);
* learner <-> replay: a sample request (the previous batch's new priorities, the beta
  to weight with) and its reply, a batch of ``--replay-batch`` transitions with their
  slots, stamps and importance-sampling weights.  The learner keeps one request in
  flight per replay rank and sends the next as soon as a batch arrives, before it
  trains on it (prefetching; priorities reach the replay one batch late).

A replay rank holds the learner's request until it may answer: once it stores
``--learning-starts / R`` transitions (and a batch), and, with ``--train-intensity
k``, only while it has sampled at most ``k`` times what it inserted.  Once every one of
its actors has left it answers at once (with what it has, or nothing).

Accounting, checked at the end: transitions the actors sent = inserted by the replays
= stored + evicted; every sampled slot was valid when sampled (the replay samples only
from stored slots); priority updates sent = applied + stale (their slot overwritten).
Shutdown: the learner answers each actor's next parameter request with STOP; the actor
then sends a last, empty block to its replay, which answers STOP; then the learner
takes its prefetched batches and sends each replay a last request.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

from topologies.channels import PAUSE_S, ChannelClient
from topologies.paramserver import DeadlineExceeded

from ..config import Config
from ..kit import ledger
from ..kit.actorlearner import (AccountingError, ParamService, actor_counts, end_run,
                                params_reply, reply_progress, take_reply)
from ..kit.book import Book
from ..kit.delivery import Delivery, open_ends
from ..kit.common import Episodes, Summary, build_dqn, start_replica
from ..kit.replayservice import BlockSender, ReplayRank, SampleClient
from ..parts.actor import Actor
from ..parts.records import Fields
from ..parts.learner.dqn import DqnLearner, nstep_transitions
from ..parts.replay import beta_at
from ..parts.transitions import BATCH_META, TransitionLayout, as_batch, initial_priorities
from ..resilience.guard import Guard
from ..resilience.schedule import Schedule, ScheduleDiverged
from ..telemetry.progress import Progress
from ..telemetry.runlog import RunLogger
from ..telemetry.schema import LOSSES
from ..telemetry.timing import PhaseTimer, add_phases

REQUEST_META = Fields("index", "env_steps", "episodes", "return_sum", "recent_mean",
                      "stop", "wait_share")


def run_apex(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    rank, size, shards = comm.Get_rank(), comm.Get_size(), cfg.replay_ranks
    first_actor = 1 + shards
    learner, actor = start_replica(cfg, comm, with_actor=rank >= first_actor, build=build_dqn)
    layout = TransitionLayout(learner.obs_space.shape, cfg.rollout_steps * cfg.num_envs,
                              cfg.replay_batch, learner.action_shape)
    actors, way = [*range(first_actor, size)], reply_progress(cfg, comm, range(1, first_actor))
    ends = open_ends(cfg, comm, None if 0 < rank < first_actor else 0, rank == 0,
                     learner.params.size)        # --param-delivery broadcast: to the actors
    if rank == 0:
        part = ApexLearner(cfg, comm, learner, layout, actors, run_dir, ends, way)
    elif rank < first_actor:    # replay r holds actors r - 1, r - 1 + R, ... (after them)
        served = [a for a in actors if 1 + (a - first_actor) % shards == rank]
        part = ReplayRank(cfg, comm, layout, served, [0], run_dir)
    else:
        part = ApexActor(cfg, comm, learner, actor, layout, 1 + (rank - first_actor) % shards,
                         rank - first_actor, run_dir, ends)
    part.run()
    summary = Summary.of(cfg, size, learner)
    if rank == 0:               # the learner: the lag of every transition it trained on
        part.fill(summary)
    return end_run(summary, comm, part, run_dir, lags=part.lags if rank == 0 else (),
                   invariants=ledger.TRANSITIONS, extra=("env_steps", "transitions_sampled"))


class ApexActor:
    """Roll out epsilon-greedily, turn the rollout into prioritized n-step transitions,
    ship them to the replay; refresh the parameters every ``--actor-refresh-steps``."""

    def __init__(self, cfg: Config, comm: MPI.Comm, learner: DqnLearner, actor: Actor,
                 layout: TransitionLayout, replay: int, index: int, run_dir: Path,
                 delivery: Delivery) -> None:
        self.cfg, self.comm, self.learner, self.actor, self.layout = (cfg, comm, learner,
                                                                      actor, layout)
        self.delivery = delivery
        n_actors = comm.Get_size() - 1 - cfg.replay_ranks
        self.greediest = index == n_actors - 1      # its returns judge --target-return
        generator = torch.Generator().manual_seed(cfg.seed + 10000 * comm.Get_rank() + 1)
        self.policy = learner.actor_policy(index, n_actors, generator)
        self.to_replay = BlockSender(comm, replay, layout, cfg.wait_timeout_s)
        self.to_learner = ChannelClient(comm, 0)
        self.request = np.zeros(1, dtype=[("meta", "f8", (len(REQUEST_META),))])
        self.reply = params_reply(learner.params.size)
        self.episodes = Episodes()
        self.owed = np.zeros(3)           # env steps, episodes, return sum since a request
        self.env_steps, self.requests, self.version = 0, 0, -1
        self.phases: dict[str, float] = {}
        self.log = RunLogger(cfg, comm, run_dir, role="actor")
        self.log.watch(self.to_replay, self.to_learner, *delivery.watched, waits=())

    def run(self) -> None:
        cfg, timer = self.cfg, PhaseTimer()
        every = max(1, math.ceil(cfg.actor_refresh_steps / cfg.steps_per_batch))
        with Guard(cfg, self.comm, self.comm.Get_rank()) as guard:
            self._take_params(timer)                  # the learner's first parameters
            self.log.begin(timer, self.phases)
            alive = True
            while alive:
                blocks = self.to_replay.sent
                guard.at(f"collecting block {blocks + 1}")
                rollout = self.actor.collect(self.policy, cfg.rollout_steps, timer)
                self._ship(rollout, timer)
                blocks += 1
                if blocks % every == 0:
                    alive = self._refresh(timer, guard.stop_requested)
                add_phases(self.phases, self.log.record(
                    blocks, timer, env_steps=cfg.steps_per_batch, param_version=self.version,
                    inserted=self.layout.block_size))
                guard.beat(blocks, "between blocks")
            self.to_replay.leave(timer)       # the learner said STOP
            self.delivery.close(timeout_s=cfg.wait_timeout_s)    # its last broadcast, if any
        add_phases(self.phases, timer.take())

    def _ship(self, rollout, timer) -> None:
        """The rollout as n-step transitions with initial priorities, sent as one block
        (after the replay acknowledged the previous one)."""
        cfg, actor = self.cfg, self.actor
        with timer("backward_s"):
            rewards = rollout.rewards + cfg.gamma * rollout.boot
            trans = nstep_transitions(rollout.obs, rollout.actions, rewards, rollout.dones,
                                      actor.obs, cfg.n_step, cfg.gamma)
            prios = initial_priorities(self.learner, trans, cfg.replay_alpha)
        finished = actor.drain_episodes()
        index = self.to_replay.sent + 1
        self.episodes.add(finished)
        self.log.episodes(index, finished)
        self.log.sim_times(index, actor.drain_sim_times())
        self.owed += (cfg.steps_per_batch, len(finished), sum(r for r, _ in finished))
        self.env_steps += cfg.steps_per_batch
        self.to_replay.ship(trans, prios, self.version, timer)

    def _refresh(self, timer, stop: bool) -> bool:
        """Take the reply to the last parameter request, send the next; False on STOP."""
        if self.to_learner.in_flight and not self._take_params(timer):
            return False
        recent = self.episodes.recent_mean() if self.greediest else None
        self.requests += 1
        self.request[0]["meta"][:] = (self.requests, *self.owed, np.nan if recent is None
                                      else recent, stop, self.log.waiting_share()[1])
        self.owed[:] = 0.0
        self.to_learner.send(self.request)
        return True

    def _take_params(self, timer) -> bool:
        alive, self.version = take_reply(self.to_learner, self.reply, self.learner.params,
                                         self.delivery, self.version, timer,
                                         self.cfg.wait_timeout_s)
        return alive

    def counts(self) -> dict:
        return actor_counts(self.phases, transitions_sent=self.to_replay.transitions,
                            env_steps=self.env_steps, **self.delivery.counts())


class ApexLearner:
    """Sample prefetched batches from the replays, train, send the priorities back;
    answer the actors' parameter requests meanwhile."""

    episodes = None      # it steps no envs

    def __init__(self, cfg: Config, comm: MPI.Comm, learner: DqnLearner,
                 layout: TransitionLayout, actors: list[int], run_dir: Path,
                 delivery: Delivery, reply_way: str) -> None:
        self.cfg, self.comm, self.learner, self.layout = cfg, comm, learner, layout
        self.delivery, self.reply_way = delivery, reply_way      # thread or calls
        self.shards = list(range(1, 1 + cfg.replay_ranks))
        self.samplers = {s: SampleClient(comm, s, layout, cfg.wait_timeout_s)
                         for s in self.shards}
        self.params = ParamService(comm, actors, REQUEST_META, learner.params.size,
                                   pushes=delivery.pushes, progress=reply_way == "thread")
        self.version = 0
        # judged on the greediest actor (epsilon ~ 0): the others explore by design
        self.book = Book(cfg, judges=1)
        self.stopping = self.signalled = False
        self.lags: list[int] = []
        self.phases: dict[str, float] = {}
        self.progress = Progress(run_dir, enabled=True)
        self.log = RunLogger(cfg, comm, run_dir, role="learner")
        self.log.watch(self.params.channel, *self.samplers.values(), *delivery.watched,
                       waits=())
        # which batch or parameter request was taken next: recorded, or enforced
        self.schedule = Schedule(run_dir, 0, cfg.replay_schedule)

    def run(self) -> None:
        timer, cfg = PhaseTimer(), self.cfg
        for actor in self.params.taken:
            self._publish(actor, timer)
        for shard in self.shards:
            self._ask(shard)
        with Guard(cfg, self.comm, 0) as guard:
            self.log.begin(timer, self.phases)
            while not self.stopping:
                guard.at(f"waiting for a batch for update {self.version + 1}")
                self.signalled = guard.stop_requested
                shard = self._next_batch(timer, guard)
                if shard is None:
                    break
                self._train(shard, timer)
                guard.beat(self.version, "between updates")
            self._drain(timer)
        add_phases(self.phases, timer.take())
        self.progress.close()
        self.schedule.save()

    def _next_batch(self, timer, guard) -> int | None:
        """The next replay whose batch has arrived, answering actors while waiting (each
        answer a watchdog beat: the replays' warm-up has no update); None at the end."""
        if self.schedule.replaying:
            return self._replayed_batch(timer, guard)
        deadline, pause = time.monotonic() + self.cfg.wait_timeout_s, 0.0
        with timer("data_wait_s"):
            while not self.stopping:
                served = self._serve_actors(timer)
                if self.stopping:        # decided by a request: no batch after it
                    break
                for shard in self.shards:
                    if self.samplers[shard].poll():
                        return shard
                if served:
                    deadline, pause = time.monotonic() + self.cfg.wait_timeout_s, 0.0
                    guard.beat(self.version, f"waiting for a batch for update {self.version + 1}")
                elif time.monotonic() > deadline:
                    raise DeadlineExceeded(f"learner: no batch from replay ranks {self.shards}"
                                           f" and no request from an actor within "
                                           f"{self.cfg.wait_timeout_s:g} s")
                time.sleep(pause)
                pause = min(PAUSE_S, pause * 2 or 1e-5)
        return None

    def _replayed_batch(self, timer, guard) -> int | None:
        """The recorded run's next batch, taking the actors' requests it took before it."""
        while not self.stopping:
            event = self.schedule.upcoming()
            if event is None:
                raise ScheduleDiverged("learner: the replay needs an event past the recorded "
                                       "run's end")
            who = event[0]
            with timer("data_wait_s"):
                if who in self.samplers:
                    self.samplers[who].wait()
                    return who
                self.params.channel.wait_any(timeout_s=self.cfg.wait_timeout_s, only=(who,))
            self._take_request(who, timer)
            guard.beat(self.version, f"waiting for a batch for update {self.version + 1}")
        return None

    def _train(self, shard: int, timer) -> None:
        cfg, learner = self.cfg, self.learner
        self.schedule.take(shard, self.version)
        sampler = self.samplers[shard]
        reply = sampler.batch[0]
        if int(reply["meta"][BATCH_META["count"]]) == 0:
            raise AccountingError(f"replay rank {shard} sent an empty batch while actors run")
        with timer("backward_s"):
            batch = as_batch(reply["trans"], reply["weight"])
            slots = reply["idx"].copy(), reply["stamp"].copy()
            self.lags.extend((self.version - reply["trans"]["version"]).tolist())
            lag = self.lags[-cfg.replay_batch:]
        self._ask(shard)                       # prefetch: the next batch is on its way
        parts, td = learner.gradient(batch, timer)
        learner.apply(timer)
        self.version += 1
        learner.update_target(self.version)
        sampler.owe(*slots, td)                # sent with the next request (one batch late)
        with timer("publish_s"):                # --param-delivery broadcast: every K
            self.delivery.offer_every(learner.params, self.version, cfg.refresh_every)
        add_phases(self.phases, self.log.record(
            self.version, timer, param_version=self.version,
            policy_lag=float(np.mean(lag)), policy_lag_max=int(max(lag)),
            sampled=cfg.replay_batch, prio_updates=cfg.replay_batch,
            **{k: v for k, v in parts.items() if k in LOSSES}))
        if self.version % cfg.log_every == 0:
            self.book.report(self.progress, self.version, self.lags,
                             waiting=self.log.waiting_share())
        self._check_stop()

    def _ask(self, shard: int) -> None:
        """Send ``shard`` a request: the priorities owed to it, then "sample"."""
        beta = beta_at(self.version, self.cfg.replay_beta, self.cfg.beta_anneal_steps)
        self.samplers[shard].ask(beta)

    def _serve_actors(self, timer) -> bool:
        actors = self.params.channel.ready()
        for actor in actors:
            self._take_request(actor, timer)
        return bool(actors)

    def _take_request(self, actor: int, timer) -> None:
        """An actor's parameter request: its numbers counted, the parameters (or STOP)
        sent back."""
        if not self.stopping:      # once the end is decided, the order changes nothing
            self.schedule.take(actor, self.version)
        meta, q = self.params.request(actor), REQUEST_META
        self.book.add(int(meta[q["env_steps"]]), meta[q["episodes"]], meta[q["return_sum"]])
        if not np.isnan(meta[q["recent_mean"]]):
            self.book.recent[actor] = float(meta[q["recent_mean"]])
        self.signalled = self.signalled or bool(meta[q["stop"]])
        self.book.waits[actor] = float(meta[q["wait_share"]])
        self._check_stop()
        self._publish(actor, timer)

    def _publish(self, actor: int, timer) -> None:
        with timer("publish_s"):
            self.params.answer(actor, self.version, self.learner.params, stop=self.stopping)

    def _check_stop(self) -> None:
        self.book.judge()
        self.stopping = self.book.ends(self.signalled)

    def _drain(self, timer) -> None:
        """STOP every actor at its next request; then end every replay's channel."""
        self.stopping = True
        channel = self.params.channel
        self.delivery.close(timeout_s=self.cfg.wait_timeout_s)   # STOP rung before replies
        while channel.pending():
            with timer("data_wait_s"):
                actor = channel.wait_any(timeout_s=self.cfg.wait_timeout_s,
                                         only=channel.pending())
            self._take_request(actor, timer)
        for sampler in self.samplers.values():
            sampler.end()                          # owed priorities not sent: the run is over
        channel.close(timeout_s=self.cfg.wait_timeout_s)

    def counts(self) -> dict:
        return {"priority_sent": sum(c.prio_sent for c in self.samplers.values()),
                **self.delivery.counts(len(self.params.taken))}

    def fill(self, summary: Summary) -> None:
        summary.updates, summary.reply_progress = self.version, self.reply_way
        summary.wall_s, summary.phase_s = self.progress.elapsed(), dict(self.phases)
        summary.reached_target = self.book.solved
        summary.param_digest = self.learner.param_digest()
