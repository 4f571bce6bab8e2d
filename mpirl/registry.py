"""The design registry: one row per ``--mode``, everything the rest of mpirl needs to know
about a design, in one place.

A row says how to run the design (``entry``, imported only when it runs), which role each
rank plays, whether its runs can be replayed and which ranks record their order, which
learner and action spaces it takes, which options are its own, and which summary figures
it ends with.  Configuration checks, the log schema's readers, the schedule recorder, the
CLI's help and the summary printout read the rows; none of them names a mode.  The
module imports nothing of mpirl and no torch: configuration checks and log readers use it
before (or without) any simulator or network.

Adding a design is one module in ``mpirl/designs/`` (its ``run(cfg, comm, run_dir)``)
plus one row in :data:`DESIGNS` (docs/architecture.md, "Adding a design").

Roles are the ones each rank writes into its log (``rankNNNN.h5``'s ``role``); the ranks
that step environments have the roles in :data:`EXPERIENCE_ROLES`.  A design's ranks are
its *serving* ranks first (servers, learners, replays; ``serving(cfg)``), then one rank
of its experience role for each rank left.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

#: the roles of ranks that step environments (their rows carry env steps and episodes)
EXPERIENCE_ROLES = ("worker", "actor")

#: summary.json's figures, by the ledger they belong to; a design ends with the
#: figures every run has plus those of its ledgers
LEDGERS: dict[str, tuple[str, ...]] = {
    "gradients": ("gradients_sent", "gradients_applied", "gradients_dropped",
                  "mean_staleness", "comm_share"),
    "snapshots": ("snapshots", "snapshot_s"),
    "unrolls": ("unrolls_sent", "unrolls_used", "unrolls_dropped"),
    "delivery": ("broadcasts_sent", "broadcasts_received", "reply_progress"),
    "lag": ("mean_policy_lag", "p95_policy_lag", "bytes_per_env_step", "actor_env_share"),
    "requests": ("requests_sent", "requests_answered", "requests_dropped",
                 "actions_received", "mean_inference_batch"),
    "transitions": ("transitions_sent", "transitions_inserted", "replay_evicted",
                    "transitions_sampled", "priority_updates", "priority_stale"),
}


@dataclass(frozen=True)
class Design:
    """One ``--mode``: its run entry and what follows from its wiring."""

    name: str
    #: ``module:function`` of ``run(cfg, comm, run_dir) -> Summary``, imported to run it
    entry: str
    #: one line: who does what (for --help and the docs)
    about: str
    #: what travels between ranks
    travels: str
    #: the ranks before the experience ranks, by role (``cfg`` -> roles)
    serving: Callable[[object], tuple[str, ...]]
    #: the role of every other rank: ``worker`` (computes gradients) or ``actor``
    experience_role: str = "worker"
    #: the learner it trains: ``actor-critic`` (A2C/PPO, V-trace) or ``replay`` (from
    #: replayed n-step transitions: double DQN for a Discrete action space, SAC for Box)
    learner: str = "actor-critic"
    #: the gymnasium action spaces its learner takes
    action_spaces: tuple[str, ...] = ("Discrete", "Box")
    #: ranks whose order of events decides the result, recorded for ``--replay-schedule``
    #: (``(cfg, size)`` -> ranks); None: the design is deterministic (nothing to replay)
    deciding: Callable[[object, int], list[int]] | None = None
    #: the summary ledgers it fills (:data:`LEDGERS`)
    ledgers: tuple[str, ...] = ()
    #: its parameters' users carry a version: its log has policy-lag columns and
    #: ``policy_lag.npy``
    lagged: bool = False
    #: what ``--topology`` does in it: ``allreduce`` (every gradient), ``star`` (the
    #: parameter server: only star is allowed), ``learners`` (among several learners)
    #: or ``unused``
    topology_use: str = "unused"
    #: how it checkpoints: ``replica`` (every rank its file), ``snapshots`` (consistent
    #: generations), or None (``--resume`` refused)
    checkpoints: str | None = None
    #: the design-specific options it takes beyond the shared ones (others must keep
    #: their defaults where a check says so: learners, servers)
    options: tuple[str, ...] = ()
    #: seed/ga3c: the inference batching ``--inference-policy auto`` means
    inference: str | None = None
    #: (field, value) pairs this design starts from where the user sets the field
    #: neither by flag nor in a YAML file (SB3's and CleanRL's per-algorithm defaults);
    #: each measured to reach its documented result where the shared default did not
    defaults: tuple[tuple[str, object], ...] = ()
    #: its ranks may be survived (``--on-failure shrink``: every rank holds the state)
    shrinkable: bool = False
    #: its gradients pass a guard before they travel: ``--fail`` injects there, and
    #: ``--nan-policy`` acts there (False: both refused at start)
    guarded: bool = True
    #: (flag, ``module:function``) pairs: the entry that runs instead of :attr:`entry`
    #: when the boolean config ``flag`` is set (a variant of the design's loop)
    variants: tuple[tuple[str, str], ...] = ()

    def entry_for(self, cfg) -> str:
        """The ``module:function`` that runs ``cfg``."""
        return next((target for flag, target in self.variants if getattr(cfg, flag)),
                    self.entry)

    def roles(self, cfg, size: int) -> tuple[str, ...]:
        """The role of each of ``size`` ranks."""
        serving = self.serving(cfg)
        return (*serving, *(self.experience_role,) * max(0, size - len(serving)))

    def experience_ranks(self, cfg, size: int) -> int:
        """Ranks that step environments."""
        return sum(role in EXPERIENCE_ROLES for role in self.roles(cfg, size))

    @property
    def replayable(self) -> bool:
        return self.deciding is not None

    def summary_fields(self) -> tuple[str, ...]:
        """The summary figures of this design's ledgers."""
        return tuple(f for ledger in self.ledgers for f in LEDGERS[ledger])


