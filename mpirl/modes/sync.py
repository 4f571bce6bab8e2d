"""sync (A2C / synchronous DPPO): every rank's gradient, averaged by one allreduce, every step.

Per batch and per update repeat, on every rank:

    replica.gradient(batch)                                 # backward into flat.grad_np
    topo.allreduce(replica.flat.grad_np, average=True)      # the whole exchange
    replica.apply()                                         # the same Adam step everywhere

Identical initial parameters (broadcast from rank 0), identical averaged gradients and
a deterministic optimizer keep the replicas byte-identical; every ``checksum_every``
updates a SHA-256 of parameters and Adam state is compared across ranks to prove it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from mpi4py import MPI

import topologies

from .. import checkpoint
from ..config import Config
from ..progress import Progress
from ..replica import Replica
from ..timing import PhaseTimer
from ..ulfm import Backup, Team
from ..faults import (FaultInjector, StopFlag, StopRequested, Watchdog, check_gradient,
                      finite)
from .common import (Episodes, RunLogger, Summary, check_same_model, comm_share,
                     final_mean_return, reached_target, sum_over_ranks)


class ReplicaDivergence(RuntimeError):
    """Ranks hold different parameters or optimizer state: the comparison is void."""


def check_replicas(replica: Replica, team: Team, update: int) -> None:
    replica.flat.check_views()
    digest = replica.digest()
    digests = team.run(lambda c: c.allgather(digest), f"replica check at update {update}")
    if len(set(digests)) != 1:
        odd = [team.world[r] for r, d in enumerate(digests) if d != digests[0]]
        raise ReplicaDivergence(
            f"replicas diverged by update {update}: ranks {odd} differ from rank 0 in "
            "parameters or optimizer state")


def _restore(replica: Replica, episodes: Episodes, state: dict, seed: int) -> None:
    """Put a replica back where a checkpoint left it."""
    replica.flat.param_np[:] = state["params"].numpy()
    replica.opt.load_state_dict(state["adam"])
    torch.set_rng_state(state["torch_rng"])
    if checkpoint.restore_env_state(replica.envs, state["envs"], seed):
        replica.roller.load_state(state["roller"])
    else:                             # the env could not be saved: a fresh start of it
        replica.roller.start(seed)
    episodes.load_state(state["episodes"])


def run_sync(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    rank, launched = comm.Get_rank(), comm.Get_size()
    replica = Replica(cfg, rank)
    check_same_model(comm, replica)
    # every collective of the loop goes through the team: under --on-failure shrink (ULFM)
    # it is agreed by the survivors and redone on a shrunk communicator after a failure
    team = Team(comm, cfg.on_failure)
    topo = topologies.get(cfg.topology)(team.comm)

    def rebuild(new_comm: MPI.Comm) -> None:
        nonlocal topo
        topo = topologies.get(cfg.topology)(new_comm)
    team.on_shrink(rebuild)
    topo.bcast(replica.flat.param_np, root=0)     # identical start, whatever torch did
    grad = replica.flat.grad_np
    backup = Backup(grad) if cfg.on_failure == "shrink" else None
    spb = replica.steps_per_batch
    timer, phases = PhaseTimer(), {}
    episodes = Episodes()
    update = skipped = batch_index = env_steps = gradients = 0
    wall_before = 0.0
    if cfg.resume:
        state = checkpoint.load(run_dir, rank)
        batch_index, update, skipped = state["batch_index"], state["update"], state["skipped"]
        env_steps = state.get("env_steps", batch_index * launched * spb)
        gradients = state.get("gradients", update * launched)
        wall_before, phases = state["wall_s"], dict(state["phases"])
        _restore(replica, episodes, state, cfg.seed + 10000 * rank + batch_index)
    logger = RunLogger(cfg, comm, run_dir, role="worker",
                       resume_update=update if cfg.resume else None)
    progress = Progress(run_dir, enabled=rank == 0, resume=bool(cfg.resume),
                        elapsed_s=wall_before)

    def save_checkpoint() -> None:
        if team.events:               # a resume needs the launch's rank count: see README
            return
        logger.log.flush()            # the log holds every row the checkpoint covers
        checkpoint.save(run_dir, rank, {
            "batch_index": batch_index, "update": update, "skipped": skipped,
            "env_steps": env_steps, "gradients": gradients,
            "world_size": launched, "wall_s": progress.elapsed(), "phases": dict(phases),
            "params": torch.from_numpy(replica.flat.param_np.copy()),
            "adam": replica.opt.state_dict(), "torch_rng": torch.get_rng_state(),
            "envs": checkpoint.env_state(replica.envs), "roller": replica.roller.state(),
            "episodes": episodes.state()})

    solved = False
    faults = FaultInjector(cfg.fail, rank)
    watchdog = Watchdog(comm, cfg.watchdog_s, rank)
    stop = StopFlag()
    logger.mark_update_start()
    while env_steps + team.size * spb <= cfg.total_steps:
        batch_index += 1
        watchdog.at(f"computing update {update + 1}")
        batch = replica.collect(timer)
        finished = replica.roller.drain_episodes()
        logger.sim_times(update + 1, replica.roller.drain_sim_times())
        for repeat in range(cfg.update_repeat):
            watchdog.at(f"computing update {update + 1}")
            replica.gradient(batch, timer)
            faults.before_exchange(update + 1, grad)
            check_gradient(grad, cfg.nan_policy, rank, update + 1)   # raises for 'stop'
            sent, received = topo.stats.bytes_sent, topo.stats.bytes_recv
            logger.mark_exchange_start()
            where = f"in the exchange of update {update + 1}, waiting for other ranks"
            watchdog.at(where)
            known_failures = len(team.events)
            with timer("exchange_s"):
                if backup is not None:
                    backup.save()
                team.run(lambda c: topo.allreduce(grad, average=True), where,
                         restore=backup.restore if backup is not None else None)
            for event in team.events[known_failures:]:
                logger.failure(update + 1, event)
            # with 'stop' every rank checked its own gradient above, so only 'skip' can
            # bring a NaN here: it reached every rank, and all skip this step together
            if cfg.nan_policy == "skip" and not finite(grad):
                skipped += 1
            else:
                replica.apply(timer)
            update_phases = timer.take()
            for phase, seconds in update_phases.items():
                phases[phase] = phases.get(phase, 0.0) + seconds
            logger.record(update + 1, update_phases,
                          bytes_sent=topo.stats.bytes_sent - sent,
                          bytes_recv=topo.stats.bytes_recv - received,
                          env_steps=spb if repeat == 0 else 0,
                          param_version=update, staleness=0)
            update += 1
            gradients += team.size
            watchdog.beat(update, "between updates")
            if cfg.checksum_every and update % cfg.checksum_every == 0:
                check_replicas(replica, team, update)
        env_steps += team.size * spb
        last = env_steps + team.size * spb > cfg.total_steps
        episodes.add(finished)
        logger.episodes(update, finished)
        if batch_index % cfg.log_every == 0 or last:
            window = episodes.take_window()
            return_sum, count = team.run(lambda c, w=window: sum_over_ranks(c, w), "progress")
            if team.rank == 0:
                progress.take_over()          # the lowest survivor reports after a failure
            progress.report(update=update, env_steps=env_steps,
                            episodes=count, return_sum=return_sum, comm_share=comm_share(phases))
            mine = episodes.recent_mean()
            means = [m for m in team.run(lambda c, m=mine: c.allgather(m), "progress")
                     if m is not None]
            if reached_target(cfg.target_return, means, team.size):   # same on every rank
                solved = True
                break
        if cfg.checkpoint_every and batch_index % cfg.checkpoint_every == 0:
            save_checkpoint()
        if team.run(stop.agreed, "stop check"):   # SIGTERM/SIGINT on any rank: all stop here
            if team.events:
                break                 # no checkpoint after a shrink: end as if done
            watchdog.stop()
            save_checkpoint()
            logger.close()
            progress.close()
            raise StopRequested(update, run_dir)
    stop.restore()
    watchdog.stop()
    if cfg.checkpoint_every:
        save_checkpoint()
    if cfg.checksum_every:
        check_replicas(replica, team, update)
    progress.close()
    share = team.run(lambda c: c.allreduce(comm_share(phases)), "summary") / team.size
    last_returns = team.run(lambda c: final_mean_return(c, episodes), "summary")
    failed = sorted(r for e in team.events for r in e.failed)
    summary = Summary(mode="sync", topology=cfg.topology, ranks=launched, updates=update,
                      env_steps=env_steps, wall_s=progress.elapsed(),
                      gradients_sent=gradients, gradients_applied=gradients,
                      gradients_dropped=0, final_mean_return=last_returns, comm_share=share,
                      phase_s=phases, reached_target=solved,
                      param_digest=replica.param_digest(), gradient_bytes=grad.nbytes,
                      updates_skipped=skipped, ranks_failed=failed, writer_rank=team.world[0])
    logger.close(summary.totals(), writer=team.rank == 0)
    return summary
