"""async (A3C) and quorum (DPPO's leader): a parameter server at rank 0, workers elsewhere.

Wiring: rank 0 holds the parameter-server part (a policy of :mod:`mpirl.parts.server`)
and the learner's optimizer, and runs no environment; ranks 1..N-1 hold envs, an actor
and a learner that only computes gradients.  What travels: each worker's gradient, one
flat buffer, to the server, with a few numbers of metadata (:data:`META`), and fresh
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
with :class:`~mpirl.resilience.stop.StopRequested` (exit 143).  A budget already spent
wins: the run then ends normally.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from mpi4py import MPI

from topologies.paramserver import TAG_PARAMS, TAG_SNAPSHOT, TAG_SNAPSHOT_STOP, ParameterServer

from ..config import Config
from ..parts.actor import Actor, ModelPolicy
from ..parts.learner import Batch, Learner
from ..parts.replay import FifoReplay
from ..parts.server import AsyncPolicy, QuorumPolicy
from ..resilience import checkpoint
from ..resilience.checkpoint import TrainingState
from ..resilience.guard import Guard
from ..resilience.schedule import Schedule
from ..resilience.snapshot import PARAMS, SNAPSHOT, SNAPSHOT_STOP, Snapshots
from ..resilience.stop import StopRequested
from ..telemetry.progress import Progress
from ..telemetry.runlog import RunLogger
from ..telemetry.timing import PhaseTimer, add_phases
from .common import (Episodes, Summary, build_replica, check_same_model, final_mean_return,
                     reached_target)

#: the numbers a worker sends with every push (float64).
META = ("env_steps", "episodes", "return_sum", "pushes", "exchange_s", "busy_s",
        "recent_mean", "stop")   # recent_mean: NaN until the worker has finished 20
                                 # episodes; stop: 1 once the worker got SIGTERM/SIGINT
_STEPS, _EPISODES, _RETURNS, _PUSHES, _EXCHANGE, _BUSY, _RECENT, _STOP = range(len(META))
_TAGS = {PARAMS: TAG_PARAMS, SNAPSHOT: TAG_SNAPSHOT, SNAPSHOT_STOP: TAG_SNAPSHOT_STOP}


class AccountingError(RuntimeError):
    """Gradients sent by workers do not add up to gradients applied plus dropped."""


def run_async(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    if cfg.servers > 1:          # the same workers, their gradients over sharded servers
        from .gorila import run_sharded
        return run_sharded(cfg, comm, run_dir, dqn=False)
    return _run(cfg, comm, run_dir, lambda learner: AsyncPolicy())


def run_quorum(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    quorum = cfg.quorum_size(comm.Get_size())
    return _run(cfg, comm, run_dir, lambda learner: QuorumPolicy(
        quorum, cfg.late, learner.grad.size, learner.grad.dtype))


def _run(cfg: Config, comm: MPI.Comm, run_dir: Path, make_policy) -> Summary:
    ps = ParameterServer(comm, root=0, meta_len=len(META))
    learner, actor = build_replica(cfg, ps.rank, with_actor=not ps.is_server)
    check_same_model(comm, learner)
    generation = _resume_generation(comm, run_dir) if cfg.resume else None
    summary = Summary(mode=cfg.mode, topology=cfg.topology, ranks=ps.size,
                      gradient_bytes=learner.grad.nbytes)
    episodes = None
    if ps.is_server:
        server = Server(cfg, ps, learner, make_policy(learner), run_dir, generation)
        server.serve()
        if server.stopped:
            server.log.close()
            raise StopRequested(server.policy.version, run_dir)
        server.fill(summary)
        # staleness of every applied gradient, in the order they were applied
        np.save(run_dir / "staleness.npy", np.asarray(server.policy.staleness, dtype=np.int64))
    else:
        worker = Worker(cfg, ps, learner, actor, run_dir, generation)
        worker.work()
        if worker.stopped:
            worker.log.close()
            raise StopRequested(worker.pushes, run_dir)
        episodes = worker.episodes
        summary.gradients_sent, summary.updates_skipped = worker.pushes, worker.skipped
        summary.phase_s = worker.phases
    # Collective bookkeeping after the exchange has ended: no traffic during it.
    sent = comm.allreduce(summary.gradients_sent if not ps.is_server else 0)
    summary.updates_skipped = comm.allreduce(summary.updates_skipped)
    summary.final_mean_return = final_mean_return(comm, episodes)
    summary.phase_s = comm.bcast(summary.phase_s if ps.rank == 1 else None, root=1)
    log = server.log if ps.is_server else worker.log
    if ps.is_server:
        summary.gradients_sent = sent
        if sent != summary.gradients_applied + summary.gradients_dropped:
            raise AccountingError(
                f"workers sent {sent} gradients but the server applied "
                f"{summary.gradients_applied} and dropped {summary.gradients_dropped}")
        # every rank is done writing: a snapshot cut short by the budget's end is dropped
        last = checkpoint.latest_complete(run_dir, ps.size)
        checkpoint.remove_generations(run_dir, lambda g: last is not None and g <= last)
    log.close(summary.totals())
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


def _restore(saved: TrainingState, run_dir: Path, rank: int, generation: int, size: int):
    state = saved.restore(run_dir, rank, generation)
    if state["generation"] != generation or state["world_size"] != size:
        raise RuntimeError(f"checkpoint {checkpoint.path_for(run_dir, rank, generation)} "
                           f"is of generation {state['generation']} of a "
                           f"{state['world_size']}-rank run")


class Worker:
    """A worker's loop: roll out, push, take the reply; writes its checkpoint when the
    reply says so."""

    def __init__(self, cfg: Config, ps: ParameterServer, learner: Learner, actor: Actor,
                 run_dir: Path, generation: int | None) -> None:
        self.cfg, self.ps, self.learner, self.actor = cfg, ps, learner, actor
        self.run_dir, self.generation = run_dir, 0
        self.episodes = Episodes()
        self.phases: dict[str, float] = {}    # seconds per phase, over the whole run
        self.pushes = self.skipped = 0
        self.owed = np.zeros(3)     # env steps, episodes, return sum not yet reported
        self.replay = FifoReplay(capacity=1, reuse=cfg.update_repeat)   # the rollout in use
        self.stopped = False                  # ended by a stop snapshot (SIGTERM/SIGINT)
        self.clip_norm = 0.0      # > 0: clip the gradient here (sharded servers do not)
        self.resumed = generation is not None
        self.saved = TrainingState(self, learner, actor, self.episodes)
        if self.resumed:
            _restore(self.saved, run_dir, ps.rank, generation, ps.size)
        self.log = RunLogger(cfg, ps.comm, run_dir, role="worker",
                             resume_update=self.pushes if self.resumed else None)

    def work(self) -> None:
        cfg, ps, learner, log = self.cfg, self.ps, self.learner, self.log
        policy, timer, meta = ModelPolicy(learner.model), PhaseTimer(), np.zeros(ps.meta_len)
        alive = True
        with Guard(cfg, ps.comm, ps.rank) as guard:
            if not self.resumed:   # a resumed worker holds the parameters of its checkpoint
                with timer("exchange_s"):
                    alive = ps.pull(learner.params, timeout_s=cfg.wait_timeout_s)
                add_phases(self.phases, timer.take())
            log.begin()
            while alive:
                if not self.replay:
                    guard.at(f"computing push {self.pushes + 1}")
                    self.replay.add(learner.batch(self._collect(policy, timer)))
                losses = learner.gradient(self.replay.next(), timer)
                if not guard.check(self.pushes + self.skipped + 1, learner.grad):
                    self.skipped += 1     # not pushed; its env steps travel with the next push
                    continue
                if self.clip_norm:
                    learner.clip_grad(self.clip_norm)
                self._fill(meta, guard.stop_requested, busy_s=timer.total())
                stats = ps.stats
                sent, received, waited = stats.bytes_sent, stats.bytes_recv, stats.wait_s
                guard.at(f"waiting for the server's reply to push {self.pushes + 1}")
                with timer("exchange_s"):
                    ps.push(learner.grad, meta)
                    self.pushes += 1
                    alive = ps.pull(learner.params, timeout_s=cfg.wait_timeout_s)
                self.owed[:] = 0.0
                add_phases(self.phases, log.record(
                    self.pushes, timer, bytes_sent=stats.bytes_sent - sent,
                    bytes_recv=stats.bytes_recv - received, wait_s=stats.wait_s - waited,
                    env_steps=int(meta[_STEPS]), **losses))
                guard.beat(self.pushes, "between pushes")
                if ps.snapshot:           # the server's cut: write this worker's side of it
                    self.stopped = not alive
                    self.generation += 1
                    log.flush()           # the log holds every row the checkpoint covers
                    self.saved.save(self.run_dir, ps.rank, self.generation)

    def _collect(self, policy, timer):
        """One rollout; its episodes and simulator times are logged, and owed to the
        server (they travel with the next push)."""
        actor, push = self.actor, self.pushes + 1
        rollout = actor.collect(policy, self.cfg.rollout_steps, timer)
        finished = actor.drain_episodes()
        self.episodes.add(finished)
        self.log.episodes(push, finished)
        self.log.sim_times(push, actor.drain_sim_times())
        self.owed += (self.cfg.steps_per_batch, len(finished), sum(r for r, _ in finished))
        return rollout

    def _fill(self, meta: np.ndarray, stop: bool, busy_s: float) -> None:
        """The numbers that travel with the next push (:data:`META`)."""
        meta[_STEPS], meta[_EPISODES], meta[_RETURNS] = self.owed
        meta[_PUSHES] = self.pushes + 1
        meta[_EXCHANGE] = self.phases.get("exchange_s", 0.0)
        meta[_BUSY] = sum(self.phases.values()) + busy_s
        recent = self.episodes.recent_mean()
        meta[_RECENT] = np.nan if recent is None else recent
        meta[_STOP] = stop

    def state(self) -> dict:
        return {"generation": self.generation, "world_size": self.ps.size,
                "pushes": self.pushes, "skipped": self.skipped, "phases": dict(self.phases),
                "owed": self.owed.tolist(),
                "replay": self.replay.state(encode=lambda batch: dict(vars(batch)))}

    def load_state(self, state: dict) -> None:
        self.generation, self.pushes, self.skipped = (state["generation"], state["pushes"],
                                                      state["skipped"])
        self.phases = dict(state["phases"])
        self.owed[:] = state["owed"]
        self.replay.load_state(state["replay"], decode=lambda saved: Batch(**saved))


class ServerBook:
    """What the server knows of its workers: pushes taken from each, env steps, episode
    statistics and their time shares, from the numbers that come with each push."""

    def __init__(self, workers: list[int], world_size: int) -> None:
        self.world_size = world_size
        self.received = {w: 0 for w in workers}       # pushes taken, per worker
        self.rows = 0                                 # rows in the server's log
        self.env_steps = 0
        self.window = [0.0, 0.0]                 # episodes, return sum since last report
        self.worker_time: dict[int, tuple[float, float]] = {}   # exchange_s, busy_s
        self.recent_means: dict[int, float] = {}
        self.solved = False

    def account(self, worker: int, meta: np.ndarray) -> bool:
        """Take in a push's numbers; True when its worker asks the run to stop."""
        self.received[worker] += 1
        if int(meta[_PUSHES]) != self.received[worker]:
            raise AccountingError(f"worker {worker} says this is its push {int(meta[_PUSHES])}"
                                  f", but it is the {self.received[worker]}th the server took")
        self.env_steps += int(meta[_STEPS])
        self.window[0] += float(meta[_EPISODES])
        self.window[1] += float(meta[_RETURNS])
        self.worker_time[worker] = (float(meta[_EXCHANGE]), float(meta[_BUSY]))
        if not np.isnan(meta[_RECENT]):
            self.recent_means[worker] = float(meta[_RECENT])
        return bool(meta[_STOP])

    def report(self, progress: Progress, policy: AsyncPolicy, target_return: float,
               judges: int) -> None:
        """Check ``target_return`` (over ``judges`` workers' windows), write one progress
        line, start a fresh window."""
        self.solved = self.solved or reached_target(
            target_return, list(self.recent_means.values()), judges)
        recent = policy.staleness[-100:]
        progress.report(update=policy.version, env_steps=self.env_steps,
                        episodes=self.window[0], return_sum=self.window[1],
                        comm_share=self.comm_share(),
                        mean_staleness=float(np.mean(recent)) if recent else 0.0)
        self.window = [0.0, 0.0]

    def fill(self, summary: Summary, policy: AsyncPolicy, progress: Progress) -> None:
        """The run's server-side figures (a sharded run: shard 0's)."""
        summary.updates = policy.version
        summary.env_steps = self.env_steps
        summary.wall_s = progress.elapsed()
        summary.gradients_applied = policy.applied
        summary.gradients_dropped = policy.dropped
        summary.mean_staleness = float(np.mean(policy.staleness)) if policy.staleness else 0.0
        summary.comm_share = self.comm_share()
        summary.reached_target = self.solved

    def comm_share(self) -> float:
        exchange = sum(e for e, _ in self.worker_time.values())
        busy = sum(b for _, b in self.worker_time.values())
        return exchange / busy if busy else 0.0

    def state(self) -> dict:
        return {"world_size": self.world_size, "env_steps": self.env_steps,
                "received": dict(self.received), "rows": self.rows,
                "window": [float(x) for x in self.window],
                "worker_time": {w: [float(e), float(b)]
                                for w, (e, b) in self.worker_time.items()},
                "recent_means": dict(self.recent_means), "solved": self.solved}

    def load_state(self, state: dict) -> None:
        self.env_steps, self.received = state["env_steps"], dict(state["received"])
        self.rows, self.window = state["rows"], list(state["window"])
        self.worker_time = {w: tuple(t) for w, t in state["worker_time"].items()}
        self.recent_means = dict(state["recent_means"])
        self.solved = state["solved"]


