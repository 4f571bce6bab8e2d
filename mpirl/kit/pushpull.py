"""A parameter server's workers and its book of them (async, quorum, and the sharded
servers of gorila and ``async --servers S``).

A :class:`Worker` loops: roll out -> gradient -> push it with :data:`PUSH_META` -> pull the
reply's parameters; it writes its side of a snapshot when the reply says so (the
protocol: :mod:`mpirl.designs.paramserver`).  A :class:`ServerBook` is what a server
knows of its workers from the numbers each push carries: pushes taken from each, env
steps, episode windows, time shares, and the run's target.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from topologies.paramserver import ParameterServer

from ..config import Config
from ..parts.actor import Actor, ModelPolicy
from ..parts.learner import Batch, Learner
from ..parts.learner.normalize import Moments
from ..parts.records import Fields
from ..parts.replay import FifoReplay
from ..parts.server import AsyncPolicy
from ..resilience import checkpoint
from ..resilience.checkpoint import TrainingState
from ..resilience.guard import Guard
from ..telemetry.progress import Progress
from ..telemetry.runlog import RunLogger
from ..telemetry.timing import PhaseTimer, add_phases
from .book import Book
from .common import Episodes, Summary, refuse_failed, say_resumed
from .ledger import count_in_order

#: the numbers a worker sends with every push (float64).
PUSH_META = Fields("env_steps", "episodes", "return_sum", "pushes", "exchange_s", "busy_s",
                   "recent_mean", "stop")   # recent_mean: NaN until the worker has finished
                                            # 20 episodes; stop: 1 once it got SIGTERM/SIGINT


def push_meta_len(learner: Learner) -> int:
    """The numbers a push carries: :data:`PUSH_META`, then (``--obs-norm``) the statistics
    of the observations the worker collected since its last push (a packed
    :class:`~mpirl.parts.learner.normalize.Moments`), which the server merges: it owns
    them, and they travel back with its parameters (the learner's ``wire``)."""
    stats = learner.obs_stats
    return len(PUSH_META) + (0 if stats is None else stats.pack().size)


def restore_generation(cfg: Config, saved: TrainingState, run_dir: Path, comm,
                       generation: int) -> None:
    """Put each rank's saved state of ``generation`` back, checking it is that
    generation's file of a run of this many ranks (nothing is put back from a file that
    is not; a part's own refusal is told whole, as :func:`~.common.resume_in_step`
    tells it).  Collective: the ranks agree before
    rank 0 saves the flags given into config.yaml (a rank's failure is told on every
    rank, none waiting for one that left, and config.yaml is left as it was)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    path, error = checkpoint.path_for(run_dir, rank, generation), ""
    try:
        state = checkpoint.load(run_dir, rank, generation)
    except Exception as err:
        error = checkpoint.unreadable(path, err)
    else:
        recorded = ((state.get("generation"), state.get("world_size"))
                    if isinstance(state, dict) else None)
        if recorded is None:
            error = f"{path.name} holds no checkpoint (a {type(state).__name__})"
        elif recorded != (generation, size):
            error = f"{path.name} is of generation {recorded[0]} of a {recorded[1]}-rank run"
        else:
            error = checkpoint.put_back(saved, state)
    refuse_failed(run_dir, comm.allgather(error))
    if rank == 0:
        say_resumed(cfg, run_dir, f"from checkpoint generation {generation}")


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
        #: --obs-norm: statistics of the observations collected, not yet pushed
        self.owed_obs = None if learner.obs_stats is None else Moments(learner.obs_stats.mean.shape)
        self.replay = FifoReplay(capacity=1, reuse=cfg.update_repeat)   # the rollout in use
        self.stopped = False                  # ended by a stop snapshot (SIGTERM/SIGINT)
        self.clip_norm = 0.0      # > 0: clip the gradient here (sharded servers do not)
        self.resumed = generation is not None
        self.saved = TrainingState(self, learner, actor, self.episodes)
        if self.resumed:
            restore_generation(cfg, self.saved, run_dir, ps.comm, generation)
        self.log = RunLogger(cfg, ps.comm, run_dir, role="worker",
                             resume_update=self.pushes if self.resumed else None)

    def run(self) -> None:
        cfg, ps, learner, log = self.cfg, self.ps, self.learner, self.log
        policy, timer, meta = ModelPolicy(learner.model), PhaseTimer(), np.zeros(ps.meta_len)
        alive = True
        with Guard(cfg, ps.comm, ps.rank) as guard:
            if not self.resumed:   # a resumed worker holds the parameters of its checkpoint
                with timer("exchange_s"):
                    alive = ps.pull(learner.wire, timeout_s=cfg.wait_timeout_s)
            log.watch(ps)
            log.begin(timer, self.phases)
            while alive:
                if not self.replay:
                    guard.at(f"computing push {self.pushes + 1}")
                    self.replay.add(learner.batch(self._collect(policy, timer)))
                    if self.owed_obs is not None:   # once per rollout, however often reused
                        self.owed_obs.merge(learner.batch_obs_stats)
                losses = learner.gradient(self.replay.next(), timer)
                if not guard.check(self.pushes + self.skipped + 1, learner.grad):
                    self.skipped += 1     # not pushed; its env steps travel with the next push
                    continue
                if self.clip_norm:
                    learner.clip_grad(self.clip_norm)
                self._fill(meta, guard.stop_requested, busy_s=timer.total())
                guard.at(f"waiting for the server's reply to push {self.pushes + 1}")
                with timer("exchange_s"):
                    ps.push(learner.grad, meta)
                    self.pushes += 1
                    alive = ps.pull(learner.wire, timeout_s=cfg.wait_timeout_s)
                self.owed[:] = 0.0
                if self.owed_obs is not None:
                    self.owed_obs = Moments(self.owed_obs.mean.shape)
                add_phases(self.phases, log.record(
                    self.pushes, timer, env_steps=int(meta[PUSH_META["env_steps"]]), **losses))
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
        """The numbers that travel with the next push (:data:`PUSH_META`)."""
        for name, value in zip(("env_steps", "episodes", "return_sum"), self.owed, strict=True):
            meta[PUSH_META[name]] = value
        meta[PUSH_META["pushes"]] = self.pushes + 1
        meta[PUSH_META["exchange_s"]] = self.phases.get("exchange_s", 0.0)
        meta[PUSH_META["busy_s"]] = sum(self.phases.values()) + busy_s
        recent = self.episodes.recent_mean()
        meta[PUSH_META["recent_mean"]] = np.nan if recent is None else recent
        meta[PUSH_META["stop"]] = stop
        if self.owed_obs is not None:
            meta[len(PUSH_META):] = self.owed_obs.pack()

    def counts(self) -> dict:
        """Its ledger's counts (:mod:`mpirl.kit.ledger`)."""
        return {"gradients_sent": self.pushes, "updates_skipped": self.skipped}

    @property
    def position(self) -> int:
        """Where a stop left it: its pushes."""
        return self.pushes

    def fill(self, summary: Summary) -> None:
        """A worker's figures: its seconds per phase."""
        summary.phase_s = self.phases

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


class ServerBook(Book):
    """What the server knows of its workers (the run's :class:`~mpirl.kit.book.Book`,
    judged by ``judges`` workers): pushes taken from each, their time shares, from the
    numbers that come with each push."""

    def __init__(self, cfg, workers: list[int], world_size: int, judges: int) -> None:
        super().__init__(cfg, judges)
        self.world_size = world_size
        self.received = {w: 0 for w in workers}       # pushes taken, per worker
        self.rows = 0                                 # rows in the server's log
        self.worker_time: dict[int, tuple[float, float]] = {}   # exchange_s, busy_s

    def account(self, worker: int, meta: np.ndarray) -> bool:
        """Take in a push's numbers; True when its worker asks the run to stop."""
        count_in_order(self.received, worker, meta[PUSH_META["pushes"]], "worker", "push",
                       "the server")
        m = PUSH_META
        self.add(int(meta[m["env_steps"]]), float(meta[m["episodes"]]),
                 float(meta[m["return_sum"]]))
        self.worker_time[worker] = (float(meta[m["exchange_s"]]), float(meta[m["busy_s"]]))
        if not np.isnan(meta[PUSH_META["recent_mean"]]):
            self.recent[worker] = float(meta[PUSH_META["recent_mean"]])
        return bool(meta[PUSH_META["stop"]])

    def report_line(self, progress: Progress, policy: AsyncPolicy) -> None:
        """Judge the target (at each progress line: a server's judgement), then write the
        line with the staleness and the workers' exchange share."""
        self.judge()
        self.report(progress, policy.version, policy.staleness, self.comm_share())

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
                "recent_means": dict(self.recent), "solved": self.solved}

    def load_state(self, state: dict) -> None:
        self.env_steps, self.received = state["env_steps"], dict(state["received"])
        self.rows, self.window = state["rows"], list(state["window"])
        self.worker_time = {w: tuple(t) for w, t in state["worker_time"].items()}
        self.recent = dict(state["recent_means"])
        self.solved = state["solved"]
