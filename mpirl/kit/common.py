"""What every design shares: building a rank's parts (an actor-critic replica, or a DQN
learner), the run summary, episode bookkeeping, and the few collectives of progress
reports and start-up checks, and what a resumed run says when it goes on."""

from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import asdict, dataclass, field

import gymnasium
import numpy as np
from mpi4py import MPI

from ..errors import StartupMismatch
from ..launch import on_emulated_cluster
from ..parts.actor import Actor
from ..parts.envs import make_envs
from ..parts.learner import Learner
from ..parts.learner.dqn import DqnLearner
from ..parts.learner.sac import SacLearner
from . import ledger


def build_replica(cfg, rank: int, *, with_actor: bool = True) -> tuple[Learner, Actor | None]:
    """This rank's learner (the same initial replica everywhere) and, unless it runs no
    environment (a parameter server), its actor, seeded ``seed + 10000 * rank``."""
    env_seed = cfg.seed + 10000 * rank
    envs = make_envs(cfg.env, cfg.num_envs, env_seed, cfg.action_repeat, cfg.env_kwargs())
    learner = Learner(cfg, envs.single_observation_space, envs.single_action_space)
    if not with_actor:               # the envs only told the spaces
        envs.close()
        return learner, None
    return learner, Actor(envs, env_seed, slowdown=cfg.slowdown_of(rank))


def build_dqn(cfg, rank: int, *, with_actor: bool) -> tuple[DqnLearner | SacLearner,
                                                            Actor | None]:
    """This rank's replay learner (the same initial networks everywhere): DQN for a
    Discrete action space, SAC for a Box one; and its actor."""
    env_seed = cfg.seed + 10000 * rank
    envs = make_envs(cfg.env, cfg.num_envs, env_seed, cfg.action_repeat, cfg.env_kwargs())
    space = envs.single_action_space
    kind = SacLearner if isinstance(space, gymnasium.spaces.Box) else DqnLearner
    learner = kind(cfg, envs.single_observation_space, space)
    if not with_actor:
        envs.close()
        return learner, None
    return learner, Actor(envs, env_seed, slowdown=cfg.slowdown_of(rank))


@dataclass
class Summary:
    """The figures a run ends with (rank 0 writes them to summary.json)."""

    mode: str
    topology: str
    ranks: int
    updates: int = 0
    env_steps: int = 0
    wall_s: float = 0.0
    startup_s: float = math.nan             # launch to training: imports, MPI, envs, model
    gradients_sent: int = 0
    gradients_applied: int = 0
    gradients_dropped: int = 0
    final_mean_return: float = math.nan     # over the last episodes of every rank
    mean_staleness: float = math.nan
    comm_share: float = math.nan            # exchange time / busy time, worker ranks
    phase_s: dict = field(default_factory=dict)   # rank 0's (or worker 1's) seconds per phase
    reached_target: bool = False            # stopped early by target_return
    param_digest: str = ""                  # SHA-256 of the final parameters (rank 0's)
    gradient_bytes: int = 0                 # size of the flat gradient each exchange moves
    torch_threads: int = 0                  # torch's intra-op threads on each rank
    updates_skipped: int = 0                # non-finite gradients skipped (--nan-policy skip)
    ranks_failed: list = field(default_factory=list)   # launch ranks lost, run went on
    writer_rank: int = 0                    # launch rank that wrote this (lowest survivor)
    snapshots: int = 0                      # async/quorum: checkpoint snapshots completed
    snapshot_s: float = 0.0                 # the server's seconds in them (first flag to
                                            # its own checkpoint written), summed
    # impala, seed, ga3c: what travels is unrolls, observations and actions
    unrolls_sent: int = 0                   # by actors (impala) or the predictor (ga3c);
                                            # seed: assembled at the learner
    unrolls_used: int = 0                   # trained on
    unrolls_dropped: int = 0                # too old (--max-policy-lag) or left at the end
    broadcasts_sent: int = 0                # impala --param-delivery broadcast: started by
                                            # the learners
    broadcasts_received: int = 0            # joined by actors (== sent x each's actors)
    reply_progress: str = ""                # the push's parameter replies left the
                                            # learner on its thread (apex) or in its calls;
                                            # "" where parameters are broadcast
    requests_sent: int = 0                  # seed/ga3c: observation requests of actors
    requests_answered: int = 0              # with actions
    requests_dropped: int = 0               # answered with STOP at the end
    actions_received: int = 0               # by actors (== requests_answered)
    mean_policy_lag: float = math.nan       # over unrolls used, in learner updates
    p95_policy_lag: float = math.nan
    bytes_per_env_step: float = math.nan    # every rank's bytes sent / env steps
    mean_inference_batch: float = math.nan  # seed/ga3c: observations per forward pass
    actor_env_share: float = math.nan       # actors' env-stepping seconds / their wall time
    # apex: transitions travel, through prioritized replay ranks
    transitions_sent: int = 0               # by actors (== inserted by the replays)
    transitions_inserted: int = 0
    replay_evicted: int = 0                 # FIFO evictions (inserted = stored + evicted)
    transitions_sampled: int = 0            # handed to the learner
    priority_updates: int = 0               # applied by the replays
    priority_stale: int = 0                 # skipped: their slot was overwritten since

    @classmethod
    def of(cls, cfg, ranks: int, learner) -> "Summary":
        """A run's summary before its figures: its design, rank count, gradient size."""
        return cls(mode=cfg.mode, topology=cfg.topology, ranks=ranks,
                   gradient_bytes=learner.grad.nbytes)

    #: what every run's summary holds, whatever its design (the rest: its ledgers')
    COMMON = ("mode", "topology", "ranks", "updates", "env_steps", "wall_s", "startup_s",
              "final_mean_return", "phase_s", "reached_target", "param_digest",
              "gradient_bytes", "torch_threads", "updates_skipped", "ranks_failed",
              "writer_rank")

    def as_dict(self) -> dict:
        return asdict(self)

    def as_json(self) -> str:
        """summary.json: strict JSON (a figure that has no value, e.g. the mean return of
        a run that finished no episode, is null, not NaN), with the figures every run
        has and those of its design's ledgers (:data:`mpirl.registry.LEDGERS`) only."""
        from .. import registry

        keep = (*self.COMMON, *registry.design(self.mode).summary_fields())
        values = asdict(self)

        def strict(v):
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if isinstance(v, dict):
                return {k: strict(x) for k, x in v.items()}
            return v

        return json.dumps({k: strict(values[k]) for k in keep}, indent=2, allow_nan=False)

    def totals(self) -> dict:
        """The gradient totals, as stored in run.h5's attributes."""
        return {"gradients_sent": self.gradients_sent,
                "gradients_applied": self.gradients_applied,
                "gradients_dropped": self.gradients_dropped,
                "ranks_failed_json": json.dumps(self.ranks_failed)}


