"""The sharded parameter server's run: ranks ``0..S-1`` (``--servers S``) hold shards of
the flat parameter vector, ranks after them replay ranks (gorila's service) and then
workers; each worker pushes each gradient shard to its server and pulls each parameter
shard back, every shard on its own (:class:`topologies.shardedps.ShardedParameterServer`).
gorila and ``async --servers S`` run it with their own workers; the protocol, its stop
and its accounting are described in :mod:`mpirl.designs.gorila`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from mpi4py import MPI

from topologies.shardedps import ShardedParameterServer

from ..config import Config
from ..parts.records import Fields
from ..parts.server import AsyncPolicy, ShardOptimizer
from ..parts.transitions import TransitionLayout
from ..resilience.guard import Guard
from ..resilience.schedule import Schedule
from ..telemetry.progress import Progress
from ..telemetry.runlog import RunLogger
from ..telemetry.timing import PhaseTimer, add_phases
from . import ledger
from .common import Summary, close_run, start_replica
from .pushpull import PUSH_META, ServerBook
from .replayservice import ReplayRank

#: a worker's push meta: the parameter server's, plus "this push only leaves the shard"
GORILA_META = Fields(*PUSH_META, "leave")
LEFT = -2            # a shard's schedule: the version of a leaving push


def run_sharded(cfg: Config, comm: MPI.Comm, run_dir: Path, *, make_worker, build=None,
                transitions: bool = False) -> Summary:
    """A run over ``--servers`` shards: ``build(cfg, rank, with_actor=)`` makes a rank's
    learner and actor (an actor-critic replica unless given), ``make_worker(cfg, comms,
    sps, learner, actor, layout, run_dir)`` a worker; ``transitions``: workers store
    transitions (a :class:`TransitionLayout` for them, the replay memories' accounting
    at the end)."""
    rank, size, servers = comm.Get_rank(), comm.Get_size(), cfg.servers
    replays = cfg.design.serving(cfg).count("replay")
    first_worker = servers + replays
    learner, actor = start_replica(cfg, comm, with_actor=rank >= first_worker, build=build)
    comms = ShardComms(comm, servers, replays)
    layout = TransitionLayout(learner.obs_space.shape, cfg.num_envs * cfg.rollout_steps,
                              cfg.replay_batch, learner.action_shape) if transitions else None
    part, sps = _make_part(cfg, comms, learner, actor, layout, make_worker, run_dir)
    part.run()
    summary = Summary.of(cfg, size, learner)
    _rank0_figures(summary, comm, sps, part, learner, first_worker)
    close_run(summary, comm, part, ledger.GRADIENTS + (ledger.TRANSITIONS if transitions else ()),
              extra=("updates_skipped", "transitions_sampled"))
    comms.free(sps)
    return summary


class ShardComms:
    """The wiring: ``servers`` server ranks, then ``replays`` replay ranks (gorila
    --gorila-replay service), then workers.  With replay ranks, the servers and workers
    exchange shards on a communicator without them, and samples travel on a duplicate."""

    def __init__(self, comm: MPI.Comm, servers: int, replays: int) -> None:
        self.world, self.servers, self.replays = comm, servers, replays
        rank = comm.Get_rank()
        self.first_worker = servers + replays
        self.workers = list(range(self.first_worker, comm.Get_size()))
        self.is_replay = servers <= rank < self.first_worker
        if replays:
            self.samples = comm.Dup()
            self.ps = comm.Split(MPI.UNDEFINED if self.is_replay else 0, rank)
        else:
            self.samples, self.ps = None, comm

    def replay_of(self, worker: int) -> int:
        """The replay rank a worker (world rank) inserts into and samples from."""
        return self.servers + (worker - self.first_worker) % self.replays

    def free(self, sps: ShardedParameterServer | None) -> None:
        """These communicators and ``sps``'s (None on a replay rank)."""
        if sps is not None:
            sps.free()
        if self.replays:
            self.samples.Free()
            if self.ps != MPI.COMM_NULL:
                self.ps.Free()


def _make_part(cfg: Config, comms: ShardComms, learner, actor, layout, make_worker,
               run_dir: Path):
    """This rank's part (a replay rank, a shard server or a worker) and the sharded
    exchange (None on a replay rank)."""
    world, rank = comms.world, comms.world.Get_rank()
    if comms.is_replay:
        mine = [w for w in comms.workers if comms.replay_of(w) == rank]
        return ReplayRank(cfg, world, layout, mine, mine, run_dir,
                          samples_comm=comms.samples), None
    leave = np.zeros(len(GORILA_META))
    leave[GORILA_META["leave"]] = 1.0
    sps = ShardedParameterServer(comms.ps, cfg.servers, learner.params.size,
                                 meta_len=len(GORILA_META), leave_meta=leave)
    if sps.is_server:
        return ShardServer(cfg, world, sps, learner, run_dir), sps
    return make_worker(cfg, comms, sps, learner, actor, layout, run_dir), sps


