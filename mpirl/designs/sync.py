"""sync (A2C / synchronous DPPO): every rank's gradient, averaged by one allreduce, every step.

Wiring: every rank holds all five parts but the server: its envs, an actor stepping
them with its own replica's policy, and a learner; what travels is the gradient, one
flat buffer per update, through the chosen topology's allreduce.  Per rollout and per
update repeat, on every rank::

    pending = gradients.start(update)          # --overlap: the buckets armed
    learner.gradient(batch)                    # backward into learner.grad (and out)
    pending.wait()                             # the whole exchange, or what is left
    learner.apply()                            # the same Adam step everywhere

Without ``--overlap`` the exchange is one allreduce of the whole buffer in ``wait``;
with it, buckets of the buffer leave during backward (:mod:`mpirl.kit.overlap`).

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

from pathlib import Path

from mpi4py import MPI

from ..config import Config
from ..kit.common import Summary
from ..kit.syncrank import SyncRank
from ..parts.actor import ModelPolicy
from ..telemetry.timing import PhaseTimer


def run_sync(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    rank = SyncRank.start(cfg, comm, run_dir)
    learner, actor, gradients = rank.learner, rank.actor, rank.gradients
    policy, timer = ModelPolicy(learner.model), PhaseTimer()
    with rank.guarded(comm) as guard:
        while rank.next_rollout():
            batch = learner.batch(actor.collect(policy, cfg.rollout_steps, timer))
            for update, part, first in rank.updates(batch):  # epochs x minibatches
                pending = gradients.start(update)          # --overlap: buckets armed
                losses = learner.gradient(part, timer)     # ... and sent as backward fills them
                guard.check(update, learner.grad)          # --fail; NaN: 'stop' raises
                with timer("exchange_s"):
                    pending.wait()                         # the whole exchange, or its rest
                if rank.usable(learner.grad):              # else a NaN every rank skips
                    learner.apply(timer)
                rank.record(update, timer, losses, first)
            if rank.rollout_done() or rank.stop_agreed():  # --target-return; a signal
                break
    return rank.finish()
