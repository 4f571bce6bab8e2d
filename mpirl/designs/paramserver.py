"""async (A3C) and quorum (DPPO's leader): a parameter server at rank 0, workers elsewhere.

Wiring: rank 0 holds the parameter-server part (a policy of :mod:`mpirl.parts.server`)
and the learner's optimizer, and runs no environment; ranks 1..N-1 hold envs, an actor
and a learner that only computes gradients.  What travels: each worker's gradient, one
flat buffer, to the server, with a few numbers of metadata (:data:`PUSH_META`), and fresh
parameters back, one flat buffer, through
:class:`topologies.paramserver.ParameterServer`.  A worker loops: receive parameters ->
roll out -> gradient -> push -> wait for the reply.  The server, push by push, lets its
policy decide whether a step is due and whose reply follows it.

Accounting: every push a worker sends is either applied or dropped, and the totals are
checked at the end (sent == applied + dropped); every push also carries its worker's
push count, which the server checks against the pushes it took from that worker.
Shutdown: once the env-step budget is reached, each worker's next push is taken,
counted as dropped, and answered with STOP, so no message is left in flight when MPI
finalizes.

Checkpoints: a consistent snapshot without stopping the world
--------------------------------------------------------------
Every worker has at most one push in flight, so a cut can be taken one worker at a time.
Every ``--checkpoint-every`` server updates (and when a stop is requested) the server
starts *snapshot generation G* (:class:`mpirl.resilience.snapshot.Snapshots`): the reply
to each live worker's next push carries tag ``SNAPSHOT`` instead of ``PARAMS``
(``SNAPSHOT_STOP`` for a stop).  A worker that gets it logs the push's row, then writes
``checkpoints/gG/rankNNNN.pt``: the parameters just received, torch's RNG, env and
rollout state, episode statistics, its push count (its log position) and the rollout it
is still learning from (``--update-repeat``).  It then goes on (or, after
``SNAPSHOT_STOP``, stops).  While the snapshot is open the server takes pushes from
not-yet-flagged workers only; a flagged worker's next push waits in MPI, after the cut
on both sides (the price: a fast worker may wait up to one rollout of the slowest, once
per snapshot).  When every live worker is flagged, the server writes its own file of
generation G (parameters, Adam state, its policy's version, counts and staleness list,
env steps, pushes taken per worker, its log row count) and the snapshot is closed.
Every push is thus before the cut on both sides (sent and taken, counted by both) or
after it on both (not counted by either); nothing is in flight across it.

In quorum mode a held push cannot be answered before its round completes, so a
snapshot is one *barrier round*: the round that starts after the due update completes
only once every live worker's push is held (and the quorum of fresh ones is met), then
all are answered, flagged, at once, and the server's checkpoint holds nothing held.
That round waits for the slowest worker, like a sync step, once per snapshot.

Generations: G counts snapshots (the server's and every worker's count agree, since each
snapshot flags every live worker once); the server's file records the version at the cut.
When the server closes generation G, every worker has pushed since it wrote G-1, so G-1
is complete on every rank; the server then deletes generations older than G-1.  A crash
at any moment therefore leaves at least one complete generation once the first has been
written, and ``--resume`` takes the newest complete one (deleting the partial ones
after it).  A push in flight when the job died is after the cut: never counted as sent,
its experience collected again by the resumed worker.  Continuation is not bit-identical
to an uninterrupted run (which push arrives first depends on timing), but the totals
are: sent == applied + dropped over the whole run, before and after the resume.

Stop (SIGTERM/SIGINT): a signalled server opens a ``SNAPSHOT_STOP`` generation (after
the one that may be open); a signalled worker sets ``stop`` in its next push's metadata,
and the server does the same.  Every rank writes its checkpoint, closes its log and ends
with :class:`~mpirl.resilience.stop.StopRequested` (exit 143; 130 after Ctrl-C).  A
budget already spent wins: the run then ends normally.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from mpi4py import MPI

from topologies.paramserver import TAG_PARAMS, TAG_SNAPSHOT, TAG_SNAPSHOT_STOP, ParameterServer

from ..config import Config
from ..kit.common import Summary, close_run, start_replica
from ..kit import ledger
from ..kit.pushpull import PUSH_META, ServerBook, Worker, push_meta_len, restore_generation
from ..kit.shards import run_sharded
from ..parts.learner import Learner
from ..parts.learner.normalize import Moments
from ..parts.server import AsyncPolicy, QuorumPolicy
from ..resilience import checkpoint
from ..resilience.checkpoint import TrainingState
from ..resilience.guard import Guard
from ..resilience.schedule import Schedule
from ..resilience.snapshot import PARAMS, SNAPSHOT, SNAPSHOT_STOP, Snapshots
from ..resilience.stop import StopRequested
from ..telemetry.progress import Progress
from ..telemetry.runlog import RunLogger
from ..telemetry.timing import PhaseTimer

_TAGS = {PARAMS: TAG_PARAMS, SNAPSHOT: TAG_SNAPSHOT, SNAPSHOT_STOP: TAG_SNAPSHOT_STOP}


def run_async(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    if cfg.servers > 1:          # the same workers, their gradients over sharded servers
        if cfg.checkpoint_every and comm.Get_rank() == 0:
            print(f"mpirl: note: sharded servers (--servers {cfg.servers}) take no checkpoint "
                  f"snapshots yet: --checkpoint-every {cfg.checkpoint_every} has no effect in "
                  "this run", flush=True)
        return run_sharded(cfg, comm, run_dir, make_worker=ShardedA3CWorker)
    return _run(cfg, comm, run_dir, lambda learner: AsyncPolicy())


def run_quorum(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    quorum = cfg.quorum_size(comm.Get_size())
    return _run(cfg, comm, run_dir, lambda learner: QuorumPolicy(
        quorum, cfg.late, learner.grad.size, learner.grad.dtype))


def _run(cfg: Config, comm: MPI.Comm, run_dir: Path, make_policy) -> Summary:
    learner, actor = start_replica(cfg, comm, with_actor=comm.Get_rank() != 0)
    ps = ParameterServer(comm, root=0, meta_len=push_meta_len(learner))
    generation = _resume_generation(comm, run_dir) if cfg.resume else None
    part = (Server(cfg, ps, learner, make_policy(learner), run_dir, generation) if ps.is_server
            else Worker(cfg, ps, learner, actor, run_dir, generation))
    part.run()
    if part.stopped:                     # a stop snapshot: every rank wrote its side
        part.log.close()
        raise StopRequested(part.position, run_dir, comm.Get_size())
    summary = Summary.of(cfg, ps.size, learner)
    part.fill(summary)
    summary.phase_s = comm.bcast(summary.phase_s if ps.rank == 1 else None, root=1)
    # Collective bookkeeping after the exchange has ended: no traffic during it.
    close_run(summary, comm, part, ledger.GRADIENTS, extra=("updates_skipped",))
    if ps.is_server:    # every rank is done writing: drop a snapshot the end cut short
        part.drop_unfinished_snapshots()
    return summary


def _resume_generation(comm: MPI.Comm, run_dir: Path) -> int:
    """The newest generation every rank wrote (collective); rank 0 deletes the
    incomplete ones after it, so the resumed run's snapshots do not mix with them."""
    generation = None
    if comm.Get_rank() == 0:
        generation = checkpoint.latest_complete(run_dir, comm.Get_size())
        if generation is not None:
            checkpoint.remove_generations(run_dir, lambda g: g <= generation)
    generation = comm.bcast(generation, root=0)
    if generation is None:
        raise FileNotFoundError(f"{run_dir}: no checkpoint generation that every rank wrote")
    return generation


