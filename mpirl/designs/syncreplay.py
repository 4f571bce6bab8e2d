"""sync-replay: every rank a replica with its own replay, its gradients averaged by the
topology; the book's multi-process off-policy setup (SAC for Box actions, double DQN for
Discrete).

Wiring: every rank steps its envs with its own replica's policy, turns each rollout into
n-step transitions in its own prioritized replay (:class:`~mpirl.kit.memory.LocalMemory`),
and, once every replay holds ``--learning-starts / ranks`` transitions (the same rollout
on every rank: their rollouts are the same size), takes ``--update-repeat`` updates per
rollout::

    batch = memory.batch(beta)                  # from this rank's replay
    learner.gradient(batch)                     # SAC's (or DQN's) gradient
    exchange.average(learner.grad, update)      # the whole exchange
    learner.apply(); learner.update_target()    # the same step everywhere

What travels is the gradient, one flat buffer per update, as in ``sync``; the
transitions stay where they were made.  Identical initial parameters, averaged gradients
and Polyak (or copied) targets keep the replicas byte-identical, checked every
``--checksum-every`` updates.  The ledgers: every gradient applied, every transition
inserted and stored or evicted, every priority set.

Checkpoints (``--checkpoint-every`` rollouts, at the end, and on SIGTERM/SIGINT, which
stops every rank at the same rollout): each rank's replica, Adam's state, its replay
(records, priorities, ring position, sampling RNG), its envs where they can be captured
(classic control, MuJoCo), its policy's RNG and the books.  ``--resume RUN_DIR``
continues to the same parameters as an uninterrupted run, bit for bit, with every log
row once (warm-up rows and episodes all have update 0: the log is cut back by row
counts the checkpoint keeps, progress.csv by env steps).  Refused at resume, in one
line: checkpoints of different rollouts (a job killed while its ranks wrote them) and a
replay of another capacity.  A replay of a million transitions makes a checkpoint of
hundreds of MB, so the design's own ``--checkpoint-every`` is 5000 rollouts.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from mpi4py import MPI

from ..config import Config
from ..errors import ReplicaDivergence
from ..kit import ledger
from ..kit.common import (Episodes, Summary, build_dqn, close_run, comm_share, print_layout,
                          reached_target, resume_in_step, say_resumed,
                          start_replica, sum_over_ranks)
from ..kit.memory import LocalMemory
from ..parts.replay import beta_at
from ..parts.transitions import TransitionLayout, initial_priorities
from ..resilience.checkpoint import TrainingState
from ..resilience.exchange import load_topology_state, topology_state
from ..resilience.guard import Guard
from ..resilience.stop import StopRequested
from ..telemetry.progress import Progress
from ..telemetry.runlog import RunLogger
from ..telemetry.schema import LOSSES
from ..telemetry.timing import PhaseTimer, add_phases


def run_sync_replay(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    part = ReplayReplica(cfg, comm, run_dir)
    learner, actor, memory = part.learner, part.actor, part.memory
    with Guard(cfg, comm, comm.Get_rank()) as guard:
        part.log.begin()
        while part.budget_left():
            # a rollout is progress too: warm-up rollouts have no update (a slow env's
            # warm-up may outlast --watchdog-s)
            guard.beat(part.update, f"collecting rollout {part.rollouts + 1}")
            rollout = actor.collect(part.policy, cfg.rollout_steps, part.timer)
            part.store(learner.transitions(rollout, actor.obs))
            for update in part.updates():               # none while replays warm up
                batch = memory.batch(part.beta(), part.timer)
                losses, td = learner.gradient(batch, part.timer)
                guard.check(update, learner.grad)       # --fail; NaN: 'stop' raises
                with part.timer("exchange_s"):
                    part.exchange.allreduce(learner.grad, average=True)
                applied = part.apply(guard, update, td)   # unless a NaN every rank skips
                part.record(update, losses, applied)
                guard.beat(update, "between updates")
            if part.rollout_ends(guard):    # --target-return; a signal: checkpoint, stop
                break
    return part.finish()


class ReplayReplica:
    """One rank of a sync-replay run: its parts, its replay, its exchange and log, and the
    books of the run (everything :func:`run_sync_replay` does besides the algorithm)."""

    def __init__(self, cfg: Config, comm: MPI.Comm, run_dir: Path) -> None:
        import topologies

        self.cfg, self.comm, self.run_dir = cfg, comm, run_dir
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.learner, self.actor = start_replica(cfg, comm, build=build_dqn)
        self.exchange = topologies.get(cfg.topology_spec)(comm)
        self.exchange.describe(self.learner.shapes)
        print_layout(self.exchange, self.rank)
        self.exchange.bcast(self.learner.params, root=0)       # identical start
        self.learner.sync_target()
        self.generator = torch.Generator().manual_seed(cfg.seed + 10000 * self.rank + 1)
        self.policy = self.learner.actor_policy(self.rank, self.size, self.generator)
        layout = TransitionLayout(self.learner.obs_space.shape, cfg.steps_per_batch,
                                  cfg.replay_batch, self.learner.action_shape)
        self.memory = LocalMemory(cfg, layout, self.rank, self.size)
        self.timer, self.episodes = PhaseTimer(), Episodes()
        self.rollouts = self.update = self.env_steps = self.skipped = 0
        self.rollout_env_steps = self.rollout_inserted = 0   # carried by its first row
        self.phases: dict[str, float] = {}
        self.rows = {"updates": 0, "episodes": 0}        # written to this rank's log
        self.solved = False
        self.progress = Progress(run_dir, enabled=self.rank == 0, resume=bool(cfg.resume))
        # progress last: it cuts progress.csv, once every other part took its state
        self.saved = TrainingState(self, self.learner, self.actor, self.episodes,
                                   self.memory, self.progress)
        if cfg.resume:
            self.restore(run_dir)
        self.log = RunLogger(cfg, comm, run_dir, role="worker",
                             resume_update=self.update if cfg.resume else None,
                             resume_rows=dict(self.rows) if cfg.resume else None)
        self.log.watch(self.exchange, waits=(), from_zero=True)

    def restore(self, run_dir: Path) -> None:
        """Every part from this rank's checkpoint, the ranks' of one rollout
        (:func:`~mpirl.kit.common.resume_in_step`); the replay's must fit this run's."""
        resume_in_step(self.comm, self.saved, run_dir, "rollouts")
        if self.rank == 0:
            say_resumed(self.cfg, run_dir, f"at update {self.update} ({self.env_steps} env "
                        "steps) from its checkpoints")

    def budget_left(self) -> bool:
        return self.env_steps + self.size * self.cfg.steps_per_batch <= self.cfg.total_steps

    def beta(self) -> float:
        return beta_at(self.update, self.cfg.replay_beta, self.cfg.beta_anneal_steps)

    def store(self, transitions: dict) -> None:
        """The rollout's transitions, with initial priorities from this replica."""
        with self.timer("replay_s"):
            t = transitions
            prios = initial_priorities(self.learner, t, self.cfg.replay_alpha)
            self.rollout_inserted = self.memory.insert(t, prios, self.update, self.timer)
        self.rollouts += 1
        self.env_steps += self.size * self.cfg.steps_per_batch
        self.rollout_env_steps = self.cfg.steps_per_batch

    def updates(self):
        """This rollout's ``--update-repeat`` update numbers, once the replay is warm
        (the same answer on every rank: every replay holds as many transitions)."""
        if self.memory.size() < self.memory.warmup:
            self.log.record(self.update, self.timer, env_steps=self.rollout_env_steps,
                            param_version=self.update, inserted=self.rollout_inserted,
                            replay_size=self.memory.size())
            self.rows["updates"] += 1
            self.rollout_env_steps = 0
            return
        for _ in range(self.cfg.update_repeat):
            self.update += 1
            yield self.update

    def apply(self, guard: Guard, update: int, td) -> bool:
        """The averaged gradient's step, the target's update and the batch's new
        priorities; under ``--nan-policy skip`` a NaN every rank sees in the average
        skips all three, counted (False)."""
        if not guard.usable(self.learner.grad):
            self.skipped += 1
            return False
        self.learner.apply(self.timer)
        self.learner.update_target(update)
        self.memory.priorities(td, self.beta())
        return True

    def record(self, update: int, losses: dict, applied: bool) -> None:
        add_phases(self.phases, self.log.record(
            update, self.timer, env_steps=self.rollout_env_steps, param_version=update - 1,
            staleness=0, inserted=self.rollout_inserted if self.rollout_env_steps else 0,
            sampled=self.cfg.replay_batch, prio_updates=self.cfg.replay_batch * applied,
            replay_size=self.memory.size(), **{k: v for k, v in losses.items() if k in LOSSES}))
        self.rows["updates"] += 1
        self.rollout_env_steps = 0
        if self.cfg.checksum_every and update % self.cfg.checksum_every == 0:
            self.check_replicas()

    def rollout_done(self, periodic: bool = True) -> bool:
        """Episodes logged; a progress line when due; the periodic checkpoint (not when
        ``periodic`` is off: a stop writes its own).  True when every rank's recent
        episodes reach ``--target-return`` (collective, the same answer everywhere).  A
        stopped run adds no line of its own: resumed, its lines are an uninterrupted
        run's."""
        finished = self.actor.drain_episodes()
        self.episodes.add(finished)
        self.log.episodes(self.update, finished)
        self.rows["episodes"] += len(finished)
        due = self.rollouts % self.cfg.log_every == 0 or not self.budget_left()
        if due and self.report():
            return True
        every = self.cfg.checkpoint_every
        if periodic and every and self.rollouts % every == 0 and self.budget_left():
            self.checkpoint()
        return False

    def report(self) -> bool:
        """The progress line (collective); True when the target is reached."""
        return_sum, count = sum_over_ranks(self.comm, self.episodes.take_window())
        self.progress.report(update=self.update, env_steps=self.env_steps, episodes=count,
                             return_sum=return_sum, comm_share=comm_share(self.phases))
        means = [m for m in self.comm.allgather(self.episodes.recent_mean()) if m is not None]
        self.solved = reached_target(self.cfg.target_return, means, self.size)
        return self.solved

    # -- checkpoints: this rank's books are one of its Stateful parts ---------------------

    def checkpoint(self) -> None:
        self.log.flush()              # the log holds every row the checkpoint covers
        self.saved.save(self.run_dir, self.rank)

    def stop(self) -> None:
        """Every rank was asked to stop (a signal): checkpoint, close, and say so."""
        self.checkpoint()
        self.log.close()
        self.progress.close()
        raise StopRequested(self.update, self.run_dir, self.size)

    def state(self) -> dict:
        """The books (``world_size``, ``update`` and ``rollouts`` where
        :func:`~mpirl.resilience.checkpoint.check_set` reads them), the log's row counts,
        the policy's RNG and the exchange's own state."""
        return {"world_size": self.size, "rollouts": self.rollouts, "update": self.update,
                "skipped": self.skipped, "env_steps": self.env_steps,
                "phases": dict(self.phases), "log_rows": dict(self.rows),
                "policy_rng": self.generator.get_state(), **topology_state(self.exchange)}

    def load_state(self, state: dict) -> None:
        self.rollouts, self.update = state["rollouts"], state["update"]
        self.skipped, self.env_steps = state["skipped"], state["env_steps"]
        self.phases, self.rows = dict(state["phases"]), dict(state["log_rows"])
        self.generator.set_state(state["policy_rng"])
        load_topology_state(self.exchange, state)

    def rollout_ends(self, guard: Guard) -> bool:
        """After a rollout: True when the run reached ``--target-return``; every rank
        stops at the same rollout when any was signalled (collective), with a
        checkpoint, by :class:`StopRequested`."""
        stopping = guard.stop_agreed(self.comm)
        if self.rollout_done(periodic=not stopping):
            return True
        if stopping:
            self.stop()
        return False

    def check_replicas(self) -> None:
        digest = self.learner.digest()
        digests = self.comm.allgather(digest)
        if len(set(digests)) != 1:
            odd = [r for r, d in enumerate(digests) if d != digests[0]]
            raise ReplicaDivergence(f"replicas diverged by update {self.update}: ranks {odd} "
                                    "differ from rank 0 in parameters, target or optimizer")

    def counts(self) -> dict:
        # each rank's gradient is in every average it applies: sent = applied, per rank
        return {**self.memory.counts(), "gradients_sent": self.update,
                "gradients_applied": self.update}

    def finish(self) -> Summary:
        add_phases(self.phases, self.timer.take())
        if self.cfg.checkpoint_every:
            self.checkpoint()
        if self.cfg.checksum_every:
            self.check_replicas()
        self.progress.close()
        summary = Summary.of(self.cfg, self.size, self.learner)
        summary.updates, summary.env_steps = self.update, self.env_steps
        summary.updates_skipped = self.skipped
        summary.wall_s, summary.reached_target = self.progress.elapsed(), self.solved
        summary.param_digest, summary.phase_s = self.learner.param_digest(), self.phases
        summary.comm_share = self.comm.allreduce(comm_share(self.phases)) / self.size
        summary.mean_staleness = 0.0 if self.update else math.nan
        return close_run(summary, self.comm, self,
                         ledger.GRADIENTS + ledger.TRANSITIONS, extra=("transitions_sampled",))