#: PPO's options that act inside a worker's loss, and the book's per-batch reward
#: scaling (stateless: any design whose workers learn from their own batches takes them)
PPO_LOSS_OPTIONS = ("norm_adv", "clip_vloss", "reward_scale")
#: and those that need the sync loop: minibatch exchanges, statistics merged over the
#: replicas, the budget's lr schedule, per-replica reward statistics in its checkpoint
PPO_OPTIONS = (*PPO_LOSS_OPTIONS, "minibatches", "obs_norm", "anneal_lr", "reward_norm")
#: state the V-trace learners own and hand their actors (or predictor) with the
#: parameters: the observation statistics (the learner's ``wire``)
LEARNER_OWNED = ("obs_norm",)
#: and those a parameter server owns: merged from the statistics each push carries,
#: sent back with every reply's parameters
SERVER_OWNED = ("obs_norm",)


def _servers(cfg) -> tuple[str, ...]:
    return ("server",) * cfg.servers


def _gorila_serving(cfg) -> tuple[str, ...]:
    replays = cfg.replay_ranks if cfg.gorila_replay == "service" else 0
    return (*_servers(cfg), *("replay",) * replays)


def _gorila_deciding(cfg, size: int) -> list[int]:
    if cfg.gorila_replay == "service":
        return list(range(size))          # shards, replay ranks and every worker
    return list(range(cfg.servers))