class Server:
    """The parameter server's loop, for async and quorum modes (the policy decides)."""

    def __init__(self, cfg: Config, ps: ParameterServer, learner: Learner,
                 policy: AsyncPolicy, run_dir: Path, generation: int | None) -> None:
        self.cfg, self.ps, self.learner, self.policy = cfg, ps, learner, policy
        self.run_dir = run_dir
        self.book = ServerBook(cfg, ps.workers, ps.size, judges=len(ps.workers))
        self.snaps = Snapshots(run_dir, cfg.checkpoint_every)
        self.progress = Progress(run_dir, enabled=True, resume=generation is not None)
        self.active = set(ps.workers)
        self.stopping = False                    # the budget is spent: STOP every worker
        self.stopped = False                     # ended by a stop snapshot
        self.resumed = generation is not None
        self.saved = TrainingState(self.book, policy, self.snaps, learner, self.progress)
        if self.resumed:
            restore_generation(cfg, self.saved, run_dir, ps.comm, generation)
        self.log = RunLogger(cfg, ps.comm, run_dir, role="server",
                             resume_rows={"updates": self.book.rows} if self.resumed else None)
        # the order of the pushes taken: recorded, or enforced (--replay-schedule)
        self.schedule = Schedule(run_dir, ps.rank, cfg.replay_schedule)
        self._apply_timer = PhaseTimer()   # run() times the whole handling of a push

    def run(self) -> None:
        ps, policy, log = self.ps, self.policy, self.log
        learner = self.learner    # pushes: gradients; replies: the parameters' wire
        ps.open(learner.params.size, learner.params.dtype, reply_count=learner.wire.size)
        if not self.resumed:      # resumed workers hold their checkpoint's parameters
            for worker in ps.workers:
                self._answer(worker)
        timer = PhaseTimer()
        with Guard(self.cfg, ps.comm, ps.rank) as guard:
            log.watch(ps)
            log.begin()
            while self.active:
                if guard.stop_requested and not self.snaps.stop_requested:
                    self.snaps.request_stop(self.active, self.stopping)
                guard.inject(policy.version + 1, self.learner.params)  # exit/raise/hang
                applied, version = policy.applied, policy.version
                scheduled = self.schedule.next()       # a replay: this worker's push next
                with timer("exchange_s"):
                    worker, buf, meta = ps.wait_push(
                        timeout_s=self.cfg.wait_timeout_s,
                        only=self.snaps.pending if scheduled is None else (scheduled,))
                computed_on = policy.sent_version[worker]
                self.schedule.take(worker, computed_on)
                if self.book.account(worker, meta) and not self.snaps.stop_requested:
                    self.snaps.request_stop(self.active, self.stopping)  # its reply is flagged
                self._observe(meta)
                with timer("optimizer_s"):
                    self._handle(worker, buf)
                # one row per gradient received: the version it was computed on, its staleness
                log.record(policy.version, timer, env_steps=int(meta[PUSH_META["env_steps"]]),
                           param_version=computed_on,
                           staleness=version - computed_on, dropped=int(policy.applied == applied))
                self.book.rows += 1
                if self.snaps.complete:
                    self._close_snapshot()
                guard.beat(policy.version, "waiting for pushes")
        ps.close(timeout_s=self.cfg.wait_timeout_s)
        self.schedule.save()
        if not self.stopped:
            self._report()
        self.progress.close()

    def _observe(self, meta: np.ndarray) -> None:
        """--obs-norm: merge the statistics a push carries, in the order pushes are taken
        (the server owns them; every reply carries them with the parameters)."""
        stats = self.learner.obs_stats
        if stats is not None:
            self.learner.merge_obs_stats([Moments.unpack(meta[len(PUSH_META):],
                                                         stats.mean.shape)])

    def _handle(self, worker: int, buf: np.ndarray) -> None:
        """One push: the policy's decision, the step, then the replies (or STOPs)."""
        if self.stopping:
            self.policy.drop()
            self._stop(worker)
            return
        decision = self.policy.push(worker, buf, hold_all=len(self.active)
                                    if self.snaps.open is not None else None)
        if decision.grad is None:
            return
        self._step(decision.grad)
        end = self._end_now()
        due = not end and self.snaps.due(self.policy.version)
        rounds = self.policy.answers_in_rounds
        if due and not rounds:
            self.snaps.start(self.active)   # this worker's reply is the snapshot's first flag
        for w in decision.release:
            if end:
                self._stop(w)
            else:
                self._answer(w)
        if due and rounds:
            self.snaps.start(self.active)   # the next round is the snapshot's barrier round

    def _step(self, grad: np.ndarray) -> None:
        """One Adam step on ``grad`` (read in place, no copy), then report if due."""
        self.learner.apply(self._apply_timer, grad=grad)
        self.policy.stepped()
        if self.policy.version % self.cfg.log_every == 0:
            self._report()

    def _answer(self, worker: int) -> None:
        """Send ``worker`` the parameters, flagged while a snapshot waits for it."""
        flag = self.snaps.flag(worker)
        if flag == SNAPSHOT_STOP:
            self.active.discard(worker)       # its last reply: it pushes no more
        self.ps.reply(worker, self.learner.wire, tag=_TAGS[flag])
        self.policy.sent(worker)

    def _stop(self, worker: int) -> None:
        self.ps.stop(worker)
        self.active.discard(worker)

    def _end_now(self) -> bool:
        """The budget is spent (and no stop snapshot is under way): STOP every worker.
        A regular snapshot still open is dropped (its files are an incomplete generation)."""
        if self.snaps.open is not None and self.snaps.open.stop:
            return False
        self.stopping = self.book.ends()
        if self.stopping:
            self.snaps.abandon()
        return self.stopping

    def _close_snapshot(self) -> None:
        """Every live worker has been flagged: write the server's side of the cut."""
        assert not getattr(self.policy, "held", None), "a snapshot cut with pushes held"

        def save(generation: int) -> None:
            self.log.flush()        # the log holds every row the checkpoint covers
            self.saved.save(self.run_dir, self.ps.rank, generation)
        self.stopped = self.snaps.close(save, self.active, self.stopping)

    def _report(self) -> None:
        self.book.report_line(self.progress, self.policy)

    def counts(self) -> dict:
        """Its ledger's counts (:mod:`mpirl.kit.ledger`)."""
        return {"gradients_applied": self.policy.applied, "gradients_dropped": self.policy.dropped}

    #: the server runs no envs: no episodes of its own
    episodes = None

    @property
    def position(self) -> int:
        """Where a stop left it: its parameter version."""
        return self.policy.version

    def fill(self, summary: Summary) -> None:
        """The server's figures; the staleness of every applied gradient, in the order
        they were applied, to ``staleness.npy``."""
        self.book.fill(summary, self.policy, self.progress)
        summary.param_digest = self.learner.param_digest()
        summary.snapshots, summary.snapshot_s = self.snaps.taken, self.snaps.seconds
        np.save(self.run_dir / "staleness.npy",
                np.asarray(self.policy.staleness, dtype=np.int64))

    def drop_unfinished_snapshots(self) -> None:
        """Delete generations after the newest complete one (collective end reached)."""
        last = checkpoint.latest_complete(self.run_dir, self.ps.size)
        checkpoint.remove_generations(self.run_dir,
                                      lambda g: last is not None and g <= last)


class ShardedA3CWorker(Worker):
    """async's worker over sharded servers (:func:`mpirl.kit.shards.run_sharded`): the
    same loop, the gradient clipped here (the servers hold only shards of it)."""

    def __init__(self, cfg: Config, comms, sps, learner, actor, layout, run_dir: Path) -> None:
        super().__init__(cfg, sps, learner, actor, run_dir, generation=None)
        self.clip_norm = cfg.max_grad_norm
