"""What seed and ga3c share: actors that hold no network, one observation per env step to
an inference server that batches the requests of many actors and answers with actions.

* the records that travel (:func:`request_record`, :func:`action_record`) and the
  actor's side (:class:`RemotePolicy`, :class:`SeedActor`);
* :class:`Batcher`: which arrived requests make the next forward pass (``fixed`` or
  ``drain``, ``--inference-policy``);
* :class:`InferenceServer`: batch, act, answer, assemble unrolls; seed's learner and
  ga3c's predictor are its two small subclasses (:mod:`mpirl.designs.seed`,
  :mod:`mpirl.designs.ga3c`);
* :func:`run_inference`: the wiring and the run's end, for both.

What travels: a request (an index, the stop flag, ``E`` observations, the rewards and
episode ends of the previous step) and a reply (the version, ``E`` actions), each one
contiguous record; an actor has one request in flight, which is SEED's back-pressure.
"""

from __future__ import annotations

import time
from pathlib import Path

import gymnasium
import numpy as np
import torch
from mpi4py import MPI

from topologies.channels import ChannelClient, ChannelServer, as_bytes

from ..config import Config
from ..parts.records import Fields
from ..parts.unroll import UnrollAssembler, UnrollLayout
from ..resilience.guard import Guard
from ..resilience.schedule import STEP, Schedule
from ..telemetry.progress import Progress
from ..telemetry.runlog import RunLogger
from ..telemetry.timing import PhaseTimer, add_phases
from .actorlearner import (REPLY_META, TAG_ACTIONS, TAG_STOP, AccountingError, actor_counts,
                           end_run)
from .book import Book
from .common import Episodes, Summary, start_replica

REQUEST_META = Fields("index", "stop", "wait_share")


def request_record(num_envs: int, obs_space: gymnasium.Space) -> np.ndarray:
    shape = tuple(int(d) for d in obs_space.shape)
    return np.zeros(1, dtype=np.dtype([("meta", "f8", (len(REQUEST_META),)),
                                       ("obs", "f4", (num_envs, *shape)),
                                       ("reward", "f4", (num_envs,)),
                                       ("done", "f4", (num_envs,))]))


def action_record(num_envs: int, act_space: gymnasium.Space) -> np.ndarray:
    if isinstance(act_space, gymnasium.spaces.Discrete):
        act = ("actions", "i8", (num_envs,))
    else:
        act = ("actions", "f4", (num_envs, *act_space.shape))
    return np.zeros(1, dtype=np.dtype([("meta", "f8", (1,)), act]))


class Stopped(Exception):
    """The inference rank answered a request with STOP."""


class RemotePolicy:
    """The actor's policy when inference runs elsewhere: every ``act`` is one request
    (this step's observations, last step's rewards and ends) and one reply."""

    phase = "infer_wait_s"

    def __init__(self, client: ChannelClient, num_envs: int, obs_space, act_space,
                 timeout_s: float) -> None:
        self.client, self.timeout_s = client, timeout_s
        self.request = request_record(num_envs, obs_space)
        self.reply = action_record(num_envs, act_space)
        self.sent = self.answered = 0
        self.version = -1
        self.stop = False                  # set by the actor's loop when signalled
        self.rtt_s = 0.0                   # summed since the last take
        self.wait_share = 0.0              # the actor's, over its last logged rollout

    def act(self, obs: torch.Tensor):
        req = self.request[0]
        req["obs"] = obs.numpy()
        req["meta"][REQUEST_META["index"]] = self.sent + 1
        req["meta"][REQUEST_META["stop"]] = float(self.stop)
        req["meta"][REQUEST_META["wait_share"]] = self.wait_share
        start = time.perf_counter()
        self.client.send(self.request)
        self.sent += 1
        tag, _ = self.client.wait_reply(self.reply, timeout_s=self.timeout_s)
        self.rtt_s += time.perf_counter() - start
        if tag == TAG_STOP:
            raise Stopped
        if tag != TAG_ACTIONS:
            raise AccountingError(f"actor: unexpected reply tag {tag}")
        self.answered += 1
        self.version = int(self.reply[0]["meta"][REPLY_META["version"]])
        actions = torch.from_numpy(self.reply[0]["actions"].copy())
        zeros = torch.zeros(len(obs))
        return actions, zeros, zeros

    def observe(self, reward: np.ndarray, done: np.ndarray) -> None:
        self.request[0]["reward"], self.request[0]["done"] = reward, done

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(obs))       # no network here: a time limit ends an episode


