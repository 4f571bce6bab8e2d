"""A sync rank (the sync design and its ``--one-step-stale`` variant,
:mod:`mpirl.designs.stale`): its parts, exchange, counters, checkpointed state and log,
and everything the sync loop does besides the algorithm.

:class:`SyncRank` builds the replica, the :class:`~mpirl.resilience.exchange.Exchange`
and the log, resumes from a checkpoint or an elastic commit, counts rollouts and
updates, writes the progress line, checkpoints, commits, stops on a signal and writes
the summary; :func:`check_replicas` proves the replicas identical.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from mpi4py import MPI

from ..config import Config
from ..errors import ReplicaDivergence
from .common import (Episodes, Summary, build_replica, check_same_model, comm_share,
                      final_mean_return, print_layout, reached_target, resume_in_step,
                      say_resumed, sum_over_ranks)
from .overlap import Overlap, Whole
from ..parts.actor import Actor
from ..parts.learner import Learner
from ..resilience import elastic
from ..resilience.checkpoint import TrainingState
from ..resilience.elastic import NodeCommits
from ..resilience.exchange import Exchange
from ..resilience.guard import Guard
from ..resilience.stop import StopRequested
from ..telemetry.progress import Progress
from ..telemetry.runlog import RunLogger
from ..telemetry.timing import PhaseTimer, add_phases


@dataclass
class Counters:
    """Where a sync run is: what its checkpoint must hold besides the parts' own state."""

    world_size: int
    steps_per_batch: int          # one rank's env steps per rollout
    batch_index: int = 0          # rollouts collected by each rank
    update: int = 0
    skipped: int = 0              # updates skipped for a NaN (--nan-policy skip)
    env_steps: int = 0            # over all ranks
    gradients: int = 0            # sent (and applied) over all ranks
    phases: dict = field(default_factory=dict)   # this rank's seconds per phase

    def updated(self, phases: dict, ranks: int) -> None:
        add_phases(self.phases, phases)
        self.update += 1
        self.gradients += ranks

    def state(self) -> dict:
        return {"batch_index": self.batch_index, "update": self.update,
                "skipped": self.skipped, "env_steps": self.env_steps,
                "gradients": self.gradients, "world_size": self.world_size,
                "phases": dict(self.phases)}

    def load_state(self, state: dict) -> None:
        self.batch_index, self.update = state["batch_index"], state["update"]
        self.skipped, self.phases = state["skipped"], dict(state["phases"])
        # checkpoints from before these were kept: what they must have been
        self.env_steps = state.get("env_steps", self.batch_index * self.world_size *
                                   self.steps_per_batch)
        self.gradients = state.get("gradients", self.update * self.world_size)

    #: where the run is, whatever the rank count: what an elastic commit keeps
    COMMITTED = ("batch_index", "update", "skipped", "env_steps", "gradients")

    def committed(self) -> dict:
        return {key: getattr(self, key) for key in self.COMMITTED}

    def continue_from(self, state: dict) -> None:
        """Continue from an elastic commit (possibly of another rank count)."""
        for key in self.COMMITTED:
            setattr(self, key, int(state[key]))


