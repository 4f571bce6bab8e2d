"""Prioritized replay as an MPI service: the replay rank and its two kinds of client.

Used by apex (actors insert, the learner samples) and by ``gorila --gorila-replay
service`` (each actor-learner both inserts and samples).  What travels
(:mod:`mpirl.parts.transitions`, each message one contiguous record over the
request/reply channels of :mod:`topologies.channels`):

* :class:`BlockSender` (an actor) -> replay: a block of n-step transitions with their
  initial priorities; the replay acknowledges it with its size, so an actor has one
  block in flight.  A last, empty block says the actor is gone (answered STOP).
* :class:`SampleClient` (a sampler) <-> replay: a sample request carrying the
  priorities of the sampler's previous batch from this replay, answered with the next
  batch (slots, stamps, importance-sampling weights).  One request in flight; a last
  request (answered STOP) ends the sampler.

:class:`ReplayRank` holds a sampler's request until it may answer: once it stores its
warm-up (``--learning-starts / R`` transitions, and a batch), and, with
``--train-intensity k``, only while it has sampled at most ``k`` times what it
inserted.  It answers at once (with what it has, or an empty batch) once every actor
has left, and a sampler that is itself an actor once that actor has left.

Every replay rank records the order in which it took blocks, took requests and
answered them (:mod:`mpirl.resilience.schedule`); ``--replay-schedule`` (apex) makes
it follow a recorded order instead.

A channel's client tells replies apart by their source alone, so a rank that both
inserts into and samples from one replay rank (gorila's workers) keeps its sample
channel on a communicator of its own (``samples_comm``, a duplicate).
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from topologies.channels import PAUSE_S, ChannelClient, ChannelServer
from topologies.paramserver import DeadlineExceeded

from ..config import Config
from ..config.replay import rank_warm_up
from ..parts.replay import PrioritizedReplay
from ..parts.transitions import BLOCK_META, SAMPLE_META, TransitionLayout, fill
from ..resilience.guard import Guard
from ..resilience.schedule import ANSWER, REQUEST, Schedule, ScheduleDiverged
from ..telemetry.runlog import RunLogger
from ..telemetry.timing import PhaseTimer, add_phases
from ..errors import AccountingError
from . import ledger
from .actorlearner import TAG_KEEP, TAG_STOP

TAG_SAMPLE = 66      # sampler -> replay requests (actors' blocks use the channel default)

def replay_warmup(cfg: Config) -> int:
    """Transitions a replay rank stores before it answers a sample request."""
    return rank_warm_up(cfg, cfg.replay_ranks)


class BlockSender:
    """An actor's side of its replay rank: blocks of transitions out, one in flight."""

    def __init__(self, comm: MPI.Comm, replay: int, layout: TransitionLayout,
                 timeout_s: float) -> None:
        self.client, self.layout, self.timeout_s = ChannelClient(comm, replay), layout, timeout_s
        self.replay = replay
        self.blocks = [layout.empty("block"), layout.empty("block")]  # filling, in flight
        self.ack = np.zeros(1, dtype=np.float64)
        self.sent = self.transitions = 0
        self.size = 0                      # the replay's size at its last acknowledgement

    @property
    def stats(self):
        return self.client.stats

    def ship(self, trans: dict, prios: np.ndarray, version: int, timer) -> int:
        """Fill the next block with ``trans`` and send it, after the replay acknowledged
        the previous one; returns how many transitions it holds."""
        block = self.blocks[self.sent % 2]
        count = fill(block[0]["trans"], trans, prios, version)
        self._wait_ack(timer)
        self._send(block, count, version, last=False)
        return count

    def leave(self, timer) -> None:
        """The last (empty) block: the replay forgets this actor and answers STOP."""
        self._wait_ack(timer)
        self._send(self.blocks[self.sent % 2], 0, -1, last=True)
        if self._wait_ack(timer) != TAG_STOP:
            raise AccountingError(f"replay rank {self.replay} did not answer the last block "
                                  "with STOP")

    def _send(self, block: np.ndarray, count: int, version: int, last: bool) -> None:
        meta = block[0]["meta"]
        meta[:] = 0.0
        meta[BLOCK_META["index"]], meta[BLOCK_META["count"]] = self.sent + 1, count
        meta[BLOCK_META["last"]], meta[BLOCK_META["version"]] = float(last), version
        self.client.send(block)
        if not last:                       # the empty last block is no block of data
            self.sent += 1
            self.transitions += count

    def _wait_ack(self, timer) -> int:
        if not self.client.in_flight:
            return TAG_KEEP
        with timer("send_s"):
            tag, _ = self.client.wait_reply(self.ack, timeout_s=self.timeout_s)
        self.size = int(self.ack[0])
        return tag


