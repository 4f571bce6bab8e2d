"""Your own env and your own network, end to end (docs/api.md).

``Corridor-v0``: walk right along a corridor of ``length`` cells to its end (+1), each step
costing 0.01; the observation is the position and the distance left, scaled to [0, 1];
two actions, left and right.  Importing this module registers it with gymnasium, which
is what ``--env custom_env:Corridor-v0`` (gymnasium's ``MODULE:ENV_ID``) makes every rank
do.

``make_net``: a network with one shared trunk and two heads (the built-in MLP keeps
policy and value apart), the factory ``--model custom_env:make_net`` names.  mpirl
calls it with the env's spaces and the run's configuration and puts its parameters
into the replica's one flat buffer.

    python experiments/train_custom.py --ranks 3        # through mpirl.train
    mpiexec -n 3 python -m mpirl.run --env custom_env:Corridor-v0 \\
        --model custom_env:make_net        # the same from the shell, run in experiments/
"""

from __future__ import annotations

import gymnasium
import numpy as np


class Corridor(gymnasium.Env):
    """A corridor of ``length`` cells; the episode ends at its right end or after
    ``4 * length`` steps (truncated)."""

    metadata = {"render_modes": []}

    def __init__(self, length: int = 8) -> None:
        self.length = length
        self.observation_space = gymnasium.spaces.Box(0.0, 1.0, (2,), np.float32)
        self.action_space = gymnasium.spaces.Discrete(2)
        self.pos, self.steps = 0, 0

    def _obs(self) -> np.ndarray:
        return np.array([self.pos / self.length, 1.0 - self.pos / self.length], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.steps = 0, 0
        return self._obs(), {}

    def step(self, action):
        self.pos = min(self.length, max(0, self.pos + (1 if int(action) == 1 else -1)))
        self.steps += 1
        done = self.pos == self.length
        reward = 1.0 if done else -0.01
        return self._obs(), reward, done, self.steps >= 4 * self.length, {}


if "Corridor-v0" not in gymnasium.registry:
    gymnasium.register("Corridor-v0", entry_point=Corridor)


def make_net(obs_space, act_space, cfg):
    """A shared trunk of ``cfg.hidden[0]`` tanh units, a policy head and a value head."""
    import torch
    from torch import nn

    class SharedTrunk(nn.Module):
        def __init__(self, obs_dim: int, n_actions: int, width: int) -> None:
            super().__init__()
            self.trunk = nn.Sequential(nn.Linear(obs_dim, width), nn.Tanh())
            self.policy = nn.Linear(width, n_actions)
            self.value = nn.Linear(width, 1)

        def forward(self, obs: torch.Tensor):
            h = self.trunk(obs)
            return self.policy(h), self.value(h)

    return SharedTrunk(int(np.prod(obs_space.shape)), int(act_space.n), cfg.hidden[0])


def bad_shapes(obs_space, act_space, cfg):
    """A factory whose policy head is one action too wide: refused at start."""
    import torch
    from torch import nn

    class TooWide(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(int(np.prod(obs_space.shape)), int(act_space.n) + 2)

        def forward(self, obs: torch.Tensor):
            out = self.body(obs)
            return out[..., :-1], out[..., -1]

    return TooWide()
