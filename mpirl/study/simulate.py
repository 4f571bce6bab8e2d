"""``python -m mpirl.simulate``: predicted scaling of every design to thousands of ranks.

    python -m mpirl.simulate --params figures/costmodel/params.json \\
        --compute-from runs/sweeps/topologies/butterfly-sync-2r-s1 \\
        --measured runs/sweeps/topologies runs/sweeps/straggler -o figures/simulate

For each topology x mode and rank count (1 to ``--max-ranks``, default 4096) it predicts
the time per update, updates/s, env steps/s, the workers' idle share and, for async and
quorum, the staleness distribution, from

* the exchange's cost: the alpha-beta-gamma model fitted by ``mpirl.costmodel``;
* the compute time of one update on one rank: sampled from a measured run's log
  (``--compute-from RUN``: every worker update's compute seconds, straggler phases and
  all) or drawn from a distribution (``--compute-s``, ``--compute-dist``, ``--tail``);
  ``--straggler RANK:FACTOR`` slows chosen ranks as in ``mpirl.run``;
* the model size (``--bytes``, default the measured run's gradient size).

Sync is closed form per update: every rank waits for the slowest, so an update takes
``max_i(compute_i) + T_allreduce(p, n)`` (Monte Carlo over the compute distribution).
Async and quorum run a discrete-event simulation of the parameter server: pushes queue at
the server, each costs it a receive, an optimizer step and a reply (``(alpha + n beta)``
each way, ``gamma n`` for the step: its bandwidth and processing are the bottleneck that
grows with the worker count), and staleness is counted exactly as the runtime counts it.
On shared memory the server's CPU does the three in turn; over a network (parameters
fitted on the emulated cluster, ``duplex_links``) its link receives while it sends,
each direction shared by the messages on it as TCP flows share a link.
Sharded servers (gorila's pattern, ``async --servers S``): S servers each take a shard of
``n / S`` of every push; they see the same arrivals in the same order and cost the same,
so one shard is simulated with ``n / S`` bytes and ``p - S`` workers (the worker's own
S messages are sent at once, as the runtime does).

Not simulated: impala, seed, ga3c and apex.  Their rate is set by a learner's (or an
inference rank's) service time per unroll, per batch of observations or per sampled
batch, and by the size of what travels, which a worker's compute samples do not hold;
modelling them needs per-role service-time samples from their logs, not built yet.

``--measured`` puts measured runs (their updates/s) on the same figure, and the table
prints the simulator's error for every measured (topology, mode, ranks).
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .costmodel import Params, link_bytes, load_params, predict


@dataclass
class Prediction:
    topology: str
    mode: str
    ranks: int
    update_s: float                # wall seconds per server/optimizer update
    updates_per_s: float
    env_steps_per_s: float
    idle_share: float              # workers' wall time not spent computing (waiting + moving)
    staleness: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def row(self) -> dict:
        s = self.staleness
        return {"topology": self.topology, "mode": self.mode, "ranks": self.ranks,
                "update_s": self.update_s, "updates_per_s": self.updates_per_s,
                "env_steps_per_s": self.env_steps_per_s, "idle_share": self.idle_share,
                "staleness_mean": float(s.mean()) if len(s) else math.nan,
                "staleness_p99": float(np.quantile(s, 0.99)) if len(s) else math.nan}


class Compute:
    """Seconds one update's computation takes on one rank: samples of a measured run,
    or a fixed / lognormal / pareto draw, with per-rank straggler factors."""

    def __init__(self, *, samples: np.ndarray | None = None, mean_s: float = 0.02,
                 dist: str = "fixed", tail: float = 0.5, stragglers: dict | None = None,
                 per_rank: dict | None = None, joint: np.ndarray | None = None,
                 seed: int = 0) -> None:
        self.samples, self.mean_s, self.dist, self.tail = samples, mean_s, dist, tail
        self.stragglers = stragglers or {}
        self.per_rank = per_rank or {}      # rank -> that rank's own measured samples
        #: [updates, ranks] measured side by side (a sync run): whole rows are drawn, so
        #: ranks slowed together (sharing cores) stay together
        self.joint = joint
        self.rng = np.random.default_rng(seed)

    def draw(self, shape) -> np.ndarray:
        if self.samples is not None:
            return self.rng.choice(self.samples, size=shape)
        if self.dist == "fixed":
            return np.full(shape, self.mean_s)
        if self.dist == "lognormal":
            return self.mean_s * np.exp(self.tail * self.rng.standard_normal(shape))
        return self.mean_s * (1.0 - self.rng.random(shape)) ** (-1.0 / self.tail)

    def for_ranks(self, updates: int, ranks: np.ndarray) -> np.ndarray:
        """``[updates, len(ranks)]`` compute seconds for those ranks."""
        if self.joint is not None and self.joint.shape[1] == len(ranks):
            return self.joint[self.rng.integers(0, len(self.joint), size=updates)]
        c = self.draw((updates, len(ranks)))
        for rank, factor in self.stragglers.items():
            c[:, ranks == rank] *= factor
        for i, rank in enumerate(ranks):
            if int(rank) in self.per_rank:
                c[:, i] = self.rng.choice(self.per_rank[int(rank)], size=updates)
        return c


def simulate_sync(params: Params, topology: str, p: int, nbytes: float, compute: Compute,
                  steps_per_update: int, updates: int = 200,
                  exchanges: float = 1.0) -> Prediction:
    """``exchanges`` allreduces per update (a round of PPO's update repeats, say)."""
    c = compute.for_ranks(updates, np.arange(p))
    # the links idle while the ranks compute: a token bucket is full at every exchange
    idle = replace(params, refill_bytes=params.burst_bytes)
    exchange = exchanges * predict(idle, "allreduce", topology, p, nbytes) if p > 1 else 0.0
    slowest = c.max(axis=1)
    update_s = float(np.mean(slowest) + exchange)
    idle = 1.0 - float(np.mean(c)) / update_s
    return Prediction(topology, "sync", p, update_s, 1 / update_s,
                      p * steps_per_update / update_s, idle)


def simulate_server(params: Params, mode: str, p: int, nbytes: float, compute: Compute,
                    steps_per_update: int, quorum: int = 0, pushes_per_worker: int = 60,
                    max_events: int = 200_000, servers: int = 1) -> Prediction:
    """The parameter server (rank 0) and ``p - 1`` workers, event by event, until the
    workers have pushed ``pushes_per_worker`` gradients each *on average* (a run's budget
    is global: fast workers push more than slow ones, as in ``mpirl.run``).  With
    ``servers`` S > 1: one of S shard servers, ``n / S`` bytes each, ``p - S`` workers.

    On shared memory (the default) the server's CPU copies each push in (after its
    worker copied it out), steps and copies each reply out, one after another.  Over a
    network (``params.duplex_links``: the emulated cluster's fits) pushes cross the
    server's link in while replies cross its link out, each direction shared by the
    messages on it as TCP flows share a link (n at once move at 1/n of the rate each),
    and the steps queue for the CPU (:func:`_over_a_network`)."""
    workers = p - servers
    nbytes = nbytes / servers
    budget = workers * max(3, min(pushes_per_worker, max_events // workers))
    # one message from Python; a link idle while its worker computed has a full bucket
    transfer = params.alpha + params.delta + params.beta * link_bytes(
        nbytes, 1, params.burst_bytes, params.burst_bytes)
    step_s = nbytes * params.gamma * 4          # Adam touches the gradient ~4 times
    rows = 4 * budget // workers + 4            # enough draws for the fastest worker
    c = compute.for_ranks(rows, np.arange(1, p))[:, :workers]
    run = _ServerRun(mode, quorum or -(-workers // 2), c, budget)
    engine = _over_a_network if params.duplex_links else _on_shared_memory
    wall = engine(run, transfer, step_s)
    idle = 1.0 - float(run.computing.sum()) / (workers * wall) if wall else 0.0
    return Prediction(shards_label(servers), mode, p, wall / max(run.version, 1),
                      run.version / wall, run.sent * steps_per_update / wall, max(0.0, idle),
                      np.asarray(run.stale, dtype=np.int64))


class _ServerRun:
    """The server's policy and the workers' books, whichever way the bytes move: async
    steps on every push; quorum on ``k`` fresh ones, answering every worker it held (a
    late push is held and dropped), staleness counted as the runtime counts it."""

    def __init__(self, mode: str, k: int, compute: np.ndarray, budget: int) -> None:
        self.mode, self.k, self.c, self.budget = mode, k, compute, budget
        self.workers = compute.shape[1]
        self.pushed = np.ones(self.workers, dtype=np.int64)   # pushes sent, per worker
        self.computing = compute[0].copy()                    # compute seconds, per worker
        self.version, self.sent = 0, self.workers
        self.stale: list[int] = []
        self.held: list[int] = []
        self.fresh = 0

    def take(self, w: int, computed_on: int, more_coming: bool) -> list[int] | None:
        """Worker ``w``'s push is in: the workers a step now answers, or None (no step)."""
        if self.mode == "async":
            self.stale.append(self.version - computed_on)
            self.version += 1
            return [w]
        if computed_on == self.version:
            self.fresh += 1
            self.stale.append(0)
        self.held.append(w)
        if self.fresh < self.k and more_coming:
            return None
        self.version += 1
        answer, self.held, self.fresh = self.held, [], 0
        return answer

    def next_compute(self, w: int) -> float | None:
        """Seconds worker ``w`` computes its next push, or None once the budget is sent."""
        if self.sent >= self.budget:
            return None
        draw = self.c[self.pushed[w] % len(self.c), w]
        self.computing[w] += draw
        self.pushed[w] += 1
        self.sent += 1
        return draw


def _on_shared_memory(run: _ServerRun, transfer: float, step_s: float) -> float:
    """The server's CPU alone, in turn: copy a push in, step, copy each reply out.
    Returns the wall seconds."""
    # events: (the push copied out by its worker, the worker, the version it was computed on)
    queue = [(run.c[0, w] + transfer, w, 0) for w in range(run.workers)]
    heapq.heapify(queue)
    busy_until = 0.0
    while queue:
        ready, w, computed_on = heapq.heappop(queue)
        busy_until = max(ready, busy_until) + transfer     # the server copies the push in
        answer = run.take(w, computed_on, bool(queue))
        if answer is None:
            continue
        busy_until += step_s
        for h in answer:
            busy_until += transfer                           # one reply after another
            draw = run.next_compute(h)
            if draw is not None:
                heapq.heappush(queue, (busy_until + draw + transfer, h, run.version))
    return busy_until


class _SharedLink:
    """One direction of a link shared by the messages on it as TCP flows share it: each
    of n at once moves at 1/n of the rate.  Kept in virtual time (the service each
    message has had), so a start or an end costs O(log n)."""

    def __init__(self) -> None:
        self.flows: list[tuple[float, int, int]] = []   # (virtual end, worker, version)
        self.virtual = self.t = 0.0

    def advance(self, now: float) -> None:
        if self.flows:
            self.virtual += (now - self.t) / len(self.flows)
        self.t = now

    def start(self, seconds: float, w: int, version: int) -> None:
        heapq.heappush(self.flows, (self.virtual + seconds, w, version))

    def next_end(self) -> float:
        if not self.flows:
            return math.inf
        return self.t + max(0.0, self.flows[0][0] - self.virtual) * len(self.flows)

    def finish(self) -> tuple[int, int]:
        _, w, version = heapq.heappop(self.flows)
        return w, version


def _over_a_network(run: _ServerRun, transfer: float, step_s: float) -> float:
    """Pushes share the server's link in, replies its link out (:class:`_SharedLink`),
    steps queue for its CPU; a worker computes once its reply is in.  Returns the wall
    seconds."""
    computing = [(run.c[0, w], w, 0) for w in range(run.workers)]  # (done, worker, version)
    heapq.heapify(computing)
    pushes, replies = _SharedLink(), _SharedLink()
    steps: list[tuple[float, int, list[int]]] = []   # (done, version after it, answer)
    cpu_free = now = 0.0
    while computing or pushes.flows or replies.flows or steps:
        events = (computing[0][0] if computing else math.inf, pushes.next_end(),
                  steps[0][0] if steps else math.inf, replies.next_end())
        now = min(events)
        pushes.advance(now)
        replies.advance(now)
        kind = events.index(now)
        if kind == 0:                                  # a push goes on the wire
            _, w, version = heapq.heappop(computing)
            pushes.start(transfer, w, version)
        elif kind == 1:                                # a push is in
            w, version = pushes.finish()
            more = bool(computing or pushes.flows) or run.sent < run.budget
            answer = run.take(w, version, more)
            if answer is not None:
                cpu_free = max(now, cpu_free) + step_s
                heapq.heappush(steps, (cpu_free, run.version, answer))
        elif kind == 2:                                # a step is done: its replies leave
            _, version, answer = heapq.heappop(steps)
            for h in answer:
                replies.start(transfer, h, version)
        else:                                          # a reply is in: compute again
            w, version = replies.finish()
            draw = run.next_compute(w)
            if draw is not None:
                heapq.heappush(computing, (now + draw, w, version))
    return now


def shards_label(servers: int) -> str:
    """The "topology" of a (sharded) parameter server in predictions and figures."""
    return "star" if servers == 1 else f"{servers} shards"


def simulate(params: Params, topology: str, mode: str, p: int, nbytes: float,
             compute: Compute, steps_per_update: int, quorum: int = 0,
             servers: int = 1, pushes_per_worker: int = 60,
             exchanges: float = 1.0) -> Prediction:
    """One design at ``p`` ranks; ``exchanges`` allreduces per update (sync only: a
    server design's worker pushes once per computed gradient)."""
    if mode == "sync":
        return simulate_sync(params, topology, p, nbytes, compute, steps_per_update,
                             exchanges=exchanges)
    if exchanges != 1.0:
        raise ValueError(f"exchanges={exchanges:g} per update is modelled for sync only")
    if mode not in SIMULATED:
        raise ValueError(f"mode={mode!r} is not simulated; allowed: {', '.join(SIMULATED)} "
                         "(see this module's doc for why)")
    if p <= servers:
        raise ValueError(f"{mode} with {servers} server(s) needs at least {servers + 1} ranks")
    return simulate_server(params, "async" if mode == "gorila" else mode, p, nbytes, compute,
                           steps_per_update, quorum, pushes_per_worker, servers=servers)


def validate(params: Params, run_dir) -> dict:
    """The simulator against one measured run: its own per-rank compute samples (a sync
    run's drawn a whole update at a time: its ranks' computes moved together), its
    gradient size, rank count and (parameter servers) pushes per worker, so that the
    start, when every worker pushes at once, weighs as much as it did; returns measured
    and predicted updates/s."""
    from ..telemetry.read import load_run

    run = load_run(run_dir)
    u = run.updates[run.updates["role"] == "worker"]
    per_rank = {int(r): g["compute_s"].to_numpy() for r, g in u.groupby("rank")}
    cfg, p = run.config, int(run.meta["world_size"])
    steps = cfg["num_envs"] * cfg["rollout_steps"] * cfg["action_repeat"]
    # a sync run's ranks computed side by side: their updates are drawn together
    joint = u.pivot_table(index="update", columns="rank", values="compute_s").dropna()
    compute = Compute(per_rank=per_rank, samples=u["compute_s"].to_numpy(),
                      joint=joint.to_numpy() if run.config["mode"] == "sync" else None)
    servers = cfg.get("servers", 1)
    pushes = run.summary.get("gradients_sent", 0) // max(1, p - servers)
    predicted = simulate(params, cfg["topology"], cfg["mode"], p,
                         float(run.summary["gradient_bytes"]), compute, steps,
                         quorum=cfg.get("quorum", 0), servers=servers,
                         pushes_per_worker=max(3, pushes))
    measured = run.summary["updates"] / run.summary["wall_s"]
    topology = cfg["topology"] if cfg["mode"] == "sync" else shards_label(cfg.get("servers", 1))
    return {"run": run.name, "topology": topology, "mode": cfg["mode"], "ranks": p,
            "straggler": ",".join(cfg.get("straggler") or []) or "none",
            "measured_updates_per_s": measured,
            "predicted_updates_per_s": predicted.updates_per_s,
            "error": predicted.updates_per_s / measured - 1.0,
            "oversubscribed": bool(run.meta.get("oversubscribed", False))}


RANKS = [1, 2, 3, 4, 5, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
#: (topology, mode, parameter servers) of every prediction; async over 4 and 16 shards is
#: gorila's exchange on the same workload
DESIGNS = [("native", "sync", 1), ("star", "sync", 1), ("tree", "sync", 1),
           ("butterfly", "sync", 1), ("ring", "sync", 1), ("star", "async", 1),
           ("star", "quorum", 1), ("star", "async", 4), ("star", "async", 16)]
#: the modes the simulator models (sync in closed form, the others event by event)
SIMULATED = ("sync", "async", "quorum", "gorila")


class RunCompute(NamedTuple):
    """What a sync run's log says of its rounds (one rollout and the updates learnt from
    it): each round's compute seconds on one rank, the gradient's bytes (0 when the run
    has no summary.json), env steps per round per rank and allreduces per round."""

    samples: np.ndarray
    nbytes: float
    steps: int
    exchanges: float


def compute_from_run(run_dir) -> RunCompute:
    """The rounds of a run's workers, for :func:`simulate_sync`.

    A round starts at the row that carries its rollout's env steps; its compute is the
    sum of its rows' (PPO's update repeats and minibatches, sync-replay's updates), its
    allreduces are its rows that received bytes (a replay's warm-up rows exchange
    nothing).  The table's last round (the last rank's, which a stop may cut short) is
    left out when there are others.  A run stopped by a time limit has no summary.json:
    ``nbytes`` is then 0 and the caller says what the gradient weighs."""
    from ..telemetry.read import load_run

    run = load_run(run_dir)
    u = run.updates[run.updates["role"] == "worker"].sort_values(["rank", "update"])
    u = u.assign(round=u.groupby("rank")["env_steps"].transform(lambda s: (s > 0).cumsum()))
    u = u[u["round"] > 0]
    rounds = u.groupby(["rank", "round"]).agg(
        compute_s=("compute_s", "sum"), steps=("env_steps", "sum"),
        exchanges=("bytes_recv", lambda b: int((b > 0).sum())))
    if len(rounds) > 1:
        rounds = rounds.iloc[:-1]
    return RunCompute(samples=rounds["compute_s"].to_numpy(),
                      nbytes=float(run.summary.get("gradient_bytes") or 0),
                      steps=int(np.median(rounds["steps"])),
                      exchanges=float(np.median(rounds["exchanges"])) or 1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpirl.simulate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", required=True,
                        help="params.json from python -m mpirl.costmodel ... -o DIR")
    parser.add_argument("--compute-from", metavar="RUN",
                        help="sample per-round compute times (and take env steps and "
                             "allreduces per round) from this sync run's log")
    parser.add_argument("--compute-s", type=float, default=0.02,
                        help="median compute seconds per update (without --compute-from)")
    parser.add_argument("--compute-dist", choices=("fixed", "lognormal", "pareto"),
                        default="lognormal")
    parser.add_argument("--tail", type=float, default=0.3)
    parser.add_argument("--bytes", type=float, help="gradient size in bytes")
    parser.add_argument("--steps-per-update", type=int, default=64)
    parser.add_argument("--straggler", action="append", default=[], metavar="RANK:FACTOR")
    parser.add_argument("--max-ranks", type=int, default=4096)
    parser.add_argument("--measured", nargs="*", default=[],
                        help="run or sweep directories to compare with")
    parser.add_argument("-o", "--out", help="directory for predictions.csv and the figure")
    args = parser.parse_args(argv)
    params = load_params(args.params)
    samples, nbytes, steps, exchanges = None, args.bytes, args.steps_per_update, 1.0
    if args.compute_from:
        found = compute_from_run(args.compute_from)
        samples, steps, exchanges = found.samples, found.steps, found.exchanges
        nbytes = nbytes or found.nbytes
    if not nbytes:
        parser.error("give --bytes, or --compute-from a run with a summary.json "
                     "(it holds gradient_bytes)")
    stragglers = {int(s.split(":")[0]): float(s.split(":")[1]) for s in args.straggler}
    rows = []
    if exchanges != 1.0:
        print(f"{exchanges:g} allreduces per round in {args.compute_from}: the server "
              "designs, one push per gradient, are not predicted from its rounds")
    for topology, mode, servers in DESIGNS:
        for p in [r for r in RANKS if r <= args.max_ranks]:
            if mode != "sync" and (p <= servers or exchanges != 1.0):
                continue
            compute = Compute(samples=samples, mean_s=args.compute_s, dist=args.compute_dist,
                              tail=args.tail, stragglers=stragglers)
            rows.append(simulate(params, topology, mode, p, nbytes, compute, steps,
                                 servers=servers, exchanges=exchanges).row())
    import pandas as pd

    table = pd.DataFrame(rows)
    print(f"gradient {nbytes / 1024:.1f} KiB, {steps} env steps per update per rank, "
          f"{exchanges:g} allreduce(s) per update")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    checks = validation(params, args.measured) if args.measured else pd.DataFrame()
    if args.out:
        write_outputs(Path(args.out), table, checks, nbytes)
    return 0


def validation(params: Params, measured: list[str]):
    """Every finished run under ``measured`` re-simulated (:func:`validate`), printed."""
    import pandas as pd

    from ..telemetry.read import find_runs

    runs = [d for d in find_runs(*measured) if (d / "summary.json").is_file()]
    simulated = [d for d in runs if _mode_of(d) in SIMULATED]
    if len(simulated) < len(runs):
        print(f"(not simulated: {len(runs) - len(simulated)} runs of "
              f"{', '.join(sorted({_mode_of(d) for d in runs} - set(SIMULATED)))})")
    checks = pd.DataFrame([validate(params, d) for d in simulated])
    print("\nvalidation against measured runs (updates/s; error = predicted/measured - 1):")
    print(checks.drop(columns="run").to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"median |error| {100 * checks['error'].abs().median():.1f}%, "
          f"max {100 * checks['error'].abs().max():.1f}%")
    return checks


def _mode_of(run_dir: Path) -> str:
    import json
    return json.loads((run_dir / "summary.json").read_text())["mode"]


def write_outputs(out: Path, table, checks, nbytes: float) -> None:
    """predictions.csv, validation.csv (when there are measured runs) and the figure."""
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "predictions.csv", index=False)
    written = [out / "predictions.csv"]
    if len(checks):
        checks.to_csv(out / "validation.csv", index=False)
        written.append(out / "validation.csv")
    import matplotlib

    matplotlib.use("Agg")
    from .figures import predicted_scaling_figure

    fig = predicted_scaling_figure(table, checks, nbytes)
    for fmt in ("png", "pdf"):
        fig.savefig(out / f"predicted_scaling.{fmt}", dpi=130, bbox_inches="tight")
        written.append(out / f"predicted_scaling.{fmt}")
    for path in written:
        print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