class SampleClient:
    """A sampler's side of one replay rank: one sample request in flight, carrying the
    priorities owed for the previous batch from it."""

    def __init__(self, comm: MPI.Comm, replay: int, layout: TransitionLayout,
                 timeout_s: float) -> None:
        self.client = ChannelClient(comm, replay, tag=TAG_SAMPLE)
        self.replay, self.timeout_s = replay, timeout_s
        self.request, self.batch = layout.empty("request"), layout.empty("reply")
        self.owed: tuple = ((), (), ())
        self.prio_sent = 0

    @property
    def stats(self):
        return self.client.stats

    @property
    def in_flight(self) -> bool:
        return self.client.in_flight

    def owe(self, slots: np.ndarray, stamps: np.ndarray, prios: np.ndarray) -> None:
        """New priorities for the last batch: they travel with the next request."""
        self.owed = (slots, stamps, prios)

    def ask(self, beta: float, last: bool = False) -> None:
        """Send the request: the priorities owed, then "sample with ``beta``" (or stop)."""
        req = self.request[0]
        idx, stamps, prios = self.owed
        n = len(idx)
        req["idx"][:n], req["stamp"][:n], req["prio"][:n] = idx, stamps, prios
        req["meta"][:] = (float(last), n, beta)
        self.owed = ((), (), ())
        self.prio_sent += n
        self.client.send(self.request)

    def poll(self) -> bool:
        """Has the batch arrived (into :attr:`batch`)?"""
        return self.client.poll_reply(self.batch) is not None

    def wait(self) -> int:
        """Wait for the reply (a deadline's worth); returns its tag."""
        tag, _ = self.client.wait_reply(self.batch, timeout_s=self.timeout_s)
        return tag

    def end(self) -> None:
        """Take the reply in flight (not trained on: the run is over), then the last
        request and its STOP."""
        if self.in_flight:
            self.wait()
        self.owed = ((), (), ())
        self.ask(0.0, last=True)
        if self.wait() != TAG_STOP:
            raise AccountingError(f"replay rank {self.replay} did not answer the last "
                                  "request with STOP")