class Episodes:
    """Episodes finished on this rank: a window for progress and the last ones for the end."""

    def __init__(self, keep_last: int = 20) -> None:
        self.window_sum = 0.0
        self.window_count = 0
        self.last = deque(maxlen=keep_last)

    def add(self, finished: list[tuple[float, int]]) -> None:
        for ret, _length in finished:
            self.window_sum += ret
            self.window_count += 1
            self.last.append(ret)

    def recent_mean(self) -> float | None:
        """Mean return of the last ``keep_last`` episodes, once that many have finished."""
        if len(self.last) < self.last.maxlen:
            return None
        return sum(self.last) / len(self.last)

    def take_window(self) -> tuple[float, int]:
        out = (self.window_sum, self.window_count)
        self.window_sum, self.window_count = 0.0, 0
        return out

    def state(self) -> dict:
        return {"episodes": {"window_sum": self.window_sum, "window_count": self.window_count,
                             "last": list(self.last)}}

    def load_state(self, state: dict) -> None:
        saved = state["episodes"]
        self.window_sum, self.window_count = saved["window_sum"], saved["window_count"]
        self.last.clear()
        self.last.extend(saved["last"])


def final_mean_return(comm: MPI.Comm, episodes: Episodes | None) -> float:
    """Mean over the last episodes of every rank that ran envs (collective)."""
    last = list(episodes.last) if episodes is not None else []
    total = comm.allreduce(sum(last))
    count = comm.allreduce(len(last))
    return total / count if count else math.nan


def close_run(summary: Summary, comm: MPI.Comm, part, invariants: tuple,
              extra: tuple[str, ...] = ()) -> Summary:
    """Every rank's end (collective): ``part.counts()`` settled over the ranks against
    ``invariants`` (:func:`mpirl.kit.ledger.settle`) into ``summary``, the mean of the
    last episodes of every role that steps envs (``part.episodes``), ``part``'s log
    closed."""
    ledger.record(summary, ledger.settle(comm, part.counts(), invariants, extra=extra))
    summary.final_mean_return = final_mean_return(comm, part.episodes)
    part.log.close(summary.totals())
    return summary


def comm_share(phases: dict) -> float:
    """Share of the busy seconds in ``phases`` spent in the exchange."""
    busy = sum(phases.values())
    return phases.get("exchange_s", 0.0) / busy if busy else 0.0


def sum_over_ranks(comm: MPI.Comm, values: tuple[float, ...]) -> tuple:
    """Element-wise sum of a few numbers over all ranks, known to every rank."""
    total = np.asarray(values, dtype=np.float64)
    comm.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
    return tuple(total.tolist())


