"""impala: actors ship whole unrolls; learners train on them with V-trace.

Wiring: ranks ``0..L-1`` (``--learners L``) are learners: a learner part each, no env;
every other rank is an actor with its own envs and its own copy of the policy.  Actor
``a`` is served by learner ``(a - L) mod L``.  What travels: an unroll
(:class:`mpirl.parts.unroll.UnrollLayout`, one contiguous record of observations,
actions, behaviour log-probabilities, rewards, episode ends, the bootstrap observation
and the parameter version) from actor to learner; back, a reply that carries the
learner's parameters when ``--param-refresh`` says so (every unroll, every
``--refresh-every`` updates, or after an episode ended), else only its version.  With
several learners, their gradients are averaged by the chosen topology's allreduce on
the learners' communicator (IMPALA's multi-learner setup).  With ``--param-delivery
broadcast`` the replies carry only the version, and the parameters reach a learner's
actors by one broadcast through the topology every ``--refresh-every`` updates (every
update with ``--param-refresh unroll``), on a thread at each end
(:mod:`mpirl.kit.delivery`); an actor takes the newest one between unrolls.

An actor keeps one unroll in flight: it sends unroll k, collects unroll k+1 meanwhile,
then takes the reply to k before it sends k+1.  So it never waits for the learner
unless the learner is behind, and it acts with the parameters of the last reply (policy
lag, which V-trace corrects, and which ``--max-policy-lag`` bounds by dropping).

A learner takes unrolls as they arrive, answers each at once, and steps once it holds
``--unroll-batch`` of them.  After every step the learners agree (one small allreduce)
on the env steps seen, episodes, and whether to stop (budget, ``--target-return``, a
signal).  Then each learner takes every actor's last unroll and answers it with STOP.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from mpi4py import MPI

import topologies
from topologies.channels import ChannelClient, ChannelServer, as_bytes

from ..config import Config
from ..kit import ledger
from ..kit.actorlearner import (REPLY_META, TAG_KEEP, TAG_PARAMS, TAG_STOP, AccountingError,
                                UnrollQueue, VtraceTrainer, actor_counts, meta_nbytes,
                                params_reply, end_run, reply_progress, take_reply)
from ..kit.book import Book
from ..kit.common import Episodes, Summary, print_layout, start_replica
from ..kit.delivery import Delivery, open_ends
from ..parts.actor import ModelPolicy
from ..parts.unroll import UNROLL_META, UnrollLayout
from ..resilience.guard import Guard
from ..resilience.schedule import STEP, Schedule, ScheduleDiverged
from ..telemetry.progress import Progress
from ..telemetry.runlog import RunLogger
from ..telemetry.timing import PhaseTimer, add_phases


def run_impala(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    rank, size, n_learners = comm.Get_rank(), comm.Get_size(), cfg.learners
    is_learner = rank < n_learners
    learner, actor = start_replica(cfg, comm, with_actor=not is_learner)
    learners_comm = comm.Split(0 if is_learner else MPI.UNDEFINED, rank)
    server = rank if is_learner else (rank - n_learners) % n_learners    # its learner
    ends = open_ends(cfg, comm, server, is_learner, learner.wire.size)  # l -> its actors
    layout = UnrollLayout(cfg.rollout_steps, cfg.num_envs, learner.obs_space, learner.act_space)
    summary = Summary.of(cfg, size, learner)
    if is_learner:              # learner l serves actors l, l + L, l + 2L, ... (after them)
        actors = [a for a in range(n_learners, size) if (a - n_learners) % n_learners == rank]
        part = ImpalaLearner(cfg, comm, learners_comm, learner, layout, actors, run_dir, ends)
    else:
        part = ImpalaActor(cfg, comm, learner, actor, layout, server, run_dir, ends)
    part.run()
    if is_learner:
        part.fill(summary)
        learners_comm.Free()
    summary.env_steps = comm.bcast(summary.env_steps, root=0)
    return end_run(summary, comm, part, run_dir, lags=part.queue.lags if is_learner else ())


class ImpalaActor:
    """Roll out with the local copy, ship the unroll, take the reply to the previous one."""

    def __init__(self, cfg: Config, comm: MPI.Comm, learner, actor, layout: UnrollLayout,
                 server: int, run_dir: Path, delivery: Delivery) -> None:
        self.cfg, self.comm, self.learner, self.actor, self.layout = (cfg, comm, learner,
                                                                      actor, layout)
        self.delivery = delivery
        self.client = ChannelClient(comm, server)
        self.records = [layout.empty(), layout.empty()]   # one filling, one in flight
        self.reply = params_reply(learner.wire.size)
        self.episodes = Episodes()
        self.sent = 0
        self.version = -1                 # of the parameters this actor holds
        self.phases: dict[str, float] = {}
        self.log = RunLogger(cfg, comm, run_dir, role="actor")

    def run(self) -> None:
        cfg, log = self.cfg, self.log
        policy, timer = ModelPolicy(self.learner.model), PhaseTimer()
        with Guard(cfg, self.comm, self.comm.Get_rank()) as guard:
            self._take_reply(timer)                       # the learner's first parameters
            log.watch(self.client, *self.delivery.watched, waits=(self.client,))
            log.begin(timer, self.phases)
            in_flight = False
            while True:
                record = self.records[self.sent % 2]
                guard.at(f"collecting unroll {self.sent + 1}")
                acted_with = self.version
                rollout = self.actor.collect(policy, cfg.rollout_steps, timer)
                self._pack(record, rollout, acted_with, guard.stop_requested)
                if in_flight:
                    guard.at(f"waiting for the reply to unroll {self.sent}")
                    if not self._take_reply(timer):
                        break                             # STOP: this unroll stays here
                with timer("send_s"):
                    self.client.send(record)
                self.sent, in_flight = self.sent + 1, True
                add_phases(self.phases, log.record(
                    self.sent, timer, env_steps=cfg.steps_per_batch, param_version=acted_with))
                guard.beat(self.sent, "between unrolls")
            self.delivery.close(timeout_s=cfg.wait_timeout_s)    # its last broadcast, if any
        add_phases(self.phases, timer.take())

    def _pack(self, record: np.ndarray, rollout, version: int, stop: bool) -> None:
        finished = self.actor.drain_episodes()
        self.episodes.add(finished)
        self.log.episodes(self.sent + 1, finished)
        self.log.sim_times(self.sent + 1, self.actor.drain_sim_times())
        self.layout.pack(record, rollout, self.actor.obs)
        meta = record[0]["meta"]
        recent = self.episodes.recent_mean()
        meta[:] = 0.0
        meta[UNROLL_META["version"]], meta[UNROLL_META["index"]] = version, self.sent + 1
        meta[UNROLL_META["env_steps"]] = self.cfg.steps_per_batch
        meta[UNROLL_META["episodes"]] = len(finished)
        meta[UNROLL_META["return_sum"]] = sum(r for r, _ in finished)
        meta[UNROLL_META["recent_mean"]] = np.nan if recent is None else recent
        meta[UNROLL_META["wants_params"]] = float(bool(finished))
        meta[UNROLL_META["stop"]] = float(stop)
        meta[UNROLL_META["wait_share"]] = self.log.waiting_share()[1]   # since the last

    def _take_reply(self, timer) -> bool:
        """The learner's reply: fresh parameters (or not); False on STOP."""
        alive, self.version = take_reply(self.client, self.reply, self.learner.wire,
                                         self.delivery, self.version, timer,
                                         self.cfg.wait_timeout_s)
        return alive

    def counts(self) -> dict:
        return actor_counts(self.phases, unrolls_sent=self.sent, **self.delivery.counts())


