"""seed and ga3c: actors hold no network; one observation per env step travels to an
inference rank, which batches the requests of many actors and answers with actions.

Wiring, seed (SEED RL): rank 0 is the learner *and* the inference server: it batches
requests, runs the model once per batch, answers, assembles unrolls from what the
requests carried (:class:`mpirl.parts.unroll.UnrollAssembler`) and trains on them
with V-trace.  Every other rank only steps envs ("many weak machines can join as
actors").

Wiring, ga3c (GA3C): the same substrate, two roles split over two ranks.  Rank 1, the
*predictor*, batches requests and assembles unrolls as seed's inference does, then
ships each unroll (one record, as impala's) to rank 0, the *trainer*, from its own
training queue, one in flight.  The trainer trains on ``--unroll-batch`` of them and
answers each with its latest parameters when they changed.  Predictor and trainer
therefore have their own queues and batch sizes, and training never stalls inference.

How they differ, measured on the same envs and budgets (docs/modes.md): seed's
inference waits while rank 0 trains (single-threaded: seed_rl overlaps the two with
threads on one accelerator); ga3c overlaps them on two ranks, at the price of
parameters that reach inference one trainer reply late (policy lag, corrected by
V-trace on both).

Batching (``--inference-policy``): ``fixed`` waits for ``--inference-batch``
observations (whole actors; seed_rl); ``drain`` takes one request, then whatever else
arrives within ``--inference-wait-s``, up to ``--inference-batch`` (GA3C's predictor).

What travels: a request (an index, the stop flag, ``E`` observations, the rewards and
episode ends of the previous step) and a reply (the version, ``E`` actions), each one
contiguous record; an actor has one request in flight, which is SEED's back-pressure.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path

import gymnasium
import numpy as np
import torch
from mpi4py import MPI

from topologies.channels import ChannelClient, ChannelServer, as_bytes

from ..config import Config
from ..parts.unroll import M, UnrollAssembler, UnrollLayout
from ..resilience.guard import Guard
from ..resilience.schedule import PARAMS, STEP, Schedule
from ..telemetry.progress import Progress
from ..telemetry.runlog import RunLogger
from ..telemetry.timing import PhaseTimer, add_phases
from .actorlearner import (TAG_ACTIONS, TAG_KEEP, TAG_PARAMS, TAG_STOP, AccountingError,
                           UnrollQueue, VtraceTrainer, lag_stats, meta_nbytes, params_reply,
                           report, settle)
from .common import (Episodes, Summary, build_replica, check_same_model, final_mean_return,
                     reached_target)

REQUEST_META = ("index", "stop")


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

    def act(self, obs: torch.Tensor):
        req = self.request[0]
        req["obs"] = obs.numpy()
        req["meta"][0], req["meta"][1] = self.sent + 1, float(self.stop)
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
        self.version = int(self.reply[0]["meta"][0])
        actions = torch.from_numpy(self.reply[0]["actions"].copy())
        zeros = torch.zeros(len(obs))
        return actions, zeros, zeros

    def observe(self, reward: np.ndarray, done: np.ndarray) -> None:
        self.request[0]["reward"], self.request[0]["done"] = reward, done

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(obs))       # no network here: a time limit ends an episode


def run_seed(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    return _run(cfg, comm, run_dir, servers=1)


def run_ga3c(cfg: Config, comm: MPI.Comm, run_dir: Path) -> Summary:
    return _run(cfg, comm, run_dir, servers=2)


def _run(cfg: Config, comm: MPI.Comm, run_dir: Path, servers: int) -> Summary:
    rank, size = comm.Get_rank(), comm.Get_size()
    learner, actor = build_replica(cfg, rank, with_actor=rank >= servers)
    check_same_model(comm, learner)
    layout = UnrollLayout(cfg.rollout_steps, cfg.num_envs, learner.obs_space, learner.act_space)
    actors = list(range(servers, size))
    summary = Summary(mode=cfg.mode, topology=cfg.topology, ranks=size,
                      gradient_bytes=learner.grad.nbytes)
    reporter = servers - 1                 # who sees every env step: inference's rank
    if rank >= servers:
        part = SeedActor(cfg, comm, actor, learner, server=reporter, run_dir=run_dir)
    elif rank == reporter:
        part = InferenceRank(cfg, comm, learner, layout, actors, run_dir,
                             trains=servers == 1)
    else:
        part = Trainer(cfg, comm, learner, layout, predictor=1, run_dir=run_dir)
    part.run()
    totals = part.totals()
    lags = part.queue.lags if rank == 0 else []
    if rank == reporter:
        part.fill(summary)
    for name in ("env_steps", "wall_s", "reached_target", "mean_inference_batch", "phase_s"):
        setattr(summary, name, comm.bcast(getattr(summary, name), root=reporter))
    if rank == 0:
        summary.updates = part.trainer.version
        summary.param_digest = learner.param_digest()
        summary.mean_policy_lag, summary.p95_policy_lag = lag_stats(lags)
        np.save(run_dir / "policy_lag.npy", np.asarray(lags, dtype=np.int64))
    summary.final_mean_return = final_mean_return(
        comm, part.episodes if rank >= servers else None)
    settle(summary, comm, **totals)
    part.log.close(summary.totals())
    return summary


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
            self.log.begin()
            try:
                while True:
                    guard.at(f"stepping rollout {rows + 1}")
                    policy.stop = guard.stop_requested
                    stats = self.client.stats
                    sent, received, waited = stats.bytes_sent, stats.bytes_recv, stats.wait_s
                    self.actor.collect(policy, cfg.rollout_steps, timer)
                    rows += 1
                    self._episodes(rows)
                    rtt, policy.rtt_s = policy.rtt_s, 0.0
                    add_phases(self.phases, self.log.record(
                        rows, timer, bytes_sent=stats.bytes_sent - sent,
                        bytes_recv=stats.bytes_recv - received, wait_s=stats.wait_s - waited,
                        env_steps=cfg.steps_per_batch, param_version=policy.version,
                        rtt_s=rtt / cfg.rollout_steps))
                    guard.beat(rows, "between rollouts")
            except Stopped:
                self._episodes(rows + 1)
        add_phases(self.phases, timer.take())

    def _episodes(self, row: int) -> None:
        finished = self.actor.drain_episodes()
        self.episodes.add(finished)
        self.log.episodes(row, finished)
        self.log.sim_times(row, self.actor.drain_sim_times())

    def totals(self) -> dict:
        p = self.policy
        return {"unrolls": (0, 0, 0), "requests": (p.sent, 0, 0, p.answered),
                "bytes_sent": self.client.stats.bytes_sent,
                "env_s": self.phases.get("env_s", 0.0), "wall_s": sum(self.phases.values()),
                "is_actor": True}


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


class InferenceRank:
    """Batch requests, act, answer, assemble unrolls; seed: also train on them (rank 0),
    ga3c: ship them to the trainer (the predictor, rank 1)."""

    def __init__(self, cfg: Config, comm: MPI.Comm, learner, layout: UnrollLayout,
                 actors: list[int], run_dir: Path, trains: bool) -> None:
        self.cfg, self.comm, self.learner, self.layout = cfg, comm, learner, layout
        self.actors, self.trains = actors, trains
        self.request_dtype = request_record(cfg.num_envs, learner.obs_space).dtype
        self.server = ChannelServer(comm, actors, self.request_dtype.itemsize)
        self.replies = {a: action_record(cfg.num_envs, learner.act_space) for a in actors}
        self.batcher = Batcher(cfg, len(actors))
        self.assembler = UnrollAssembler(layout, actors, cfg.num_envs * cfg.action_repeat)
        # seed: the learner's trainer and queue; ga3c: the outbox and the link to the trainer
        self.trainer = VtraceTrainer(cfg, learner) if trains else None
        self.queue = UnrollQueue(cfg.max_policy_lag) if trains else None
        self.batch = cfg.unroll_batch or len(actors)
        self.outbox: deque[np.ndarray] = deque()
        self.to_trainer = None if trains else ChannelClient(comm, 0)
        self._in_flight = None            # ga3c: the unroll being sent, kept alive until
                                          # the trainer's reply (its Isend reads it)
        self.params_in = params_reply(learner.params.size)
        self.version = 0                  # of the parameters inference acts with
        self.made = self.dropped = 0
        self.answered = self.stopped = self.rows = self.batches = 0
        self.inference_rows = self.rows_since = self.batches_since = 0
        self.env_steps, self.window = 0, [0.0, 0.0]
        self.bytes_logged = 0
        self.next_report = cfg.log_every
        self.recent = {a: Episodes() for a in actors}
        self.stopping = self.solved = False
        self.phases: dict[str, float] = {}
        self.progress = Progress(run_dir, enabled=True)
        self.log = RunLogger(cfg, comm, run_dir, role="learner" if trains else "predictor")
        # which requests made each forward pass (and, ga3c, when the trainer's parameters
        # were taken): recorded, or enforced (--replay-schedule)
        self.schedule = Schedule(run_dir, comm.Get_rank(), cfg.replay_schedule)

    def run(self) -> None:
        timer = PhaseTimer()
        with Guard(self.cfg, self.comm, self.comm.Get_rank()) as guard:
            self.log.begin()
            while not self.stopping:
                guard.at("serving inference")
                signalled = self._serve(timer) or guard.stop_requested
                if self.trains:
                    self._train(timer)
                else:
                    self._ship(timer, block=len(self.outbox) > 2 * self.batch)
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
                first = int(req["meta"][0]) == 1
                signalled |= bool(req["meta"][1])
                done = self.assembler.step(client, req["obs"], req["reward"], req["done"],
                                           first, actions[rows], logp[rows], self.version)
                if done is not None:
                    self._made(done)
                reply = self.replies[client]
                reply[0]["meta"][0], reply[0]["actions"] = self.version, actions[rows]
                self.server.reply(client, reply, tag=TAG_ACTIONS)
        self.answered += len(clients)
        # every action answered is stepped by its actor (the last ones' rewards never
        # come back: the next request is answered with STOP), so count steps here
        self.env_steps += len(clients) * self.assembler.env_steps_per_step
        self.batches_since += 1
        self.rows_since += len(clients) * n
        for client in clients:
            finished = self.assembler.drain_episodes(client)
            self.recent[client].add(finished)
            self.window[0] += len(finished)
            self.window[1] += sum(r for r, _ in finished)
        return signalled

    def _made(self, record: np.ndarray) -> None:
        self.made += 1
        if self.trains:
            self.queue.add(record, self.trainer.version)
        else:
            self.outbox.append(record)

    def _train(self, timer) -> None:
        """seed: an update once ``--unroll-batch`` unrolls are queued."""
        queued = len(self.queue)
        records = self.queue.take(self.batch, self.trainer.version)
        if not records:
            return
        losses = self.trainer.train(records, timer)
        self.version = self.trainer.version
        lags = self.queue.lags[-len(records):]
        self._row(timer, param_version=self.version, policy_lag=float(np.mean(lags)),
                  policy_lag_max=max(lags), queue_len=queued, **losses)

    def _ship(self, timer, block: bool) -> None:
        """ga3c: take the trainer's reply to the unroll in flight (waiting only when
        the outbox is over-full), then send the next one."""
        link = self.to_trainer
        if link.in_flight:
            if self.schedule.replaying:           # take the reply where the recording did
                event = self.schedule.upcoming()
                block = event is not None and event[0] == PARAMS
            with timer("publish_s"):
                got = (link.wait_reply(self.params_in, timeout_s=self.cfg.wait_timeout_s)
                       if block else None if self.schedule.replaying
                       else link.poll_reply(self.params_in))
            if got is None:
                return
            self._take_params(got[0])
            self.schedule.take(PARAMS, self.version)
        if self.outbox:
            record = self.outbox.popleft()
            with timer("send_s"):
                self._in_flight = record            # kept untouched until the reply
                link.send(record)
            self._row(timer, param_version=self.version)

    def _take_params(self, tag: int) -> None:
        if tag == TAG_PARAMS:
            self.learner.params[:] = self.params_in[0]["params"]
            self.version = int(self.params_in[0]["meta"][0])
        elif tag != TAG_KEEP:
            raise AccountingError(f"predictor: unexpected reply tag {tag} from the trainer")

    def _row(self, timer, **fields) -> None:
        self.rows += 1
        batch = self.rows_since / self.batches_since if self.batches_since else np.nan
        self.inference_rows += self.rows_since
        self.batches += self.batches_since
        self.rows_since = self.batches_since = 0
        sent = self.server.stats.bytes_sent + (self.to_trainer.stats.bytes_sent
                                               if self.to_trainer else 0)
        sent, self.bytes_logged = sent - self.bytes_logged, sent
        add_phases(self.phases, self.log.record(
            self.rows, timer, batch_size=batch, bytes_sent=sent, **fields))

    def _check_end(self, signalled: bool) -> None:
        cfg = self.cfg
        if self.version >= self.next_report:
            self._report()
            self.next_report = self.version + cfg.log_every
        if cfg.target_return and not self.solved:     # (every batch: only when asked)
            means = [e.recent_mean() for e in self.recent.values()]
            self.solved = reached_target(cfg.target_return,
                                         [m for m in means if m is not None], len(self.actors))
        self.stopping = self.env_steps >= cfg.total_steps or self.solved or signalled

    def _report(self) -> None:
        self.window = report(self.progress, self.version, self.env_steps, self.window,
                             self.queue.lags if self.trains else [])

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
        if self.trains:
            self.queue.drop_rest()
            return
        link = self.to_trainer
        if link.in_flight:
            self._take_params(link.wait_reply(self.params_in,
                                              timeout_s=self.cfg.wait_timeout_s)[0])
        self.dropped += len(self.outbox)
        self.outbox.clear()
        end = self.layout.empty()
        end[0]["meta"][M["stop"]] = 1.0              # not an unroll: the end of the stream
        link.send(end)
        tag, _ = link.wait_reply(self.params_in, timeout_s=self.cfg.wait_timeout_s)
        if tag != TAG_STOP:
            raise AccountingError(f"predictor: the trainer answered the end with tag {tag}")

    def fill(self, summary: Summary) -> None:
        summary.env_steps = self.env_steps
        summary.wall_s = self.progress.elapsed()
        summary.reached_target = self.solved
        summary.phase_s = dict(self.phases)
        batches = self.batches + self.batches_since
        rows = self.inference_rows + self.rows_since
        summary.mean_inference_batch = rows / batches if batches else np.nan

    def totals(self) -> dict:
        used, dropped = (self.queue.used, self.queue.dropped) if self.trains else (0, self.dropped)
        bytes_sent = self.server.stats.bytes_sent + (
            self.to_trainer.stats.bytes_sent if self.to_trainer else 0)
        return {"unrolls": (self.made, used, dropped),
                "requests": (0, self.answered, self.stopped, 0),
                "bytes_sent": bytes_sent, "env_s": 0.0, "wall_s": 0.0, "is_actor": False}


class Trainer:
    """ga3c's trainer (rank 0): takes the predictor's unrolls, answers each with the
    latest parameters (when they changed), trains on every ``--unroll-batch``."""

    def __init__(self, cfg: Config, comm: MPI.Comm, learner, layout: UnrollLayout,
                 predictor: int, run_dir: Path) -> None:
        self.cfg, self.comm, self.learner, self.layout = cfg, comm, learner, layout
        self.predictor = predictor
        self.server = ChannelServer(comm, [predictor], layout.nbytes)
        self.reply = params_reply(learner.params.size)
        self.trainer = VtraceTrainer(cfg, learner)
        self.queue = UnrollQueue(cfg.max_policy_lag)
        self.batch = cfg.unroll_batch or comm.Get_size() - 2
        self.published = 0                 # version the predictor last got
        self.logged = (0, 0)               # bytes sent and received up to the last row
        self.phases: dict[str, float] = {}
        self.log = RunLogger(cfg, comm, run_dir, role="learner")

    def run(self) -> None:
        timer, server, cfg = PhaseTimer(), self.server, self.cfg
        with Guard(cfg, self.comm, self.comm.Get_rank()) as guard:
            self.log.begin()
            while True:
                guard.at(f"waiting for unrolls for update {self.trainer.version + 1}")
                with timer("data_wait_s"):
                    server.wait_any(timeout_s=cfg.wait_timeout_s)
                record = self.layout.view(server.buffers[self.predictor]).copy()
                if record[0]["meta"][M["stop"]]:
                    server.reply(self.predictor, as_bytes(self.reply)[:meta_nbytes()],
                                 tag=TAG_STOP, last=True)
                    break
                self.queue.add(record, self.trainer.version)
                queued = len(self.queue)
                records = self.queue.take(self.batch, self.trainer.version)
                if records:
                    losses = self.trainer.train(records, timer)
                    lags = self.queue.lags[-len(records):]
                    stats, (sent, received) = server.stats, self.logged
                    add_phases(self.phases, self.log.record(
                        self.trainer.version, timer, param_version=self.trainer.version,
                        bytes_sent=stats.bytes_sent - sent,
                        bytes_recv=stats.bytes_recv - received,
                        policy_lag=float(np.mean(lags)), policy_lag_max=max(lags),
                        queue_len=queued, **losses))
                    self.logged = (stats.bytes_sent, stats.bytes_recv)
                    guard.beat(self.trainer.version, "between updates")
                self._publish(timer)        # after the step: the freshest parameters
        self.queue.drop_rest()
        server.close(timeout_s=cfg.wait_timeout_s)
        add_phases(self.phases, timer.take())

    def _publish(self, timer) -> None:
        version = self.trainer.version
        with timer("publish_s"):
            self.reply[0]["meta"][0] = version
            if version != self.published:
                self.reply[0]["params"] = self.learner.params
                self.published = version
                self.server.reply(self.predictor, self.reply, tag=TAG_PARAMS)
            else:
                self.server.reply(self.predictor, as_bytes(self.reply)[:meta_nbytes()],
                                  tag=TAG_KEEP)

    def totals(self) -> dict:
        q = self.queue
        return {"unrolls": (0, q.used, q.dropped), "requests": (0, 0, 0, 0),
                "bytes_sent": self.server.stats.bytes_sent, "env_s": 0.0, "wall_s": 0.0,
                "is_actor": False}