def reached_target(target: float, recent_means: list[float], ranks: int) -> bool:
    """True when ``target`` is set, all ``ranks`` have a full window of recent episodes,
    and the mean of their windows' means reaches ``target``."""
    return bool(target and len(recent_means) == ranks
                and sum(recent_means) / ranks >= target)


def start_replica(cfg, comm: MPI.Comm, *, with_actor: bool = True,
                  build=None) -> tuple[Learner, Actor | None]:
    """This rank's learner and actor (``build``: :func:`build_replica` unless given),
    every rank's model checked to be the same size (collective)."""
    learner, actor = (build or build_replica)(cfg, comm.Get_rank(), with_actor=with_actor)
    check_same_model(comm, learner)
    return learner, actor


def check_same_model(comm: MPI.Comm, learner: Learner) -> None:
    """Every rank built a model of the same size (collective; same answer everywhere)."""
    counts = comm.allgather(int(learner.params.size))
    if len(set(counts)) > 1:
        odd = [r for r, c in enumerate(counts) if c != counts[0]]
        raise StartupMismatch(f"ranks {odd} built a model with a different parameter count "
                              f"than rank 0 ({[counts[r] for r in odd]} vs {counts[0]}): "
                              "every rank must run the same env spaces and network")


def ranks_sharing_cores(comm: MPI.Comm) -> int:
    """Ranks sharing this rank's cores (collective): those on its node, or, on an
    emulated cluster, every rank of the job (its nodes are namespaces of one machine:
    counting only a node's ranks gave each rank all the cores, and torch's threads of
    4 ranks on 2 cores slowed a 1 MiB model's update about 30x)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return comm.Get_size() if on_emulated_cluster() else node.Get_size()
    finally:
        node.Free()


def print_layout(topology, rank: int) -> None:
    """Rank 0 prints the topology's layout line (``Topology.layout``), if it has one."""
    line = topology.layout() if topology is not None else None
    if line and rank == 0:
        print(f"mpirl: {line}", flush=True)


def resume_in_step(comm: MPI.Comm, saved, run_dir, rollout_key: str) -> None:
    """Every part of ``saved`` (a :class:`~mpirl.resilience.checkpoint.TrainingState`)
    from this rank's checkpoint, the ranks agreeing (collective, in two steps: nothing
    is put back, progress.csv not cut, until every rank's file is read and of one
    rollout).  A rank's failure (its file unreadable or recording no update or rollout,
    or a part refusing it) is told on
    every rank, none waiting for a rank that left; ranks whose checkpoints are of
    different rollouts (``update`` and ``rollout_key``) are refused: a job killed while
    its ranks wrote them leaves them apart, and ranks apart would fall out of step in
    their collectives."""
    from ..resilience import checkpoint

    path = checkpoint.path_for(run_dir, comm.Get_rank())
    state, position, error = None, (None, None), ""
    try:
        state = checkpoint.load(run_dir, comm.Get_rank())
    except Exception as err:
        error = checkpoint.unreadable(path, err)
    else:
        missing = [key for key in ("update", rollout_key)
                   if not isinstance(state, dict) or key not in state]
        if missing:
            error = f"{path.name} records no {' and no '.join(missing)}"
        else:
            position = (state["update"], state[rollout_key])
    where = comm.allgather((*position, error))
    refuse_failed(run_dir, [e for *_, e in where])
    different = checkpoint.apart([(u, n) for u, n, _ in where])
    if different:
        raise StartupMismatch(f"resume={str(run_dir)!r}: the ranks' checkpoints are of "
                              f"different rollouts ({different}): the job was killed "
                              "while they were written; there is no state to resume from")
    refuse_failed(run_dir, comm.allgather(checkpoint.put_back(saved, state)))


def refuse_failed(run_dir, errors: list[str]) -> None:
    """Refuse the resume of ``run_dir`` (one line, on every rank) when a rank's entry of
    ``errors`` (gathered, one per rank; "" where all went well) says why."""
    failed = [(r, e) for r, e in enumerate(errors) if e]
    if failed:
        raise StartupMismatch(f"resume={str(run_dir)!r}: rank {failed[0][0]}: {failed[0][1]}")


def say_resumed(cfg, run_dir, where: str) -> None:
    """Rank 0 of a resumed run, once its checkpoint is back: save the flags given on top
    into ``config.yaml`` (:meth:`~mpirl.config.Config.save_resumed`) and say so, and
    where the run goes on from (``where``: "at update 50 (6400 env steps)")."""
    changed = cfg.save_resumed(run_dir / "config.yaml")
    if changed:
        print(f"mpirl: resuming with {', '.join(changed)} (saved to "
              f"{run_dir / 'config.yaml'})", flush=True)
    print(f"mpirl: resumed {run_dir} {where}", flush=True)
