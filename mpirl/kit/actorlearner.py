"""What the actor-learner designs (impala, seed, ga3c) share: the reply records, the
learner's unroll queue and V-trace step, the accounting and the run's end.

Wiring common to all three: a learner rank holds the only optimizer; experience
reaches it as unrolls (:mod:`mpirl.parts.unroll`) through request/reply channels
(:mod:`topologies.channels`); the parameters it publishes are versioned, and every
unroll carries the version that produced it, so the learner knows each unroll's
*policy lag* (its version now minus that one) and V-trace corrects for it.

Accounting, checked at the end of every run (:class:`AccountingError` otherwise):
unrolls sent = used + dropped; seed/ga3c requests sent = answered + dropped, and
actions received = requests answered.  Shutdown drains every channel: each client's
one outstanding message is taken and answered with STOP before the channels close,
so nothing is in flight at ``MPI_Finalize``.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
from mpi4py import MPI

from topologies.channels import ChannelClient, ChannelServer, as_bytes

from ..errors import AccountingError  # noqa: F401 (the designs raise it from here too)
from ..parts.records import Fields
from ..parts.unroll import UNROLL_META, batch_unrolls
from . import ledger
from .common import Summary, final_mean_return

TAG_PARAMS = 62      # reply: meta + parameters
TAG_KEEP = 63        # reply: meta only (keep the parameters you have)
TAG_STOP = 64        # reply: meta only; the client's last message
TAG_ACTIONS = 65     # seed/ga3c reply: meta + one action per env
#: the numbers at the head of every reply (float64)
REPLY_META = Fields("version")


def params_reply(n_params: int) -> np.ndarray:
    """A reply record: ``meta`` (:data:`REPLY_META`), then the flat parameters; sent
    whole (``TAG_PARAMS``) or as its meta prefix alone (``TAG_KEEP``, ``TAG_STOP``)."""
    return np.zeros(1, dtype=np.dtype([("meta", "f8", (len(REPLY_META),)),
                                       ("params", "f4", (n_params,))]))


def meta_nbytes() -> int:
    return 8 * len(REPLY_META)


def reply_progress(cfg, comm: MPI.Comm, feeders: range, learner: int = 0) -> str:
    """How the parameter replies of the push leave ``learner``: ``thread`` or ``calls``
    (``cfg.reply_progress``; ``auto`` decided here), or ``""`` where parameters are
    broadcast (no reply carries them).  Collective over ``comm`` under ``auto``.

    MPICH's ch4 polls the network only when a poll made no progress in shared memory, so
    a learner fed through shared memory (one of its ``feeders``, the ranks whose batches
    it trains on, on its node), whose few MPI calls per update keep finding that traffic,
    neither moves its replies over the link nor takes its remote actors' requests (at 4 x
    2 in blocks the push never ended): ``auto`` gives it the thread.  Fed over the network
    its calls find shared memory idle and reach the network, and the thread only took CPU
    from its compute (at 8 x 1, 19-27% fewer updates/s, with the same env steps/s and the
    same policy lag in seconds): ``auto`` leaves it out.  What ``auto`` decided, and why,
    ``learner`` says at start in one line."""
    if cfg.param_delivery != "push":
        return ""
    if cfg.reply_progress != "auto":
        return cfg.reply_progress
    if not feeders:             # impala: fed by its actors' unrolls; its server has no thread
        return "calls"
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        beside = node.allgather(comm.Get_rank())
    finally:
        node.Free()
    fed_beside = comm.bcast([rank for rank in beside if rank in feeders], root=learner)
    if comm.Get_rank() == learner:
        where = (f"on a progress thread (replay rank{'s' * (len(fed_beside) > 1)} "
                 f"{', '.join(map(str, fed_beside))} on its node)" if fed_beside
                 else "inside its own MPI calls (no replay rank on its node)")
        print(f"mpirl: --reply-progress auto: the learner's parameter replies move {where}",
              flush=True)
    return "thread" if fed_beside else "calls"


class ParamService:
    """A learner's answers to its actors' parameter requests: each actor has one request
    (a ``fields`` record whose ``index`` numbers it) in flight and one reply buffer, left
    untouched until that actor's next answer (a large reply travels when the actor
    receives it, long after it was sent)."""

    def __init__(self, comm: MPI.Comm, actors: list[int], fields: Fields,
                 n_params: int, pushes: bool = True, progress: bool = False) -> None:
        #: ``progress``: a thread moves the replies while the learner computes
        self.channel = ChannelServer(comm, actors, 8 * len(fields),
                                     progress=progress and pushes)
        self.fields = fields
        self.replies = {a: params_reply(n_params) for a in actors}
        self.taken = {a: 0 for a in actors}
        #: False (--param-delivery broadcast): only an actor's first answer carries them
        self.pushes = pushes
        self._first = set(actors)

    def request(self, actor: int) -> np.ndarray:
        """``actor``'s request record (float64), counted: it must be its next one."""
        meta = self.channel.buffers[actor].view(np.float64)
        ledger.count_in_order(self.taken, actor, meta[self.fields["index"]], "actor",
                              "request", "the learner")
        return meta

    def answer(self, actor: int, version: int, params: np.ndarray, *,
               stop: bool = False) -> None:
        """Send ``actor`` the parameters of ``version`` (where they do not travel by
        broadcast), or only the version, or STOP."""
        reply = self.replies[actor]
        reply[0]["meta"][REPLY_META["version"]] = version
        if not (self.pushes or actor in self._first):
            params = None
        self._first.discard(actor)
        if stop or params is None:
            self.channel.reply(actor, as_bytes(reply)[:meta_nbytes()],
                               tag=TAG_STOP if stop else TAG_KEEP, last=stop)
        else:
            reply[0]["params"] = params
            self.channel.reply(actor, reply, tag=TAG_PARAMS)


