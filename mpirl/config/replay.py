"""The value-based designs' fields: prioritized replay, n-step double DQN, sharded
parameter servers."""

from __future__ import annotations

from dataclasses import dataclass

from .. import registry
from ..errors import ConfigError
from .checks import at_least, choice, doc, in_range

GORILA_REPLAY = ("local", "service")


@dataclass
class ReplayFields:
    replay_ranks: int = doc("apex: replay ranks (1..R), each holding the transitions of its "
                             "actors (sharded by actor)", default=1)
    replay_capacity: int = doc("apex/gorila: transitions a replay holds (apex: over all "
                                "shards, split evenly); FIFO eviction", default=50_000)
    replay_alpha: float = doc("prioritized replay: priority exponent alpha (0 = uniform: "
                              "no priorities computed)", default=0.6)
    replay_beta: float = doc("prioritized replay: importance-sampling exponent beta at the "
                              "start", default=0.4)
    beta_anneal_steps: int = doc("learner updates over which beta anneals linearly to 1; "
                                  "0 = constant", default=0)
    replay_eps: float = doc("prioritized replay: epsilon added to |TD error|", default=1e-6)
    replay_batch: int = doc("apex/gorila: transitions per learner update", default=256)
    learning_starts: int = doc("apex/gorila/sync-replay: transitions stored (over all "
                                "replays) before learning starts; each replay's share must "
                                "fit what it holds", default=1000)
    train_intensity: float = doc(
        "apex: the most transitions sampled per transition inserted, per shard (RLlib's "
        "training_intensity); the shard holds the learner's request until it may sample; "
        "0 = no bound", default=0.0)
    n_step: int = doc("apex/gorila: n of the n-step returns", default=3)
    dueling: bool = doc("apex/gorila: dueling Q-network head", default=False)
    target_update: int = doc("apex/gorila: learner updates (gorila: a worker's pushes) "
                              "between target-network copies", default=100)
    actor_refresh_steps: int = doc("apex: env steps an actor takes between parameter "
                                    "refreshes (rounded up to whole rollouts)", default=400)
    apex_eps: float = doc("apex: per-actor epsilon base: actor i of N acts with "
                           "eps**(1 + alpha*i/(N-1))", default=0.4)
    apex_eps_alpha: float = doc("apex: per-actor epsilon exponent alpha", default=7.0)
    tau: float = doc("apex/gorila/sync-replay with SAC (Box actions): Polyak step of the target "
                      "critics after every update", default=0.005)
    init_alpha: float = doc("SAC: initial temperature (learnt towards the "
                             "target entropy)", default=1.0)
    target_entropy: float = doc("SAC: the temperature's target entropy; "
                                 "0 = -dim(action space)", default=0.0)
    sac_reward_scale: float = doc("SAC: rewards multiplied by this in the critics' target "
                                  "(the book's reward scaling for maximum-entropy learners: "
                                  "the entropy's weight relative to the reward)", default=1.0)
    servers: int = doc("gorila, async: parameter-server ranks (0..S-1) holding contiguous "
                        "shards of the flat parameter vector", default=1)
    gorila_replay: str = doc("gorila: 'local' (each actor-learner's own replay) or "
                              "'service' (--replay-ranks replay ranks after the servers, "
                              "as apex's)", default="local")


def check_replay(cfg, world_size: int) -> None:
    choice("gorila_replay", cfg.gorila_replay, GORILA_REPLAY)
    for name in ("replay_ranks", "replay_capacity", "replay_batch", "n_step", "target_update",
                 "actor_refresh_steps", "servers"):
        at_least(name, getattr(cfg, name), 1)
    for name in ("beta_anneal_steps", "learning_starts"):
        at_least(name, getattr(cfg, name), 0)
    for name in ("replay_alpha", "train_intensity", "apex_eps_alpha"):
        at_least(name, getattr(cfg, name), 0.0)
    in_range("replay_beta", cfg.replay_beta, 0.0, 1.0)
    in_range("replay_eps", cfg.replay_eps, 0.0, 1.0, low_open=True)
    in_range("apex_eps", cfg.apex_eps, 0.0, 1.0)
    design = registry.design(cfg.mode)
    in_range("tau", cfg.tau, 0.0, 1.0, low_open=True)
    in_range("init_alpha", cfg.init_alpha, 0.0, 1e6, low_open=True)
    in_range("sac_reward_scale", cfg.sac_reward_scale, 0.0, 1e6, low_open=True)
    if design.learner == "replay":
        shards = design.serving(cfg).count("replay") or 1
        if cfg.replay_capacity // shards < cfg.replay_batch:
            raise ConfigError(
                f"replay_capacity={cfg.replay_capacity} over {shards} replay shard(s) holds "
                f"{cfg.replay_capacity // shards} each, less than replay_batch="
                f"{cfg.replay_batch}; allowed: replay_capacity >= "
                f"{shards * cfg.replay_batch}")
        _check_warm_up(cfg, design.serving(cfg), world_size)
        _check_replay_learner(cfg)
    _check_servers(cfg, world_size)


