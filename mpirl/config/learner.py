"""The learner's fields: losses, optimizer, network, the book's tricks."""

from __future__ import annotations

from dataclasses import dataclass

from .. import registry
from ..errors import ConfigError
from .checks import at_least, choice, doc, in_range

ACTIVATIONS = ("tanh", "relu", "elu")
#: learner options a design takes only if its registry row lists them (their value
#: when not given): they need the design's loop (minibatch exchanges, merged statistics,
#: the budget's schedule) or its learner's batches
DESIGN_OPTIONS = {"minibatches": 1, "obs_norm": False, "anneal_lr": False,
                  "norm_adv": False, "reward_norm": False, "clip_vloss": False,
                  "reward_scale": False}


@dataclass
class LearnerFields:
    lr: float = doc("Adam learning rate", default=1e-3)
    gamma: float = doc("discount factor", default=0.99)
    gae_lambda: float = doc("GAE lambda; 1.0 gives plain n-step returns", default=0.95)
    value_coef: float = doc("weight of the value loss", default=0.5)
    entropy_coef: float = doc("weight of the entropy bonus", default=0.01)
    clip_ratio: float = doc("PPO clipped objective with this epsilon (DPPO; pair it with "
                             "--update-repeat); 0 = plain advantage actor-critic",
                             default=0.0)
    max_grad_norm: float = doc("clip the averaged gradient to this norm; 0 disables",
                                default=0.5)
    hidden: list = doc("hidden layer widths of the actor-critic MLP",
                        default_factory=lambda: [64, 64])
    activation: str = doc("hidden activation: tanh, relu or elu", default="tanh")
    layer_norm: bool = doc("layer normalisation after every hidden layer", default=False)
    reward_scale: bool = doc("divide each batch's rewards by their standard deviation",
                              default=False)
    action_repeat: int = doc("apply each action this many times (rewards summed)", default=1)
    update_repeat: int = doc("learn each batch this many times (PPO's epochs; a fresh "
                              "gradient each time)", default=1)
    # PPO as CleanRL's ppo_continuous_action defines it (docs/learning.md); off by default,
    # so that earlier configurations keep their numerics
    minibatches: int = doc("split each rank's batch into this many shuffled minibatches "
                            "per pass, one update each; in sync mode every minibatch's "
                            "gradient goes through the topology (DD-PPO)", default=1)
    norm_adv: bool = doc("normalize the advantages of every minibatch (mean 0, std 1)",
                          default=False)
    obs_norm: bool = doc("normalize observations by their running mean and std (clipped "
                          "to +-10); in sync mode the statistics are merged over every "
                          "rank after each rollout; in impala, seed and ga3c the learners "
                          "own them (merged over the learners after each update), in async "
                          "and quorum the server (merged from each push), and they travel "
                          "with the parameters", default=False)
    reward_norm: bool = doc("divide rewards by the running std of the discounted return "
                             "(clipped to +-10)", default=False)
    anneal_lr: bool = doc("anneal the learning rate linearly to 0 over the budget",
                           default=False)
    clip_vloss: bool = doc("clip the value loss around the old values by --clip-ratio",
                            default=False)
    init_log_std: float = doc("initial log std of a Box policy (state-independent)",
                               default=-0.5)
    adam_eps: float = doc("Adam's epsilon (CleanRL's PPO: 1e-5)", default=1e-8)
    model: str = doc(
        "your own network instead of the MLP: MODULE:FUNCTION, called as FUNCTION(obs_space, "
        "act_space, cfg) -> torch.nn.Module whose forward(obs batch) returns (policy "
        "logits or action means, values); the actor-critic designs only; checked at start "
        "(docs/api.md)", default="")


def check_learner(cfg, world_size: int) -> None:
    choice("activation", cfg.activation, ACTIVATIONS)
    design = registry.design(cfg.mode)
    for name, off in DESIGN_OPTIONS.items():
        if getattr(cfg, name) != off and name not in design.options:
            takers = [d.name for d in registry.DESIGNS.values() if name in d.options]
            raise ConfigError(f"{name}={getattr(cfg, name)!r} is not taken by "
                              f"mode={cfg.mode!r}; allowed with mode {', '.join(takers)}")
    for name in ("action_repeat", "update_repeat", "minibatches"):
        at_least(name, getattr(cfg, name), 1)
    batch = cfg.rollout_steps * cfg.num_envs
    if batch % cfg.minibatches:
        raise ConfigError(f"minibatches={cfg.minibatches} does not divide a rank's batch of "
                          f"{batch} steps (rollout_steps x num_envs); allowed: a divisor "
                          f"of {batch}")
    in_range("init_log_std", cfg.init_log_std, -5.0, 2.0)
    in_range("adam_eps", cfg.adam_eps, 0.0, 1.0, low_open=True)
    if cfg.clip_vloss and cfg.clip_ratio == 0:
        raise ConfigError("clip_vloss=True clips by --clip-ratio, which is 0; allowed: "
                          "--clip-ratio above 0 with it (0.2 is CleanRL's)")
    if cfg.obs_norm and cfg.servers > 1:
        raise ConfigError(f"obs_norm=True with servers={cfg.servers}: sharded servers hold "
                          "no whole statistics to send back; allowed: --servers 1 with it")
    if cfg.reward_norm and cfg.reward_scale:
        raise ConfigError("reward_norm=True and reward_scale=True both scale the rewards; "
                          "allowed: one of them")
    in_range("lr", cfg.lr, 0.0, 1.0, low_open=True)
    in_range("gamma", cfg.gamma, 0.0, 1.0)
    in_range("gae_lambda", cfg.gae_lambda, 0.0, 1.0)
    in_range("clip_ratio", cfg.clip_ratio, 0.0, 1.0)
    for name in ("value_coef", "entropy_coef", "max_grad_norm"):
        at_least(name, getattr(cfg, name), 0.0)
    if not cfg.hidden or not all(type(h) is int and h > 0 for h in cfg.hidden):
        raise ConfigError(f"hidden={cfg.hidden!r}; allowed: a non-empty list of positive ints")


def check_model(cfg, world_size: int) -> None:
    """``--model``: an actor-critic design, and a factory whose network fits the env
    (after check_env: it builds the env to learn its spaces)."""
    if not cfg.model:
        return
    design = registry.design(cfg.mode)
    if design.learner != "actor-critic":
        takers = [d.name for d in registry.DESIGNS.values() if d.learner == "actor-critic"]
        raise ConfigError(f"model={cfg.model!r} is not taken by mode={cfg.mode!r} (its "
                          f"{design.learner} learner builds its own networks); allowed "
                          f"with mode {', '.join(takers)}")
    from ..parts.learner.custom import check_model as check   # torch: only with --model

    try:
        check(cfg)
    except ValueError as err:
        raise ConfigError(str(err)) from None