class UnrollQueue:
    """The learner's queue of unrolls (the replay part's FIFO role in IMPALA): unrolls
    older than ``max_lag`` updates when they arrive or when taken are dropped."""

    def __init__(self, max_lag: int = 0) -> None:
        self.max_lag = max_lag
        self.items: deque[np.ndarray] = deque()
        self.received = self.used = self.dropped = 0
        self.lags: list[int] = []          # of every unroll used, in order

    def __len__(self) -> int:
        return len(self.items)

    def _too_old(self, record: np.ndarray, version: int) -> bool:
        made_by = int(record[0]["meta"][UNROLL_META["version"]])
        return bool(self.max_lag) and version - made_by > self.max_lag

    def add(self, record: np.ndarray, version: int) -> None:
        self.received += 1
        if self._too_old(record, version):
            self.dropped += 1
        else:
            self.items.append(record)

    def take(self, count: int, version: int) -> list[np.ndarray]:
        """``count`` unrolls, oldest first, once that many not older than the bound are
        queued (the older ones are dropped first); else none."""
        if self.max_lag:            # without a bound nothing ages out: no pass over them
            kept = [r for r in self.items if not self._too_old(r, version)]
            self.dropped += len(self.items) - len(kept)
            self.items = deque(kept)
        if len(self.items) < count:
            return []
        out = [self.items.popleft() for _ in range(count)]
        self.used += len(out)
        self.lags.extend(version - int(r[0]["meta"][UNROLL_META["version"]]) for r in out)
        return out

    def drop_rest(self) -> None:
        self.dropped += len(self.items)
        self.items.clear()


class VtraceTrainer:
    """One learner update from a batch of unrolls: V-trace gradient, the average over
    learner ranks (``exchange``: a topology on the learners' communicator, or None),
    the optimizer step, then (``--obs-norm``) the batch's observation statistics merged
    over the learners: the learner owns them, and they travel with its parameters
    (``learner.wire``).  ``version`` counts updates (the parameter version)."""

    def __init__(self, cfg, learner, exchange=None) -> None:
        self.cfg, self.learner, self.exchange = cfg, learner, exchange
        self.version = 0

    def train(self, records: list[np.ndarray], timer) -> dict:
        learner = self.learner
        with timer("backward_s"):
            unrolls = batch_unrolls(records, self.cfg.gamma)
        losses = learner.vtrace_gradient(unrolls, timer)
        if self.exchange is not None:
            with timer("exchange_s"):
                self.exchange.allreduce(learner.grad, average=True)
        learner.apply(timer)
        if learner.obs_stats is not None:     # the observations acted on, not the last
            learner.observe(unrolls.obs[:-1])
            learner.merge_batch_obs_stats(self.exchange)
        self.version += 1
        return losses