class ImpalaLearner:
    """Take unrolls, answer each at once, step on every ``--unroll-batch`` of them."""

    episodes = None      # it steps no envs

    def __init__(self, cfg: Config, comm: MPI.Comm, learners_comm: MPI.Comm, learner, layout,
                 actors: list[int], run_dir: Path, delivery: Delivery) -> None:
        self.cfg, self.comm, self.sub, self.learner, self.layout = (cfg, comm, learners_comm,
                                                                    learner, layout)
        self.actors = actors
        self.delivery = delivery
        #: --param-delivery broadcast: updates between broadcasts
        self.broadcast_every = 1 if cfg.param_refresh == "unroll" else cfg.refresh_every
        exchange = (topologies.get(cfg.topology_spec)(learners_comm)
                    if learners_comm.Get_size() > 1 else None)
        if exchange is not None:
            exchange.describe(learner.shapes)
        print_layout(exchange, learners_comm.Get_rank())
        self.trainer = VtraceTrainer(cfg, learner, exchange)
        self.server = ChannelServer(comm, actors, layout.nbytes)
        self.replies = {a: params_reply(learner.wire.size) for a in actors}
        self.queue = UnrollQueue(cfg.max_policy_lag)
        self.batch = cfg.unroll_batch or len(actors)
        self.held = {a: -1 for a in actors}          # parameter version each actor holds
        self.taken = {a: 0 for a in actors}
        self.recent: dict[int, float] = {}
        self.owed = np.zeros(4)          # env steps, episodes, return sum, stop flag
        # over every learner's actors, judged by all of them
        self.book = Book(cfg, judges=comm.Get_size() - cfg.learners)
        self.stopping = False
        self.phases: dict[str, float] = {}
        self.progress = Progress(run_dir, enabled=comm.Get_rank() == 0)
        self.log = RunLogger(cfg, comm, run_dir, role="learner")
        # replies and unrolls, and the exchange among learners
        self.log.watch(self.server, *filter(None, [self.trainer.exchange]),
                       *delivery.watched, waits=())
        # which unroll was taken when: recorded, or enforced (--replay-schedule)
        self.schedule = Schedule(run_dir, comm.Get_rank(), cfg.replay_schedule)

    @property
    def version(self) -> int:
        return self.trainer.version

    def run(self) -> None:
        timer, log = PhaseTimer(), self.log
        for a in self.actors:
            self._publish(a, timer, initial=True)
        with Guard(self.cfg, self.comm, self.comm.Get_rank()) as guard:
            log.begin(timer, self.phases)
            while not self.stopping:
                guard.at(f"waiting for unrolls for update {self.version + 1}")
                queued = len(self.queue)
                records = (self._replayed(timer) if self.schedule.replaying
                           else self._gather(timer))
                self.schedule.take(STEP, self.version)
                losses = self.trainer.train(records, timer)
                self._broadcast(timer)
                lags = self.queue.lags[-len(records):]
                add_phases(self.phases, log.record(
                    self.version, timer, param_version=self.version,
                    policy_lag=float(np.mean(lags)), policy_lag_max=max(lags),
                    queue_len=queued, **losses))
                self._agree(guard.stop_requested)
                guard.beat(self.version, "between updates")
            self._drain(timer)
        add_phases(self.phases, timer.take())
        self.progress.close()

    def _gather(self, timer) -> list[np.ndarray]:
        """Take unrolls as they arrive until a batch of fresh enough ones is queued."""
        server, records = self.server, []
        while not records:
            while len(self.queue) < self.batch:
                with timer("data_wait_s"):
                    actor = server.wait_any(timeout_s=self.cfg.wait_timeout_s)
                self._take(actor, timer)
            for actor in server.ready():
                self._take(actor, timer)
            records = self.queue.take(self.batch, self.version)
        return records

    def _replayed(self, timer) -> list[np.ndarray]:
        """The recorded run's unrolls up to its next step, taken in its order."""
        while (actor := self.schedule.next()) != STEP:
            with timer("data_wait_s"):
                self.server.wait_any(timeout_s=self.cfg.wait_timeout_s, only=(actor,))
            self._take(actor, timer)
        records = self.queue.take(self.batch, self.version)
        if not records:
            raise ScheduleDiverged(f"update {self.version + 1}: the recorded run stepped "
                                   "here, the replay holds no full batch")
        return records

    def _take(self, actor: int, timer) -> None:
        """An unroll arrived: check and keep it, answer its actor."""
        record = self.layout.view(self.server.buffers[actor]).copy()   # the slot re-arms
        meta = record[0]["meta"]
        self.schedule.take(actor, int(meta[UNROLL_META["version"]]))
        ledger.count_in_order(self.taken, actor, meta[UNROLL_META["index"]], "actor", "unroll",
                              "this learner")
        self.owed += [meta[UNROLL_META[name]]
                      for name in ("env_steps", "episodes", "return_sum", "stop")]
        if not np.isnan(meta[UNROLL_META["recent_mean"]]):
            self.recent[actor] = float(meta[UNROLL_META["recent_mean"]])
        self.book.waits[actor] = float(meta[UNROLL_META["wait_share"]])
        self.queue.add(record, self.version)
        self._publish(actor, timer, wants=bool(meta[UNROLL_META["wants_params"]]))

    def _broadcast(self, timer) -> None:
        """--param-delivery broadcast: start one every ``broadcast_every`` updates (once
        the one in flight has left this learner)."""
        with timer("publish_s"):
            self.delivery.offer_every(self.learner.wire, self.version, self.broadcast_every)

    def _publish(self, actor: int, timer, initial: bool = False, wants: bool = False) -> None:
        """Answer ``actor``: with the parameters when the refresh policy says so (with
        --param-delivery broadcast, only the first time: then they come by broadcast)."""
        cfg, reply = self.cfg, self.replies[actor]
        fresh = initial or self.delivery.pushes and {"unroll": True, "episode": wants,
                            "updates": self.version - self.held[actor] >= cfg.refresh_every
                            }[cfg.param_refresh]
        with timer("publish_s"):
            reply[0]["meta"][REPLY_META["version"]] = self.version
            if fresh:
                reply[0]["params"] = self.learner.wire
                self.held[actor] = self.version
                self.server.reply(actor, reply, tag=TAG_PARAMS)
            else:
                self.server.reply(actor, as_bytes(reply)[:meta_nbytes()], tag=TAG_KEEP)

    def _agree(self, signalled: bool) -> None:
        """Every learner learns the env steps, episodes, stop flags and actors' waiting
        shares of all (one small allreduce), and whether the run ends now."""
        waits = self.book.waits
        shared = np.asarray([*self.owed, float(signalled), sum(self.recent.values()),
                             len(self.recent), sum(waits.values()), len(waits)])
        self.sub.Allreduce(MPI.IN_PLACE, shared, op=MPI.SUM)
        steps, episodes, returns, stops, signals, recent_sum, recent_count = shared[:7]
        wait_sum, wait_count = shared[7:]
        self.owed[:] = 0.0
        self.book.add(int(steps), episodes, returns)
        if self.version % self.cfg.log_every == 0:   # every learner's actors' waiting
            self._report(wait_sum / wait_count if wait_count else None)
        # each actor's recent mean is known to its learner: judged on their mean
        self.book.recent = dict.fromkeys(range(int(recent_count)),
                                         recent_sum / recent_count if recent_count else 0.0)
        self.book.judge()
        self.stopping = self.book.ends(stops > 0 or signals > 0)

    def _report(self, actors_waiting: float | None) -> None:
        self.book.report(self.progress, self.version, self.queue.lags,
                         waiting=self.log.waiting_share(), actors_waiting=actors_waiting)

    def _drain(self, timer) -> None:
        """Take every actor's last unroll, answer it with STOP; what is queued is dropped."""
        server, before = self.server, self.book.env_steps
        self.delivery.close(timeout_s=self.cfg.wait_timeout_s)   # STOP rung before replies
        while server.pending():
            with timer("data_wait_s"):
                actor = server.wait_any(timeout_s=self.cfg.wait_timeout_s, only=server.pending())
            self.taken[actor] += 1
            self.queue.received += 1
            self.queue.dropped += 1
            steps = self.layout.view(server.buffers[actor])[0]["meta"][UNROLL_META["env_steps"]]
            self.book.env_steps += int(steps)   # stepped, though never learned from
            server.reply(actor, as_bytes(self.replies[actor])[:meta_nbytes()], tag=TAG_STOP,
                         last=True)
        self.queue.drop_rest()
        server.close(timeout_s=self.cfg.wait_timeout_s)
        self.schedule.save()
        # the last unrolls were stepped, though never learned from: count them, over
        # every learner's actors
        drained = np.asarray([self.book.env_steps - before], dtype=np.int64)
        self.sub.Allreduce(MPI.IN_PLACE, drained, op=MPI.SUM)
        self.book.env_steps = before + int(drained[0])

    def fill(self, summary: Summary) -> None:
        summary.updates = self.version
        summary.reply_progress = reply_progress(self.cfg, self.comm, feeders=range(0))
        summary.env_steps = self.book.env_steps
        summary.wall_s = self.progress.elapsed()
        summary.phase_s = dict(self.phases)
        summary.reached_target = self.book.solved
        summary.param_digest = self.learner.param_digest()
        digests = self.sub.allgather(summary.param_digest)
        if len(set(digests)) > 1:
            raise AccountingError(f"learners' parameters diverged: {digests}")

    def counts(self) -> dict:
        return {"unrolls_used": self.queue.used, "unrolls_dropped": self.queue.dropped,
                **self.delivery.counts(len(self.actors))}


__all__ = ["ImpalaActor", "ImpalaLearner", "run_impala"]
