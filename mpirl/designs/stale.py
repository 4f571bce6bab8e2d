"""sync with ``--one-step-stale``: the next rollout is collected while the last gradient
is still being averaged.

The plain sync loop waits for every exchange before it steps envs again, so the
exchange's time is the envs' idle time.  Here a rank computes its gradient, starts the
exchange (on the exchange's thread, :class:`~mpirl.kit.overlap.Overlap`: one bucket of
the whole buffer unless ``--overlap`` cuts it into several, each sent as backward fills
it) and goes back to its envs; the gradient lands (wait, Adam step, log row) once that
rollout is collected::

    rollout = collect()                 # the last gradient travels meanwhile
    rank.land()                         # ... its wait, the step: parameters k
    rank.owe(batch(rollout))            # collected, not yet learnt
    rollout_done(), stop_agreed()       # the loop's collectives: nothing in flight
    rank.launch()                       # its gradient, sent as backward completes it

What changes is the data, not the step: a rollout is collected with the parameters of
one update before those its gradient is computed with (``staleness`` 1 in the log; 0
for the first rollout and the first after a flush).  PPO's ratio and clipping see it as
off-policy data, as IMPALA's learner sees an unroll one version old.  Every replica
still applies the same averaged gradient to the same parameters: they stay
byte-identical (``--checksum-every``).

The pipeline is flushed (the held gradient landed, nothing in flight) before each
checkpoint, elastic commit, stop, and at the budget's end, so a resumed run continues
exactly as an uninterrupted one: both flush at the same rollouts.  The loop's own
collectives (stop check, progress, observation statistics) run between the landing and
the launch, with nothing in flight: on a slow link a small message queued behind a
gradient's megabytes waits for them (measured: 0.23 s of a 0.8 s update at 100 Mbit/s
when the stop check ran beside the exchange).  The exchange still runs on a
communicator of its own (a duplicate: the same ranks, another context), so nothing it
does can match the loop's messages; ``--on-failure shrink`` is refused with this mode.
One update per rollout: ``--minibatches`` and ``--update-repeat`` stay 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mpi4py import MPI

from ..config import Config
from ..kit.common import Summary
from ..kit.syncrank import SyncRank
from ..parts.actor import ModelPolicy
from ..telemetry.timing import PhaseTimer


def run_stale(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    rank = StaleRank.start(cfg, comm, run_dir)
    learner, actor = rank.learner, rank.actor
    policy, timer = ModelPolicy(learner.model), rank.timer
    with rank.guarded(comm):
        while rank.next_rollout():
            rollout = actor.collect(policy, cfg.rollout_steps, timer)  # the last one travels
            rank.land()                                   # ... its wait and step
            rank.owe(learner.batch(rollout))              # collected, not yet learnt
            if rank.rollout_done() or rank.stop_agreed():  # collectives: nothing in flight
                break
            rank.launch()                                 # sent as backward completes it
        rank.flush()
    return rank.finish()


@dataclass
class Held:
    """An update whose gradient is in flight."""

    pending: object
    update: int
    losses: dict
    staleness: int       # 1: its rollout was collected while the gradient before travelled


@dataclass
class StaleRank(SyncRank):
    """A sync rank that holds one update in flight across its next rollout."""

    owed: object = None           # the batch collected and not yet learnt
    held: Held | None = None      # the update in flight
    timer: PhaseTimer = field(default_factory=PhaseTimer)
    flushed: bool = True          # nothing travelled during the rollout being learnt

    def owe(self, batch) -> None:
        self.owed, self.first_update = batch, self.count.update + 1
        if not self.budget_left():     # the last rollout: learnt before its progress line
            self.flush()

    def launch(self) -> None:
        """The owed batch's gradient, its exchange started (as backward completes it):
        the update is held until :meth:`land`."""
        batch, self.owed = self.owed, None
        if batch is None:
            return
        update = self.count.update + 1
        pending = self.gradients.start(update)
        losses = self.learner.gradient(batch, self.timer)
        self.guard.check(update, self.learner.grad)     # --fail; NaN: 'stop' raises
        self.held = Held(pending, update, losses, 0 if self.flushed else 1)
        self.flushed = False

    def land(self) -> None:
        """The held update's end: its wait, its step, its row (nothing if none)."""
        held, timer = self.held, self.timer
        if held is None:
            return
        self.held = None
        with timer("exchange_s"):
            held.pending.wait()
        if self.usable(self.learner.grad):
            self.learner.apply(timer)
        self.record(held.update, timer, held.losses, first=True, staleness=held.staleness)
        self.guard.beat(held.update, "between updates")

    def flush(self) -> None:
        """Nothing owed, nothing in flight: both learnt, and the next rollout is fresh."""
        self.land()
        self.launch()
        self.land()
        self.flushed = True

    # the saved state is whole only with nothing owed or in flight
    def checkpoint(self) -> None:
        self.flush()
        super().checkpoint()

    def commit(self) -> None:
        self.flush()
        super().commit()

    def stop(self) -> None:
        self.flush()
        super().stop()