@dataclass
class SyncRank:
    """One rank of a sync run: its parts, its exchange, the state its checkpoint holds,
    and its log; everything :func:`run_sync` does besides the algorithm."""

    cfg: Config
    run_dir: Path
    learner: Learner
    actor: Actor
    exchange: Exchange
    count: Counters
    episodes: Episodes
    progress: Progress
    saved: TrainingState
    log: RunLogger
    gradients: Whole | Overlap | None = None   # how learner.grad is averaged
    commits: NodeCommits | None = None   # --commit-every: elastic commits in node memory
    guard: Guard | None = None
    solved: bool = False          # stopped early: every rank reached --target-return
    first_update: int = 1         # of the rollout being learnt

    @classmethod
    def start(cls, cfg: Config, comm: MPI.Comm, run_dir: Path) -> "SyncRank":
        """Build the replica, the exchange and the log; resume from a checkpoint if asked."""
        rank = comm.Get_rank()
        learner, actor = build_replica(cfg, rank)
        check_same_model(comm, learner)
        exchange = Exchange(cfg.topology_spec, comm, cfg.on_failure,
                            own_comm=cfg.one_step_stale)    # in flight beside collectives
        exchange.describe(learner.shapes)           # for per-tensor compression (powersgd)
        print_layout(exchange.topology, rank)
        exchange.bcast(learner.params, root=0)      # identical start, whatever torch did
        count, episodes = Counters(comm.Get_size(), cfg.steps_per_batch), Episodes()
        progress = Progress(run_dir, enabled=rank == 0, resume=bool(cfg.resume))
        # progress last: it cuts progress.csv, once every other part took its state
        saved = TrainingState(count, learner, actor, episodes, exchange, progress)
        if cfg.resume:                # the ranks' checkpoints of one rollout, or refused
            resume_in_step(comm, saved, run_dir, "batch_index")
            if rank == 0:
                say_resumed(cfg, run_dir, f"at update {count.update} "
                            f"({count.env_steps} env steps) from its checkpoints")
        commits = elastic.start(cfg, comm, run_dir, progress.elapsed(),
                                restore=lambda state: continue_from(state, learner, count),
                                reseed=lambda seed: reseed(actor, seed + 10000 * rank))
        if commits is not None:       # steps/s and wall_s: the whole elastic job's
            progress.load_state({"wall_s": commits.job_wall_s()})
        log = RunLogger(cfg, comm, run_dir, role="worker",
                        resume_update=count.update if cfg.resume else None)
        exchange.failed = log.failure
        log.watch(exchange, waits=(), from_zero=True)   # the first row holds the bcast
        gradients = (Overlap(exchange, learner.flat, cfg.bucket_mb if cfg.overlap else math.inf)
                     if cfg.overlap or cfg.one_step_stale else Whole(exchange, learner.grad))
        return cls(cfg, run_dir, learner, actor, exchange, count, episodes, progress, saved,
                   log, gradients, commits)

    @contextmanager
    def guarded(self, comm: MPI.Comm) -> Iterator[Guard]:
        """The run's :class:`Guard` (``--fail``, NaN check, watchdog, signal stop), told
        of every exchange; the log's clock starts."""
        with Guard(self.cfg, comm, comm.Get_rank()) as guard:
            self.guard, self.exchange.announce = guard, guard.at
            self.log.begin()
            yield guard

    def next_rollout(self) -> bool:
        """True, and the rollout counted, when another one fits in the budget (with
        ``--anneal-lr``, the learning rate set for it)."""
        cfg, count = self.cfg, self.count
        if not self.budget_left():
            return False
        if cfg.anneal_lr:         # CleanRL's: lr (1 - (i - 1) / rollouts) for rollout i
            rollouts = cfg.total_steps // (count.world_size * count.steps_per_batch)
            self.learner.set_lr(cfg.lr * (1.0 - count.batch_index / rollouts))
        count.batch_index += 1
        self.guard.at(f"computing update {count.update + 1}")
        return True

    def updates(self, batch) -> Iterator[tuple[int, object, bool]]:
        """Each update of this rollout's ``batch``: ``--update-repeat`` passes over its
        ``--minibatches`` (shuffled afresh each pass); the update's number, its part of
        the batch, and whether it is the rollout's first (which carries the rollout's env
        steps).  The watchdog hears of each."""
        self.first_update = self.count.update + 1
        for _ in range(self.cfg.update_repeat):
            for part in self.learner.minibatches(batch):
                update = self.count.update + 1
                self.guard.at(f"computing update {update}")
                yield update, part, update == self.first_update
                self.guard.beat(update, "between updates")

    def usable(self, grad) -> bool:
        """The averaged gradient may be applied; if not (a NaN every rank skips), counted."""
        if self.guard.usable(grad):
            return True
        self.count.skipped += 1
        return False

    def stop_agreed(self) -> bool:
        """Every rank was asked to stop (SIGTERM/SIGINT, collective): checkpoint and raise
        :class:`StopRequested`, or, after a shrink, True: end as if done."""
        if not self.exchange.collective(self.guard.stop_agreed, "stop check"):
            return False
        if self.exchange.shrunk:
            return True               # no checkpoint after a shrink: end as if done
        self.stop()

    def budget_left(self) -> bool:
        """Another rollout of every rank fits in the env-step budget."""
        steps = self.count.env_steps + self.exchange.size * self.count.steps_per_batch
        return steps <= self.cfg.total_steps

    def record(self, update: int, timer: PhaseTimer, losses: dict, first: bool,
               staleness: int = 0) -> None:
        """The update's log row and counters, and the replica check when it is due."""
        phases = self.log.record(update, timer,
                                 env_steps=self.count.steps_per_batch if first else 0,
                                 param_version=update - 1, staleness=staleness, **losses)
        self.count.updated(phases, self.exchange.size)
        if self.cfg.checksum_every and update % self.cfg.checksum_every == 0:
            check_replicas(self.learner, self.exchange, update)

    def rollout_done(self) -> bool:
        """After a rollout's updates: its env steps, episodes and simulator times, the
        progress line when due, the periodic checkpoint.  True when every rank's recent
        episodes reach ``--target-return`` (the same answer on every rank)."""
        cfg, count, actor = self.cfg, self.count, self.actor
        count.env_steps += self.exchange.size * count.steps_per_batch
        finished = actor.drain_episodes()
        self.episodes.add(finished)
        self.log.episodes(count.update, finished)
        self.log.sim_times(self.first_update, actor.drain_sim_times())
        if self.learner.obs_stats is not None:     # every rank's, merged in rank order
            self.learner.merge_batch_obs_stats(self.exchange)
        if (count.batch_index % cfg.log_every == 0 or not self.budget_left()) and self.report():
            self.solved = True
            return True
        if cfg.checkpoint_every and count.batch_index % cfg.checkpoint_every == 0:
            self.checkpoint()
        if cfg.commit_every and count.batch_index % cfg.commit_every == 0:
            self.commit()
        return False

    def checkpoint(self) -> None:
        if not self.exchange.shrunk:  # a resume needs the launch's rank count: docs/faults.md
            self.log.flush()          # the log holds every row the checkpoint covers
            self.saved.save(self.run_dir, self.exchange.rank)

    def commit(self) -> None:
        """An elastic commit: the replicated state into each node's memory (built only
        on the rank that writes it: the others hold the same)."""
        if not self.commits.writer:
            return
        self.commits.commit(self.count.update, self.count.env_steps,
                            {"learner": self.learner.state(),
                             "counters": self.count.committed()})

    def stop(self) -> None:
        """Every rank was asked to stop (a signal): checkpoint, commit, close, and say so."""
        self.checkpoint()
        if self.commits is not None:
            self.commit()
            self.commits.write_record(self.run_dir, self.exchange.rank)
        self.log.close()
        self.progress.close()
        raise StopRequested(self.count.update, self.run_dir, self.exchange.size)

    def report(self) -> bool:
        """A progress line (rank 0, or the lowest survivor); True when every rank's recent
        episodes reach ``--target-return`` (collective, the same answer everywhere)."""
        exchange, count = self.exchange, self.count
        window = self.episodes.take_window()
        return_sum, finished = exchange.collective(lambda c: sum_over_ranks(c, window),
                                                   "progress")
        if exchange.rank == 0:
            self.progress.take_over()  # the lowest survivor reports after a failure
        self.progress.report(update=count.update, env_steps=count.env_steps,
                             episodes=finished, return_sum=return_sum,
                             comm_share=comm_share(count.phases))
        mine = self.episodes.recent_mean()
        means = [m for m in exchange.collective(lambda c: c.allgather(mine), "progress")
                 if m is not None]
        return reached_target(self.cfg.target_return, means, exchange.size)

    def finish(self) -> Summary:
        """The last checkpoint, checks and collectives, the summary, the log closed."""
        cfg, exchange, learner, count = self.cfg, self.exchange, self.learner, self.count
        if cfg.checkpoint_every:
            self.checkpoint()
        if cfg.checksum_every:
            check_replicas(learner, exchange, count.update)
        self.progress.close()
        share = exchange.collective(lambda c: c.allreduce(comm_share(count.phases)),
                                    "summary") / exchange.size
        last_returns = exchange.collective(lambda c: final_mean_return(c, self.episodes),
                                           "summary")
        summary = Summary(mode="sync", topology=cfg.topology, ranks=count.world_size,
                          updates=count.update, env_steps=count.env_steps,
                          wall_s=self.progress.elapsed(), gradients_sent=count.gradients,
                          gradients_applied=count.gradients, gradients_dropped=0,
                          final_mean_return=last_returns, comm_share=share,
                          phase_s=count.phases, reached_target=self.solved,
                          param_digest=learner.param_digest(),
                          gradient_bytes=learner.grad.nbytes, updates_skipped=count.skipped,
                          ranks_failed=sorted(r for e in exchange.team.events
                                              for r in e.failed),
                          writer_rank=exchange.world[0])
        self.log.close(summary.totals(), writer=exchange.rank == 0)
        if self.commits is not None:
            self.commits.write_record(self.run_dir, exchange.rank)
            self.commits.discard()    # done: no attempt follows a finished one
        if self.gradients is not None:
            self.gradients.close()    # the overlap's thread ends
        exchange.close()              # and own_comm's duplicate is freed
        return summary


def check_replicas(learner: Learner, exchange: Exchange, update: int) -> None:
    """Every rank holds the same parameters and Adam state (collective), or the run stops."""
    learner.flat.check_views()
    digest = learner.digest()
    digests = exchange.collective(lambda c: c.allgather(digest),
                                  f"replica check at update {update}")
    if len(set(digests)) != 1:
        odd = [exchange.world[r] for r, d in enumerate(digests) if d != digests[0]]
        raise ReplicaDivergence(
            f"replicas diverged by update {update}: ranks {odd} differ from rank 0 in "
            "parameters or optimizer state")


def continue_from(state: dict, learner: Learner, count: Counters) -> None:
    """An elastic commit (of any rank count) loaded into this replica and its counters."""
    learner.load_state(state["learner"])
    count.continue_from(state["counters"])


def reseed(actor: Actor, seed: int) -> None:
    """A relaunched attempt's own envs and action sampling."""
    torch.manual_seed(seed)
    actor.start(seed)
