"""The learner's fields: losses, optimizer, network, the book's tricks."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .checks import at_least, choice, doc, in_range

ACTIVATIONS = ("tanh", "relu", "elu")


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
    update_repeat: int = doc("learn each batch this many times (a fresh gradient each time)",
                              default=1)


def check_learner(cfg, world_size: int) -> None:
    choice("activation", cfg.activation, ACTIVATIONS)
    for name in ("action_repeat", "update_repeat"):
        at_least(name, getattr(cfg, name), 1)
    in_range("lr", cfg.lr, 0.0, 1.0, low_open=True)
    in_range("gamma", cfg.gamma, 0.0, 1.0)
    in_range("gae_lambda", cfg.gae_lambda, 0.0, 1.0)
    in_range("clip_ratio", cfg.clip_ratio, 0.0, 1.0)
    for name in ("value_coef", "entropy_coef", "max_grad_norm"):
        at_least(name, getattr(cfg, name), 0.0)
    if not cfg.hidden or not all(type(h) is int and h > 0 for h in cfg.hidden):
        raise ConfigError(f"hidden={cfg.hidden!r}; allowed: a non-empty list of positive ints")