class ReplayRank:
    """A replay shard as an MPI service: blocks in from its actors, batches out to its
    samplers, priorities back; one row per batch served."""

    episodes = None      # it steps no envs

    def __init__(self, cfg: Config, comm: MPI.Comm, layout: TransitionLayout,
                 actors: list[int], samplers: list[int], run_dir, *,
                 samples_comm: MPI.Comm | None = None) -> None:
        self.cfg, self.comm, self.layout = cfg, comm, layout
        self.replay = PrioritizedReplay(cfg.replay_capacity // cfg.replay_ranks,
                                        layout.transition, alpha=cfg.replay_alpha,
                                        eps=cfg.replay_eps)
        self.warmup = replay_warmup(cfg)
        self.blocks = ChannelServer(comm, actors, layout.nbytes("block"))
        self.samples = ChannelServer(samples_comm or comm, samplers, layout.nbytes("request"),
                                     tag=TAG_SAMPLE)
        # one reply buffer per client: a reply stays untouched until that client's next
        self.acks = {a: np.zeros(1, dtype=np.float64) for a in actors}
        self.out = {s: layout.empty("reply") for s in samplers}
        self.stop = np.zeros(1, dtype=np.float64)
        self.rng = np.random.default_rng(cfg.seed + 10000 * comm.Get_rank())
        self.actors, self.left = set(actors), set()
        self.samplers = set(samplers)
        self.held: dict[int, float] = {}          # sampler -> the beta it asked with
        self.taken = {a: 0 for a in actors}
        self.served = self.invalid = 0
        self.row = np.zeros(3, dtype=np.int64)     # inserted, sampled, priorities since a row
        self.phases: dict[str, float] = {}
        self.log = RunLogger(cfg, comm, run_dir, role="replay")
        self.log.watch(self.blocks, self.samples, waits=())
        self.schedule = Schedule(run_dir, comm.Get_rank(), cfg.replay_schedule)

    def run(self) -> None:
        timer, cfg = PhaseTimer(), self.cfg
        serve = self._replayed if self.schedule.replaying else self._serve
        with Guard(cfg, self.comm, self.comm.Get_rank()) as guard:
            self.log.begin()
            quiet_since, pause = time.monotonic(), 0.0
            while self.actors or self.samplers:
                guard.at(f"serving batch {self.served + 1}")
                if serve(timer):
                    quiet_since, pause = time.monotonic(), 0.0
                    guard.beat(self.served, "serving")
                    continue
                if time.monotonic() - quiet_since > cfg.wait_timeout_s:
                    raise DeadlineExceeded(
                        f"replay rank {self.comm.Get_rank()}: no block from ranks "
                        f"{sorted(self.actors)} and no request from ranks "
                        f"{sorted(self.samplers)} within {cfg.wait_timeout_s:g} s")
                with timer("data_wait_s"):
                    time.sleep(pause)
                pause = min(PAUSE_S, pause * 2 or 1e-5)
            self._record(timer)
            self.blocks.close(timeout_s=cfg.wait_timeout_s)
            self.samples.close(timeout_s=cfg.wait_timeout_s)
        add_phases(self.phases, timer.take())
        self.schedule.save()

    def _serve(self, timer) -> bool:
        """Take what has arrived; answer every held request that may be answered now."""
        busy = False
        for actor in self.blocks.ready():
            with timer("replay_s"):
                self._insert(actor)
            busy = True
        for sampler in self.samples.ready():
            with timer("replay_s"):
                self._request(sampler)
            busy = True
        for sampler in sorted(self.held):
            if self._may_sample(sampler):
                with timer("replay_s"):
                    self._answer(sampler)
                self._record(timer)
                busy = True
        return busy

    def _replayed(self, timer) -> bool:
        """The recorded run's next event, waited for and done."""
        event, rank = self.schedule.upcoming(), self.comm.Get_rank()
        if event is None:
            raise ScheduleDiverged(f"replay rank {rank}: the replay needs an event past the "
                                   "recorded run's end")
        who, sampler = event
        if who == ANSWER:
            if sampler not in self.held:
                raise ScheduleDiverged(f"replay rank {rank}: the recorded run answered rank "
                                       f"{sampler} here; the replay holds no request of it")
            with timer("replay_s"):
                self._answer(sampler)
            self._record(timer)
            return True
        server, client = (self.samples, sampler) if who == REQUEST else (self.blocks, who)
        with timer("data_wait_s"):
            server.wait_any(timeout_s=self.cfg.wait_timeout_s, only=(client,))
        with timer("replay_s"):
            self._request(client) if who == REQUEST else self._insert(client)
        return True

    def _insert(self, actor: int) -> None:
        block = self.blocks.buffers[actor].view(self.layout.block)
        meta = block[0]["meta"]
        ledger.count_in_order(self.taken, actor, meta[BLOCK_META["index"]], "actor", "block",
                              "this replay")
        count = int(meta[BLOCK_META["count"]])
        self.schedule.take(actor, int(meta[BLOCK_META["version"]]))
        if count:
            trans = block[0]["trans"][:count]
            self.replay.add(trans, trans["prio"])
            self.row[0] += count
        last = bool(meta[BLOCK_META["last"]])
        ack = self.acks[actor]
        ack[0] = len(self.replay)
        self.blocks.reply(actor, ack, tag=TAG_STOP if last else TAG_KEEP, last=last)
        if last:
            self.actors.discard(actor)
            self.left.add(actor)

    def _request(self, sampler: int) -> None:
        """A sampler's request: its previous batch's priorities, then hold it (or, the
        last one, answer STOP)."""
        req = self.samples.buffers[sampler].view(self.layout.request)[0]
        self.schedule.take(REQUEST, sampler)
        updates = int(req["meta"][SAMPLE_META["updates"]])
        if updates:
            stale = self.replay.update_priorities(req["idx"][:updates], req["stamp"][:updates],
                                                  req["prio"][:updates])
            self.row[2] += updates - stale
        if req["meta"][SAMPLE_META["last"]]:
            self.samples.reply(sampler, self.stop, tag=TAG_STOP, last=True)
            self.samplers.discard(sampler)
        else:
            self.held[sampler] = float(req["meta"][SAMPLE_META["beta"]])

    def _may_sample(self, sampler: int) -> bool:
        replay, cfg = self.replay, self.cfg
        if not self.actors or sampler in self.left:   # nobody (or not it) inserts any more
            return True
        if len(replay) < self.warmup:
            return False
        return not cfg.train_intensity or \
            replay.sampled + cfg.replay_batch <= cfg.train_intensity * replay.inserted

    def _answer(self, sampler: int) -> None:
        out, replay, n = self.out[sampler][0], self.replay, self.cfg.replay_batch
        beta = self.held.pop(sampler)
        self.schedule.take(ANSWER, sampler)
        count = n if len(replay) >= n else 0
        if count:
            idx, stamps, weights = replay.sample(n, self.rng, beta, out=out["trans"])
            # every sampled slot holds a stored transition (never an empty slot)
            self.invalid += int(np.count_nonzero(replay.stamp[idx] < 0))
            out["idx"], out["stamp"], out["weight"] = idx, stamps, weights
            self.row[1] += n
        out["meta"][:] = (count, replay.inserted, len(replay), replay.evicted, replay.sampled)
        self.samples.reply(sampler, self.out[sampler], tag=TAG_KEEP)
        self.served += 1

    def _record(self, timer) -> None:
        add_phases(self.phases, self.log.record(
            self.served, timer, inserted=int(self.row[0]),
            sampled=int(self.row[1]), prio_updates=int(self.row[2]),
            replay_size=len(self.replay)))
        self.row[:] = 0

    def counts(self) -> dict:
        """Its ledger's counts (:data:`mpirl.kit.ledger.TRANSITIONS`)."""
        r = self.replay
        return {"transitions_inserted": r.inserted, "replay_stored": len(r),
                "replay_evicted": r.evicted, "transitions_sampled": r.sampled,
                "priority_updates": r.updated, "priority_stale": r.stale_updates,
                "invalid_samples": self.invalid}