def _rank0_figures(summary: Summary, comm: MPI.Comm, sps: ShardedParameterServer | None,
                   part, learner, first_worker: int) -> None:
    """Rank 0's figures: shard 0's books, the digest of every shard."""
    summary.phase_s = comm.bcast(part.phases if comm.Get_rank() == first_worker else None,
                                 root=first_worker)
    is_server = sps is not None and sps.is_server
    shards = comm.gather(sps.slice(learner.params, sps.shard).copy() if is_server
                         else None, root=0)
    if comm.Get_rank() != 0:
        return
    part.fill(summary)
    summary.param_digest = hashlib.sha256(
        np.concatenate(shards[:sps.servers]).tobytes()).hexdigest()


class ShardServer:
    """One shard's server: apply every push to this shard on arrival and answer its
    worker; shard 0 also keeps the books and decides the end."""

    episodes = None      # it steps no envs

    def __init__(self, cfg: Config, comm: MPI.Comm, sps: ShardedParameterServer, learner,
                 run_dir: Path) -> None:
        self.cfg, self.comm, self.sps, self.ps = cfg, comm, sps, sps.server
        self.params = sps.slice(learner.params, sps.shard)        # a view: the shard
        self.opt = ShardOptimizer(self.params, cfg.lr)
        self.policy = AsyncPolicy()
        self.decides = sps.shard == 0
        # a replay design is judged on its greediest worker alone (the others explore)
        judges = 1 if cfg.design.learner == "replay" else len(self.ps.workers)
        self.book = ServerBook(cfg, self.ps.workers, sps.size, judges)
        self.active = set(self.ps.workers)
        self.received = {w: 0 for w in self.ps.workers}
        self.leaves = 0
        self.stopping = False
        self.phases: dict[str, float] = {}
        self.run_dir = run_dir
        self.progress = Progress(run_dir, enabled=self.decides)
        self.log = RunLogger(cfg, comm, run_dir, role="server")
        # the order of the pushes this shard took: recorded, or enforced (--replay-schedule)
        self.schedule = Schedule(run_dir, sps.rank, cfg.replay_schedule)

    def run(self) -> None:
        ps, policy, cfg = self.ps, self.policy, self.cfg
        ps.open(self.params.size, self.params.dtype)
        for worker in ps.workers:
            ps.reply(worker, self.params)
            policy.sent(worker)
        timer = PhaseTimer()
        with Guard(cfg, self.comm, self.sps.rank) as guard:
            self.log.watch(ps)
            self.log.begin()
            while self.active:
                version = policy.version
                scheduled = self.schedule.next()       # a replay: this worker's push next
                with timer("exchange_s"):
                    worker, buf, meta = ps.wait_push(
                        timeout_s=cfg.wait_timeout_s,
                        only=None if scheduled is None else (scheduled,))
                if meta[GORILA_META["leave"]]:
                    self.schedule.take(worker, LEFT)
                    self.leaves += 1
                    self._stop(worker)
                    self.log.unlogged()         # a leaving push is no update of this shard
                    continue
                computed_on, applied = policy.sent_version[worker], policy.applied
                self.schedule.take(worker, computed_on)
                with timer("optimizer_s"):
                    self._handle(worker, buf, meta, guard.stop_requested)
                add_phases(self.phases, self.log.record(
                    policy.version, timer, env_steps=int(meta[PUSH_META["env_steps"]]),
                    param_version=computed_on,
                    staleness=version - computed_on, dropped=int(policy.applied == applied)))
                guard.beat(policy.version, "waiting for pushes")
        ps.close(timeout_s=cfg.wait_timeout_s)
        self.schedule.save()
        if self.decides:
            self._report()
        self.progress.close()

    def _handle(self, worker: int, buf: np.ndarray, meta: np.ndarray, signalled: bool) -> None:
        if self.decides:
            asks_stop = self.book.account(worker, meta)
        else:
            ledger.count_in_order(self.received, worker, meta[PUSH_META["pushes"]], "worker",
                                  "push", f"shard {self.sps.shard}")
        if self.stopping:
            self.policy.drop()
            self._stop(worker)
            return
        self.policy.push(worker, buf)
        self.opt.step(buf)
        self.policy.stepped()
        if self.decides:
            if self.policy.version % self.cfg.log_every == 0:
                self._report()
            self.stopping = self.book.ends(asks_stop or signalled)
        if self.stopping:
            self._stop(worker)
        else:
            self.ps.reply(worker, self.params)
            self.policy.sent(worker)

    def _stop(self, worker: int) -> None:
        self.ps.stop(worker)
        self.active.discard(worker)

    def _report(self) -> None:
        self.book.report_line(self.progress, self.policy)

    def counts(self) -> dict:
        """Shard 0 keeps the gradients' books (every shard applies each push)."""
        if not self.decides:
            return {}
        return {"gradients_applied": self.policy.applied, "gradients_dropped": self.policy.dropped}

    def fill(self, summary: Summary) -> None:
        self.book.fill(summary, self.policy, self.progress)
        np.save(self.run_dir / "staleness.npy",
                np.asarray(self.policy.staleness, dtype=np.int64))