def record_lags(summary: Summary, run_dir, lags: list[int]) -> None:
    """The policy lags of every unroll (or transition) trained on: their mean and 95th
    percentile into ``summary``, every one, in order, into ``policy_lag.npy``."""
    summary.mean_policy_lag, summary.p95_policy_lag = lag_stats(lags)
    np.save(run_dir / "policy_lag.npy", np.asarray(lags, dtype=np.int64))


def lag_stats(lags: list[int]) -> tuple[float, float]:
    """Mean and 95th percentile of policy lags (NaN when there are none)."""
    if not lags:
        return math.nan, math.nan
    values = np.asarray(lags, dtype=np.float64)
    return float(values.mean()), float(np.percentile(values, 95))


def settle(summary: Summary, comm: MPI.Comm, counts: dict,
           invariants: tuple = ledger.UNROLLS + ledger.REQUESTS,
           extra: tuple[str, ...] = ()) -> dict[str, float]:
    """The run's totals over every rank (collective), checked against ``invariants``
    (:func:`mpirl.kit.ledger.settle`), into ``summary``: every count that is a summary
    field, bytes per env step, and the actors' env share of their time (``bytes_sent``,
    ``actor_env_s``, ``actor_wall_s`` among ``counts``)."""
    totals = ledger.settle(comm, counts, invariants,
                           extra=("bytes_sent", "actor_env_s", "actor_wall_s", *extra))
    ledger.record(summary, totals)
    steps, wall = summary.env_steps, totals["actor_wall_s"]
    summary.bytes_per_env_step = totals["bytes_sent"] / steps if steps else math.nan
    summary.actor_env_share = totals["actor_env_s"] / wall if wall else math.nan
    return totals


def take_reply(client: ChannelClient, reply: np.ndarray, params: np.ndarray, delivery,
               version: int, timer, timeout_s: float) -> tuple[bool, int]:
    """An actor's turn to hear from its learner: wait for the reply to its last message
    and take the parameters it carries (``TAG_PARAMS``) into ``params`` (the learner's
    ``wire``: with the state they act with) or none (``TAG_KEEP``), then the newest
    broadcast's, if one landed (``delivery``, :mod:`mpirl.kit.delivery`).  False
    on STOP, else True; and the version of the parameters held now."""
    with timer("param_wait_s"):
        tag, _ = client.wait_reply(reply, timeout_s=timeout_s)
    if tag == TAG_STOP:
        return False, version
    if tag == TAG_PARAMS:
        params[:] = reply[0]["params"]
        version = int(reply[0]["meta"][REPLY_META["version"]])
    elif tag != TAG_KEEP:
        raise AccountingError(f"unexpected reply tag {tag} from the learner")
    with timer("param_wait_s"):        # a copy: the broadcast already landed
        newest = delivery.take(params)
    return True, version if newest is None else newest


def actor_counts(phases: dict, **counts) -> dict:
    """An actor's counts: ``counts``, and its env and wall seconds."""
    return {**counts, "actor_env_s": phases.get("env_s", 0.0),
            "actor_wall_s": sum(phases.values())}


def end_run(summary: Summary, comm: MPI.Comm, part, run_dir, *, lags=(),
            invariants: tuple = ledger.UNROLLS + ledger.REQUESTS,
            extra: tuple[str, ...] = ()) -> Summary:
    """Every rank's end (collective): the mean of the last episodes of every role that
    steps envs (``part.episodes``), the policy lags of every learner (``lags``) into
    rank 0's summary, the ledger settled with this rank's bytes sent (:func:`settle`),
    the parameter broadcasts' with it (none where they are pushed: 0 = 0), and
    ``part``'s log closed."""
    summary.final_mean_return = final_mean_return(comm, part.episodes)
    every = comm.gather(list(lags), root=0)
    if comm.Get_rank() == 0:
        record_lags(summary, run_dir, [lag for some in every for lag in some])
    settle(summary, comm, {**part.counts(), "bytes_sent": part.log.bytes_sent()},
           invariants + ledger.DELIVERY, (*extra, "broadcasts_sent"))
    part.log.close(summary.totals())
    return summary