DESIGNS: dict[str, Design] = {d.name: d for d in (
    Design("sync", "mpirl.designs.sync:run_sync",
           "every rank computes a gradient, all are averaged by the topology's allreduce, "
           "every rank steps: A2C, synchronous DPPO",
           "every rank's gradient, averaged by the topology's allreduce",
           serving=lambda cfg: (), ledgers=("gradients",), topology_use="allreduce",
           checkpoints="replica", shrinkable=True,
           options=(*PPO_OPTIONS, "overlap", "bucket_mb", "one_step_stale"),
           variants=(("one_step_stale", "mpirl.designs.stale:run_stale"),)),
    Design("sync-replay", "mpirl.designs.syncreplay:run_sync_replay",
           "every rank acts into its own replay and learns from it; the gradients are "
           "averaged by the topology's allreduce: the book's multi-process SAC (DQN for "
           "Discrete actions)",
           "every rank's gradient, averaged by the topology's allreduce; transitions stay "
           "on their rank",
           serving=lambda cfg: (), learner="replay", ledgers=("gradients", "transitions"),
           topology_use="allreduce", checkpoints="replica",
           # 8 updates per rollout (4 samples per env step at 4 ranks of 64 steps, SB3
           # zoo's DQN takes 32): with 1, DQN collapsed on CartPole for 1 seed in 3;
           # experiments/bench_design_defaults.py measures both.  A checkpoint holds the
           # replay (up to hundreds of MB): every 5000 rollouts, not sync's 100
           defaults=(("update_repeat", 8), ("checkpoint_every", 5000))),
    Design("async", "mpirl.designs.paramserver:run_async",
           "rank 0 is a parameter server that applies each worker's gradient on arrival and "
           "answers that worker alone: A3C; --servers S shards it",
           "a worker's gradient up, fresh parameters back to that worker",
           serving=_servers, deciding=lambda cfg, size: list(range(cfg.servers)),
           ledgers=("gradients", "snapshots"), topology_use="star", checkpoints="snapshots",
           options=("servers", *PPO_LOSS_OPTIONS, *SERVER_OWNED),
           defaults=(("topology", "star"),)),    # the only exchange it takes
    Design("quorum", "mpirl.designs.paramserver:run_quorum",
           "the server waits for --quorum fresh gradients, averages them, steps and answers: "
           "DPPO's leader",
           "gradients up, parameters back to the held workers",
           serving=lambda cfg: ("server",), deciding=lambda cfg, size: [0],
           ledgers=("gradients", "snapshots"), topology_use="star", checkpoints="snapshots",
           options=("quorum", "late", *PPO_LOSS_OPTIONS, *SERVER_OWNED),
           defaults=(("topology", "star"),)),
    Design("impala", "mpirl.designs.impala:run_impala",
           "ranks 0..L-1 learn with V-trace (--learners L), the others act: IMPALA",
           "whole unrolls up, parameters (or a version) back",
           serving=lambda cfg: ("learner",) * cfg.learners, experience_role="actor",
           deciding=lambda cfg, size: list(range(cfg.learners)),
           ledgers=("unrolls", "lag", "delivery"), lagged=True, topology_use="learners",
           guarded=False,
           options=("learners", "param_refresh", "refresh_every", "param_delivery",
                    *LEARNER_OWNED)),
    Design("seed", "mpirl.designs.seed:run_seed",
           "rank 0 learns and infers for every actor; actors only step envs: SEED RL",
           "one observation per env step up, an action back",
           serving=lambda cfg: ("learner",), experience_role="actor",
           deciding=lambda cfg, size: [0], ledgers=("unrolls", "lag", "requests"), lagged=True,
           inference="fixed", options=LEARNER_OWNED, guarded=False),
    Design("ga3c", "mpirl.designs.ga3c:run_ga3c",
           "rank 0 trains, rank 1 predicts for every actor: GA3C",
           "observations up, actions back; unrolls predictor -> trainer, parameters back",
           serving=lambda cfg: ("learner", "predictor"), experience_role="actor",
           deciding=lambda cfg, size: [1],    # the predictor; the trainer takes FIFO
           ledgers=("unrolls", "lag", "requests"), lagged=True, inference="drain",
           options=LEARNER_OWNED, guarded=False),
    Design("apex", "mpirl.designs.apex:run_apex",
           "rank 0 learns n-step double DQN, ranks 1..R hold prioritized replay "
           "(--replay-ranks R), the others act epsilon-greedily: Ape-X",
           "prioritized transitions to the replays, batches to the learner, priorities "
           "back, parameters to actors",
           serving=lambda cfg: ("learner", *("replay",) * cfg.replay_ranks),
           experience_role="actor", learner="replay",
           deciding=lambda cfg, size: list(range(1 + cfg.replay_ranks)),
           ledgers=("transitions", "lag", "delivery"), lagged=True, guarded=False,
           options=("replay_ranks", "train_intensity", "actor_refresh_steps",
                    "param_delivery", "refresh_every", "reply_progress")),
    Design("gorila", "mpirl.designs.gorila:run_gorila",
           "ranks 0..S-1 hold parameter shards (--servers S), the others learn n-step "
           "double DQN from a local replay or replay ranks (--gorila-replay): Gorila",
           "gradient shards up, parameter shards back, each shard on its own",
           serving=_gorila_serving, learner="replay",
           deciding=_gorila_deciding, ledgers=("gradients", "transitions"),
           options=("servers", "gorila_replay", "replay_ranks"),
           # cartpole_gorila.yaml's: the shared lr 1e-3 oscillated (DQN's), and two
           # pushes per rollout; experiments/bench_design_defaults.py measures them
           defaults=(("lr", 5e-4), ("update_repeat", 2))),
)}

#: the ``--mode`` names, in the order they are listed
MODES = tuple(DESIGNS)


def design(mode: str) -> Design:
    """The row of ``mode``; an unknown one raises KeyError naming the registered modes."""
    try:
        return DESIGNS[mode]
    except KeyError:
        raise KeyError(f"unknown mode {mode!r}; registered: {', '.join(MODES)}") from None


def modes(**where) -> tuple[str, ...]:
    """The modes whose rows have every attribute given, e.g. ``modes(lagged=True)``."""
    return tuple(name for name, d in DESIGNS.items()
                 if all(getattr(d, key) == value for key, value in where.items()))