def run_inference(cfg: Config, comm: MPI.Comm, run_dir: Path, *, make_server,
                  make_trainer=None) -> Summary:
    """seed (``make_server`` on rank 0) or ga3c (``make_trainer`` on rank 0, the server on
    rank 1): the inference server is ``make_server(cfg, comm, learner, layout, actors,
    run_dir)``, the trainer ``make_trainer(cfg, comm, learner, layout, predictor=1,
    run_dir=run_dir)``; every other rank is a :class:`SeedActor`."""
    rank, size = comm.Get_rank(), comm.Get_size()
    servers = 1 if make_trainer is None else 2
    learner, actor = start_replica(cfg, comm, with_actor=rank >= servers)
    layout = UnrollLayout(cfg.rollout_steps, cfg.num_envs, learner.obs_space, learner.act_space)
    actors, reporter = list(range(servers, size)), servers - 1   # inference's rank reports
    if rank >= servers:
        part = SeedActor(cfg, comm, actor, learner, server=reporter, run_dir=run_dir)
    elif rank == reporter:
        part = make_server(cfg, comm, learner, layout, actors, run_dir)
    else:
        part = make_trainer(cfg, comm, learner, layout, predictor=1, run_dir=run_dir)
    part.run()
    summary = Summary.of(cfg, size, learner)
    if rank == reporter:                   # env steps, time, target, inference batches
        part.fill(summary)
    summary = comm.bcast(summary, root=reporter)
    if rank == 0:                          # the learner (seed) or the trainer (ga3c)
        summary.updates, summary.param_digest = part.trainer.version, learner.param_digest()
    return end_run(summary, comm, part, run_dir, lags=part.queue.lags if rank == 0 else ())


class SeedActor:
    """Step envs with actions that come back from the inference rank."""

    def __init__(self, cfg: Config, comm: MPI.Comm, actor, learner, server: int,
                 run_dir: Path) -> None:
        self.cfg, self.comm, self.actor = cfg, comm, actor
        self.client = ChannelClient(comm, server)
        self.policy = RemotePolicy(self.client, cfg.num_envs, learner.obs_space,
                                   learner.act_space, cfg.wait_timeout_s)
        self.episodes = Episodes()
        self.phases: dict[str, float] = {}
        self.log = RunLogger(cfg, comm, run_dir, role="actor")

    def run(self) -> None:
        cfg, policy, timer, rows = self.cfg, self.policy, PhaseTimer(), 0
        with Guard(cfg, self.comm, self.comm.Get_rank()) as guard:
            self.log.watch(self.client)
            self.log.begin()
            try:
                while True:
                    guard.at(f"stepping rollout {rows + 1}")
                    policy.stop = guard.stop_requested
                    self.actor.collect(policy, cfg.rollout_steps, timer)
                    rows += 1
                    self._episodes(rows)
                    rtt, policy.rtt_s = policy.rtt_s, 0.0
                    add_phases(self.phases, self.log.record(
                        rows, timer, env_steps=cfg.steps_per_batch, param_version=policy.version,
                        rtt_s=rtt / cfg.rollout_steps))
                    policy.wait_share = self.log.waiting_share()[1]
                    guard.beat(rows, "between rollouts")
            except Stopped:
                self._episodes(rows + 1)
        add_phases(self.phases, timer.take())

    def _episodes(self, row: int) -> None:
        finished = self.actor.drain_episodes()
        self.episodes.add(finished)
        self.log.episodes(row, finished)
        self.log.sim_times(row, self.actor.drain_sim_times())

    def counts(self) -> dict:
        return actor_counts(self.phases, requests_sent=self.policy.sent,
                            actions_received=self.policy.answered)