class Server:
    """The parameter server's loop, for async and quorum modes (the policy decides)."""

    def __init__(self, cfg: Config, ps: ParameterServer, learner: Learner,
                 policy: AsyncPolicy, run_dir: Path, generation: int | None) -> None:
        self.cfg, self.ps, self.learner, self.policy = cfg, ps, learner, policy
        self.run_dir = run_dir
        self.book = ServerBook(ps.workers, ps.size)
        self.snaps = Snapshots(run_dir, cfg.checkpoint_every)
        self.progress = Progress(run_dir, enabled=True, resume=generation is not None)
        self.active = set(ps.workers)
        self.stopping = False                    # the budget is spent: STOP every worker
        self.stopped = False                     # ended by a stop snapshot
        self.resumed = generation is not None
        self.saved = TrainingState(self.book, policy, self.snaps, learner, self.progress)
        if self.resumed:
            _restore(self.saved, run_dir, ps.rank, generation, ps.size)
        self.log = RunLogger(cfg, ps.comm, run_dir, role="server",
                             resume_rows=self.book.rows if self.resumed else None)
        # the order of the pushes taken: recorded, or enforced (--replay-schedule)
        self.schedule = Schedule(run_dir, ps.rank, cfg.replay_schedule)
        self._apply_timer = PhaseTimer()   # serve() times the whole handling of a push

    def serve(self) -> None:
        ps, policy, log = self.ps, self.policy, self.log
        ps.open(self.learner.params.size, self.learner.params.dtype)
        if not self.resumed:      # resumed workers hold their checkpoint's parameters
            for worker in ps.workers:
                self._answer(worker)
        timer = PhaseTimer()
        with Guard(self.cfg, ps.comm, ps.rank) as guard:
            log.begin()
            while self.active:
                if guard.stop_requested and not self.snaps.stop_requested:
                    self.snaps.request_stop(self.active, self.stopping)
                guard.inject(policy.version + 1, self.learner.params)  # exit/raise/hang
                stats = ps.stats
                sent, received, waited = stats.bytes_sent, stats.bytes_recv, stats.wait_s
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
                with timer("optimizer_s"):
                    self._handle(worker, buf)
                # one row per gradient received: the version it was computed on, its staleness
                log.record(policy.version, timer, bytes_sent=stats.bytes_sent - sent,
                           bytes_recv=stats.bytes_recv - received, wait_s=stats.wait_s - waited,
                           env_steps=int(meta[_STEPS]), param_version=computed_on,
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
        self.ps.reply(worker, self.learner.params, tag=_TAGS[flag])
        self.policy.sent(worker)

    def _stop(self, worker: int) -> None:
        self.ps.stop(worker)
        self.active.discard(worker)

    def _end_now(self) -> bool:
        """The budget is spent (and no stop snapshot is under way): STOP every worker.
        A regular snapshot still open is dropped (its files are an incomplete generation)."""
        if self.snaps.open is not None and self.snaps.open.stop:
            return False
        self.stopping = self.book.env_steps >= self.cfg.total_steps or self.book.solved
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
        self.book.report(self.progress, self.policy, self.cfg.target_return,
                         len(self.ps.workers))

    def fill(self, summary: Summary) -> None:
        self.book.fill(summary, self.policy, self.progress)
        summary.param_digest = self.learner.param_digest()
        summary.snapshots, summary.snapshot_s = self.snaps.taken, self.snaps.seconds
