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

from mpi4py import MPI

import topologies

from ..config import Config
from ..progress import Progress
from ..replica import Replica
from ..timing import PhaseTimer
from ..faults import FaultInjector, Watchdog, check_gradient, finite
from .common import (Episodes, RunLogger, Summary, check_same_model, comm_share,
                     final_mean_return, reached_target, sum_over_ranks)


class ReplicaDivergence(RuntimeError):
    """Ranks hold different parameters or optimizer state: the comparison is void."""


def check_replicas(replica: Replica, comm: MPI.Comm, update: int) -> None:
    replica.flat.check_views()
    digests = comm.allgather(replica.digest())
    if len(set(digests)) != 1:
        odd = [r for r, d in enumerate(digests) if d != digests[0]]
        raise ReplicaDivergence(
            f"replicas diverged by update {update}: ranks {odd} differ from rank 0 in "
            "parameters or optimizer state")


def run_sync(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    rank, size = comm.Get_rank(), comm.Get_size()
    replica = Replica(cfg, rank)
    check_same_model(comm, replica)
    topo = topologies.get(cfg.topology)(comm)
    topo.bcast(replica.flat.param_np, root=0)     # identical start, whatever torch did
    grad = replica.flat.grad_np
    logger = RunLogger(cfg, comm, run_dir, role="worker")

    batches = cfg.total_steps // (size * replica.steps_per_batch)
    timer, phases = PhaseTimer(), {}
    episodes = Episodes()
    progress = Progress(run_dir, enabled=rank == 0)
    update = skipped = 0
    solved = False
    faults = FaultInjector(cfg.fail, rank)
    watchdog = Watchdog(comm, cfg.watchdog_s, rank)
    logger.mark_update_start()
    for batch_index in range(1, batches + 1):
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
            watchdog.at(f"in the exchange of update {update + 1}, waiting for other ranks")
            with timer("exchange_s"):
                topo.allreduce(grad, average=True)
            if finite(grad):     # a NaN anywhere reached every rank: all skip together
                replica.apply(timer)
            else:
                skipped += 1
            update_phases = timer.take()
            for phase, seconds in update_phases.items():
                phases[phase] = phases.get(phase, 0.0) + seconds
            logger.record(update + 1, update_phases,
                          bytes_sent=topo.stats.bytes_sent - sent,
                          bytes_recv=topo.stats.bytes_recv - received,
                          env_steps=replica.steps_per_batch if repeat == 0 else 0,
                          param_version=update, staleness=0)
            update += 1
            watchdog.beat(update, "between updates")
            if cfg.checksum_every and update % cfg.checksum_every == 0:
                check_replicas(replica, comm, update)
        episodes.add(finished)
        logger.episodes(update, finished)
        if batch_index % cfg.log_every == 0 or batch_index == batches:
            return_sum, count = sum_over_ranks(comm, episodes.take_window())
            progress.report(update=update, env_steps=batch_index * size * replica.steps_per_batch,
                            episodes=count, return_sum=return_sum, comm_share=comm_share(phases))
            means = [m for m in comm.allgather(episodes.recent_mean()) if m is not None]
            if reached_target(cfg.target_return, means, size):   # same answer on every rank
                batches, solved = batch_index, True
                break
    watchdog.stop()
    if cfg.checksum_every:
        check_replicas(replica, comm, update)
    progress.close()
    share = comm.allreduce(comm_share(phases)) / size
    summary = Summary(mode="sync", topology=cfg.topology, ranks=size, updates=update,
                      env_steps=batches * size * replica.steps_per_batch,
                      wall_s=progress.elapsed(), gradients_sent=update * size,
                      gradients_applied=update * size, gradients_dropped=0,
                      final_mean_return=final_mean_return(comm, episodes), comm_share=share,
                      phase_s=phases, reached_target=solved,
                      param_digest=replica.param_digest(), gradient_bytes=grad.nbytes,
                      updates_skipped=skipped)
    logger.close(summary.totals())
    return summary