class Batcher:
    """Which arrived requests make the next forward pass (``fixed`` or ``drain``)."""

    def __init__(self, cfg: Config, actors: int) -> None:
        self.policy, self.num_envs = cfg.inference_mode(), cfg.num_envs
        everyone = actors * cfg.num_envs
        if self.policy == "fixed":
            rows = cfg.inference_batch or -(-everyone // 2)
            self.requests = -(-rows // cfg.num_envs)          # whole actors
        else:
            self.requests = -(-(cfg.inference_batch or everyone) // cfg.num_envs)
        self.wait_s = cfg.inference_wait_s

    def gather(self, server: ChannelServer, timeout_s: float) -> list[int]:
        clients = [server.wait_any(timeout_s=timeout_s)]
        if self.policy == "fixed":
            while len(clients) < self.requests:
                clients.append(server.wait_any(timeout_s=timeout_s))
            return clients
        deadline = time.perf_counter() + self.wait_s
        while len(clients) < self.requests:
            clients += server.ready()[:self.requests - len(clients)]
            if len(clients) >= self.requests or time.perf_counter() >= deadline:
                break
            time.sleep(min(1e-4, self.wait_s))
        return clients


class Passes:
    """Observations per forward pass: the mean since the last log row, and overall."""

    def __init__(self) -> None:
        self.rows = self.passes = 0               # logged so far
        self.rows_since = self.passes_since = 0   # since the last log row

    def add(self, rows: int) -> None:
        self.rows_since += rows
        self.passes_since += 1

    def take(self) -> float:
        """The mean since the last take (NaN if no pass happened)."""
        mean = self.rows_since / self.passes_since if self.passes_since else np.nan
        self.rows += self.rows_since
        self.passes += self.passes_since
        self.rows_since = self.passes_since = 0
        return mean

    def mean(self) -> float:
        passes = self.passes + self.passes_since
        return (self.rows + self.rows_since) / passes if passes else np.nan


class InferenceServer:
    """Batch requests, act, answer, assemble unrolls.  What becomes of an unroll is the
    subclass's: seed's learner trains on it (:meth:`made`, :meth:`after_pass`), ga3c's
    predictor ships it to the trainer."""

    role: str            # in its log: learner (seed) or predictor (ga3c)
    episodes = None      # it steps no envs

    def __init__(self, cfg: Config, comm: MPI.Comm, learner, layout: UnrollLayout,
                 actors: list[int], run_dir: Path) -> None:
        self.cfg, self.comm, self.learner, self.layout = cfg, comm, learner, layout
        self.actors = actors
        self.request_dtype = request_record(cfg.num_envs, learner.obs_space).dtype
        self.server = ChannelServer(comm, actors, self.request_dtype.itemsize)
        self.replies = {a: action_record(cfg.num_envs, learner.act_space) for a in actors}
        self.batcher = Batcher(cfg, len(actors))
        self.assembler = UnrollAssembler(layout, actors, cfg.num_envs * cfg.action_repeat)
        self.batch = cfg.unroll_batch or len(actors)
        self.version = 0                  # of the parameters inference acts with
        self.made = self.answered = self.stopped = self.rows = 0
        self.passes = Passes()
        self.next_report = cfg.log_every
        self.episodes_of = {a: Episodes() for a in actors}
        self.book = Book(cfg, judges=len(actors))
        self.stopping = False
        self.phases: dict[str, float] = {}
        self.progress = Progress(run_dir, enabled=True)
        self.log = RunLogger(cfg, comm, run_dir, role=self.role)
        # which requests made each forward pass (and, ga3c, when the trainer's parameters
        # were taken): recorded, or enforced (--replay-schedule)
        self.schedule = Schedule(run_dir, comm.Get_rank(), cfg.replay_schedule)

    def run(self) -> None:
        timer = PhaseTimer()
        with Guard(self.cfg, self.comm, self.comm.Get_rank()) as guard:
            self.log.watch(*self.channels(), waits=())
            self.log.begin()
            while not self.stopping:
                guard.at("serving inference")
                signalled = self._serve(timer) or guard.stop_requested
                self.after_pass(timer)
                self._check_end(signalled)
                guard.beat(self.version, "between batches")
            self._drain(timer)
        add_phases(self.phases, timer.take())
        self.progress.close()
        self.schedule.save()

    def _gather(self) -> list[int]:
        """The next forward pass's clients: as the batcher takes them, or (a replay)
        the recorded run's, waited for in its order."""
        if not self.schedule.replaying:
            clients = self.batcher.gather(self.server, self.cfg.wait_timeout_s)
        else:
            clients = self.schedule.group()
            for client in clients:
                self.server.wait_any(timeout_s=self.cfg.wait_timeout_s, only=(client,))
        for client in clients:
            self.schedule.take(client, self.version)
        self.schedule.take(STEP, self.version)
        return clients

    def _serve(self, timer) -> bool:
        """One forward pass over a batch of requests; True if an actor was signalled."""
        with timer("batch_wait_s"):
            clients = self._gather()
        requests = [self.server.buffers[c].view(self.request_dtype)[0] for c in clients]
        obs = torch.from_numpy(np.concatenate([r["obs"] for r in requests]))
        with timer("forward_s"), torch.no_grad():
            dist = self.learner.model.dist(obs)
            actions = dist.sample()
            logp = dist.log_prob(actions)
        actions, logp, n, signalled = actions.numpy(), logp.numpy(), self.cfg.num_envs, False
        with timer("reply_s"):
            for i, (client, req) in enumerate(zip(clients, requests, strict=True)):
                rows = slice(i * n, (i + 1) * n)
                first = int(req["meta"][REQUEST_META["index"]]) == 1
                signalled |= bool(req["meta"][REQUEST_META["stop"]])
                self.book.waits[client] = float(req["meta"][REQUEST_META["wait_share"]])
                done = self.assembler.step(client, req["obs"], req["reward"], req["done"],
                                           first, actions[rows], logp[rows], self.version)
                if done is not None:
                    self.made += 1
                    self.made_unroll(done)
                reply = self.replies[client]
                reply[0]["meta"][REPLY_META["version"]] = self.version
                reply[0]["actions"] = actions[rows]
                self.server.reply(client, reply, tag=TAG_ACTIONS)
        self.answered += len(clients)
        # every action answered is stepped by its actor (the last ones' rewards never
        # come back: the next request is answered with STOP), so count steps here
        self.book.env_steps += len(clients) * self.assembler.env_steps_per_step
        self.passes.add(len(clients) * n)
        for client in clients:
            finished = self.assembler.drain_episodes(client)
            self.episodes_of[client].add(finished)
            self.book.add(0, len(finished), sum(r for r, _ in finished))
        return signalled

    # -- what the subclass does with unrolls -----------------------------------------------
    def made_unroll(self, record: np.ndarray) -> None:
        """An unroll is complete."""
        raise NotImplementedError

    def after_pass(self, timer) -> None:
        """After each forward pass: train, or ship unrolls."""
        raise NotImplementedError

    def lags(self) -> list[int]:
        """Policy lags of the unrolls trained on here (for progress lines)."""
        return []

    def end_stream(self, timer) -> None:
        """After every actor got STOP: end what the unrolls went to."""

    def unroll_fate(self) -> tuple[int, int]:
        """Unrolls used and dropped here."""
        raise NotImplementedError

    def channels(self) -> tuple:
        """What this rank sends and receives through (counted in its log rows)."""
        return (self.server,)

    # -- shared ----------------------------------------------------------------------------
    def _row(self, timer, **fields) -> None:
        self.rows += 1
        add_phases(self.phases, self.log.record(
            self.rows, timer, batch_size=self.passes.take(), **fields))

    def _check_end(self, signalled: bool) -> None:
        cfg = self.cfg
        if self.version >= self.next_report:
            self._report()
            self.next_report = self.version + cfg.log_every
        book = self.book
        if book.target and not book.solved:     # (every batch: only when asked)
            means = {a: e.recent_mean() for a, e in self.episodes_of.items()}
            book.recent = {a: m for a, m in means.items() if m is not None}
            book.judge()
        self.stopping = book.ends(signalled)

    def _report(self) -> None:
        self.book.report(self.progress, self.version, self.lags(),
                         waiting=self.log.waiting_share())

    def _drain(self, timer) -> None:
        """Answer every actor's next request with STOP; ga3c: end the trainer's stream."""
        server = self.server
        while server.pending():
            with timer("batch_wait_s"):
                client = server.wait_any(timeout_s=self.cfg.wait_timeout_s,
                                         only=server.pending())
            server.reply(client, as_bytes(self.replies[client])[:8], tag=TAG_STOP, last=True)
            self.stopped += 1
        server.close(timeout_s=self.cfg.wait_timeout_s)
        self._report()
        self.end_stream(timer)

    def fill(self, summary: Summary) -> None:
        summary.env_steps = self.book.env_steps
        summary.wall_s = self.progress.elapsed()
        summary.reached_target = self.book.solved
        summary.phase_s = dict(self.phases)
        summary.mean_inference_batch = self.passes.mean()

    def counts(self) -> dict:
        used, dropped = self.unroll_fate()
        return {"unrolls_sent": self.made, "unrolls_used": used, "unrolls_dropped": dropped,
                "requests_answered": self.answered, "requests_dropped": self.stopped}
