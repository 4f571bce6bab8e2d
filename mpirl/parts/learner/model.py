"""The actor-critic MLP every rank holds a replica of."""

from __future__ import annotations

import gymnasium
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Independent, Normal

from .normalize import ObsNormalizer

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}


def mlp(sizes_in: int, hidden: list[int], out: int, activation: str, layer_norm: bool,
        out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = sizes_in
    for h in hidden:
        linear = nn.Linear(width, h)
        nn.init.orthogonal_(linear.weight, gain=np.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers.append(linear)
        if layer_norm:
            layers.append(nn.LayerNorm(h))
        layers.append(_ACTIVATIONS[activation]())
        width = h
    head = nn.Linear(width, out)
    nn.init.orthogonal_(head.weight, gain=out_gain)
    nn.init.zeros_(head.bias)
    layers.append(head)
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Separate policy and value MLPs; categorical or diagonal-Gaussian policy, whose
    log standard deviation is a parameter of its own (state-independent), starting at
    ``init_log_std``.  With ``obs_norm`` both networks first normalize the observation
    (one :class:`ObsNormalizer`, whose statistics the learner loads)."""

    def __init__(self, obs_space: gymnasium.Space, act_space: gymnasium.Space,
                 hidden: list[int], activation: str = "tanh", layer_norm: bool = False,
                 init_log_std: float = -0.5, obs_norm: bool = False) -> None:
        super().__init__()
        obs_dim = int(np.prod(obs_space.shape))
        self.discrete = isinstance(act_space, gymnasium.spaces.Discrete)
        if self.discrete:
            act_out = int(act_space.n)
        elif isinstance(act_space, gymnasium.spaces.Box):
            act_out = int(np.prod(act_space.shape))
            self.log_std = nn.Parameter(torch.full((act_out,), float(init_log_std)))
        else:
            raise ValueError(f"action space {act_space} is not supported; "
                             "allowed: Discrete or Box")
        self.policy = mlp(obs_dim, hidden, act_out, activation, layer_norm, out_gain=0.01)
        self.value = mlp(obs_dim, hidden, 1, activation, layer_norm, out_gain=1.0)
        self.obs_norm = ObsNormalizer((obs_dim,)) if obs_norm else None
        if obs_norm:              # no parameters: the flat buffer's layout is unchanged
            self.policy = nn.Sequential(self.obs_norm, *self.policy)
            self.value = nn.Sequential(self.obs_norm, *self.value)

    def dist(self, obs: torch.Tensor):
        out = self.policy(obs)
        if self.discrete:
            return Categorical(logits=out)
        return Independent(Normal(out, self.log_std.exp()), 1)

    def forward(self, obs: torch.Tensor):
        return self.dist(obs), self.value(obs).squeeze(-1)
