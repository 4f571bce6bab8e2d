"""sync (A2C / synchronous DPPO): every rank's gradient, averaged by one allreduce, every step.

Wiring: every rank holds all five parts but the server: its envs, an actor stepping
them with its own replica's policy, and a learner; what travels is the gradient, one
flat buffer per update, through the chosen topology's allreduce.  Per rollout and per
update repeat, on every rank::

    learner.gradient(batch)                    # backward into learner.grad
    exchange.average(learner.grad, update)     # the whole exchange
    learner.apply()                            # the same Adam step everywhere

Identical initial parameters (broadcast from rank 0), identical averaged gradients and
a deterministic optimizer keep the replicas byte-identical; every ``checksum_every``
updates a SHA-256 of parameters and Adam state is compared across ranks to prove it.

Around the loop, and out of its way: the :class:`~mpirl.resilience.guard.Guard`
(``--fail``, NaN check, watchdog, signal stop), the
:class:`~mpirl.resilience.exchange.Exchange` (under ``--on-failure shrink`` it survives
a rank's failure and redoes the allreduce: the loop only sees fewer ranks), the
:class:`~mpirl.resilience.checkpoint.TrainingState` a checkpoint saves and restores,
and the log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mpi4py import MPI

from ..config import Config
from ..parts.actor import ModelPolicy
from ..parts.learner import Learner
from ..resilience.checkpoint import TrainingState
from ..resilience.exchange import Exchange
from ..resilience.guard import Guard
from ..resilience.stop import StopRequested
from ..telemetry.progress import Progress
from ..telemetry.runlog import RunLogger
from ..telemetry.timing import PhaseTimer, add_phases
from .common import (Episodes, Summary, build_replica, check_same_model, comm_share,
                     final_mean_return, reached_target, sum_over_ranks)


class ReplicaDivergence(RuntimeError):
    """Ranks hold different parameters or optimizer state: the comparison is void."""


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


def run_sync(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    rank = comm.Get_rank()
    learner, actor = build_replica(cfg, rank)
    check_same_model(comm, learner)
    exchange = Exchange(cfg.topology, comm, cfg.on_failure)
    exchange.bcast(learner.params, root=0)      # identical start, whatever torch did
    count, episodes = Counters(comm.Get_size(), cfg.steps_per_batch), Episodes()
    progress = Progress(run_dir, enabled=rank == 0, resume=bool(cfg.resume))
    saved = TrainingState(count, learner, actor, episodes, progress)
    if cfg.resume:
        saved.restore(run_dir, rank)
    log = RunLogger(cfg, comm, run_dir, role="worker",
                    resume_update=count.update if cfg.resume else None)
    exchange.failed = log.failure

    def checkpoint() -> None:
        if not exchange.shrunk:       # a resume needs the launch's rank count: see docs
            log.flush()               # the log holds every row the checkpoint covers
            saved.save(run_dir, rank)

    policy, timer, spb = ModelPolicy(learner.model), PhaseTimer(), count.steps_per_batch
    solved = False
    with Guard(cfg, comm, rank) as guard:
        exchange.announce = guard.at
        log.begin()
        while count.env_steps + exchange.size * spb <= cfg.total_steps:
            count.batch_index += 1
            guard.at(f"computing update {count.update + 1}")
            batch = learner.batch(actor.collect(policy, cfg.rollout_steps, timer))
            finished = actor.drain_episodes()
            log.sim_times(count.update + 1, actor.drain_sim_times())
            for repeat in range(cfg.update_repeat):
                update = count.update + 1
                guard.at(f"computing update {update}")
                losses = learner.gradient(batch, timer)
                guard.check(update, learner.grad)          # --fail; NaN: stop raises
                with timer("exchange_s"):
                    exchange.average(learner.grad, update)
                if guard.usable(learner.grad):
                    learner.apply(timer)
                else:                                      # a NaN every rank skips
                    count.skipped += 1
                sent, received = exchange.take_bytes()
                count.updated(log.record(update, timer, bytes_sent=sent, bytes_recv=received,
                                         env_steps=spb if repeat == 0 else 0,
                                         param_version=update - 1, staleness=0, **losses),
                              exchange.size)
                guard.beat(update, "between updates")
                if cfg.checksum_every and update % cfg.checksum_every == 0:
                    check_replicas(learner, exchange, update)
            count.env_steps += exchange.size * spb
            episodes.add(finished)
            log.episodes(count.update, finished)
            last = count.env_steps + exchange.size * spb > cfg.total_steps
            if (count.batch_index % cfg.log_every == 0 or last) and \
                    report(cfg, exchange, progress, episodes, count):
                solved = True
                break
            if cfg.checkpoint_every and count.batch_index % cfg.checkpoint_every == 0:
                checkpoint()
            if exchange.collective(guard.stop_agreed, "stop check"):   # SIGTERM/SIGINT
                if exchange.shrunk:
                    break             # no checkpoint after a shrink: end as if done
                checkpoint()
                log.close()
                progress.close()
                raise StopRequested(count.update, run_dir)
    if cfg.checkpoint_every:
        checkpoint()
    return finish(cfg, exchange, learner, count, episodes, progress, log, solved)


def report(cfg: Config, exchange: Exchange, progress: Progress, episodes: Episodes,
           count: Counters) -> bool:
    """A progress line (rank 0, or the lowest survivor); True when every rank's recent
    episodes reach ``--target-return`` (collective, the same answer everywhere)."""
    window = episodes.take_window()
    return_sum, finished = exchange.collective(lambda c: sum_over_ranks(c, window), "progress")
    if exchange.rank == 0:
        progress.take_over()          # the lowest survivor reports after a failure
    progress.report(update=count.update, env_steps=count.env_steps, episodes=finished,
                    return_sum=return_sum, comm_share=comm_share(count.phases))
    mine = episodes.recent_mean()
    means = [m for m in exchange.collective(lambda c: c.allgather(mine), "progress")
             if m is not None]
    return reached_target(cfg.target_return, means, exchange.size)


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


def finish(cfg: Config, exchange: Exchange, learner: Learner, count: Counters,
           episodes: Episodes, progress: Progress, log: RunLogger, solved: bool) -> Summary:
    """The last checks and collectives, the summary, and the log closed."""
    if cfg.checksum_every:
        check_replicas(learner, exchange, count.update)
    progress.close()
    share = exchange.collective(lambda c: c.allreduce(comm_share(count.phases)),
                                "summary") / exchange.size
    last_returns = exchange.collective(lambda c: final_mean_return(c, episodes), "summary")
    failed = sorted(r for e in exchange.team.events for r in e.failed)
    summary = Summary(mode="sync", topology=cfg.topology, ranks=count.world_size,
                      updates=count.update, env_steps=count.env_steps,
                      wall_s=progress.elapsed(), gradients_sent=count.gradients,
                      gradients_applied=count.gradients, gradients_dropped=0,
                      final_mean_return=last_returns, comm_share=share,
                      phase_s=count.phases, reached_target=solved,
                      param_digest=learner.param_digest(), gradient_bytes=learner.grad.nbytes,
                      updates_skipped=count.skipped, ranks_failed=failed,
                      writer_rank=exchange.world[0])
    log.close(summary.totals(), writer=exchange.rank == 0)
    return summary