def rank_warm_up(cfg, ranks: int) -> int:
    """Transitions each of ``ranks`` replay ranks stores before it answers a sample
    request: its share of ``--learning-starts`` (rounded up), at least a batch."""
    return max(cfg.replay_batch, -(-cfg.learning_starts // ranks))


def local_warm_up(cfg, workers: int) -> int:
    """Transitions a worker's own replay (one of ``workers``) stores before it is
    sampled: its share of ``--learning-starts`` (rounded down), at least a batch."""
    return max(cfg.replay_batch, cfg.learning_starts // workers)


def _check_warm_up(cfg, serving: tuple[str, ...], world_size: int) -> None:
    """Every replay must be able to hold its warm-up (:func:`rank_warm_up`,
    :func:`local_warm_up`): one that cannot would wait to the end of the run."""
    ranks, starts = serving.count("replay"), cfg.learning_starts
    if ranks:
        what, count, held = "replay rank(s)", ranks, cfg.replay_capacity // ranks
        need, most = rank_warm_up(cfg, ranks), ranks * held
    else:
        count = max(1, world_size - len(serving))
        what, held, need = "worker replay(s)", cfg.replay_capacity, local_warm_up(cfg, count)
        most = count * (held + 1) - 1
    if need > held:
        raise ConfigError(f"learning_starts={starts} over {count} {what} is {need} each, "
                          f"more than the {held} each holds (replay_capacity="
                          f"{cfg.replay_capacity}); allowed: learning_starts <= {most}")


#: each replay learner's own options and their defaults: given to the other learner,
#: they are refused
REPLAY_LEARNERS = {
    "Discrete": ("double DQN", {"dueling": False, "apex_eps": 0.4, "apex_eps_alpha": 7.0,
                                "target_update": 100}),
    "Box": ("SAC", {"tau": 0.005, "init_alpha": 1.0, "target_entropy": 0.0,
                    "sac_reward_scale": 1.0}),
}


def _check_replay_learner(cfg) -> None:
    """The action space selects the learner (Discrete: double DQN, Box: SAC); the other
    learner's options keep their defaults (unknown env ids: check_env says so)."""
    space = _action_space(cfg)
    if space is None:
        return
    if space not in REPLAY_LEARNERS:
        raise ConfigError(f"mode={cfg.mode!r} learns double DQN (Discrete actions) or SAC "
                          f"(Box actions); env={cfg.env!r} has a {space} action space; "
                          "allowed: an env with a Discrete or Box action space")
    learner, own = REPLAY_LEARNERS[space]
    for other, (other_learner, options) in REPLAY_LEARNERS.items():
        for name, default in options.items():
            if other != space and getattr(cfg, name) != default:
                raise ConfigError(
                    f"{name}={getattr(cfg, name)!r} is an option of {other_learner}; "
                    f"env={cfg.env!r} has a {space} action space, which selects "
                    f"{learner}; allowed: {learner}'s "
                    f"{', '.join('--' + n.replace('_', '-') for n in own)}")


def _action_space(cfg) -> str | None:
    """The name of the env's action space's class (None: not known here)."""
    import gymnasium

    from ..parts.envs import check_env_args   # registers L2Run-v0 and Delay-v0
    from .env import registered_id

    try:
        env_id = registered_id(cfg.env)
    except ConfigError:
        return None                                  # check_env says why
    if env_id == "L2Run-v0":
        return "Box"                                 # not built here: OpenSim is slow
    try:
        check_env_args(env_id, cfg.env_kwargs())
    except ValueError:
        return None                                  # check_env names the argument
    env = gymnasium.make(cfg.env, **cfg.env_kwargs())
    space = type(env.action_space).__name__
    env.close()
    return space


def _check_servers(cfg, world_size: int) -> None:
    design = registry.design(cfg.mode)
    if "servers" not in design.options:
        return
    if cfg.servers > 1 and cfg.servers >= world_size:   # one server: check_wiring says it
        raise ConfigError(f"servers={cfg.servers} with {world_size} ranks leaves no worker; "
                          f"allowed: 1..{max(1, world_size - 1)}")
    if design.checkpoints == "snapshots" and cfg.servers > 1 and cfg.resume:
        raise ConfigError(f"servers={cfg.servers} with resume: sharded servers take no "
                          "checkpoint snapshots yet, so there is nothing to resume from; "
                          "allowed: --servers 1")
    # --checkpoint-every with sharded servers: the run goes on without snapshots and says
    # so at start (the default of 100 must not stop a --servers 2 run)
