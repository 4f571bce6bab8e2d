"""``Delay-v0``: a synthetic environment whose every step costs a chosen amount of time.

It stands in for a slow simulator (Learning to Run's OpenSim steps take ~10 ms with a
heavy tail) so that communication studies can run at any scale without OpenSim:

    mpirun -np 8 python -m mpirl.run --env Delay-v0 --env-arg cost_s=0.01 \\
        --env-arg dist=lognormal --env-arg tail=0.5 --env-arg obs_dim=41 --env-arg act_dim=18

Per-step cost (``info["sim_s"]`` reports what each step really took):

* ``dist``: ``fixed`` (every step ``cost_s``), ``lognormal`` (median ``cost_s``, log-space
  sigma ``tail``), ``pareto`` (minimum ``cost_s``, shape ``tail``: heavier as it drops
  towards 1; the mean is finite only above 1).
* ``busy``: ``sleep`` (the core is free meanwhile, like waiting on an external simulator
  or a GPU) or ``spin`` (burns the core, like OpenSim does).

The task is small but learnable, so learning curves mean something: observations follow
a random walk; a continuous action in ``[0, 1]^act_dim`` is rewarded for tracking
``(1 + tanh(obs))/2`` of the matching observation entries (reward in ``[-1, 0]``).
Episodes are truncated after ``episode_steps`` steps and never terminate.  With
``actions=K`` (K >= 2) the action space is ``Discrete(K)`` instead, for the value-based
designs (apex, gorila): action ``a`` sets every entry to ``a / (K - 1)``.
Draws (observations and costs) come from the env's own seeded generator.
"""

from __future__ import annotations

import time

import gymnasium
import numpy as np

DISTRIBUTIONS = ("fixed", "lognormal", "pareto")
BUSY = ("sleep", "spin")

MAX_COST_S = 3600.0

#: keyword -> (type, check, what is allowed), used by mpirl.parts.envs.check_env_args
KWARGS = {
    "obs_dim": (int, lambda v: 1 <= v <= 1_000_000, "an int in 1..1000000"),
    "act_dim": (int, lambda v: 1 <= v <= 1_000_000, "an int in 1..1000000"),
    "cost_s": (float, lambda v: 0.0 <= v <= 60.0, "seconds in [0, 60]"),
    "dist": (str, lambda v: v in DISTRIBUTIONS, "one of " + ", ".join(DISTRIBUTIONS)),
    # bounded so that a drawn cost stays a finite number of seconds (NaN fails both)
    "tail": (float, lambda v: 0.05 <= v <= 20.0, "a number in [0.05, 20]"),
    "busy": (str, lambda v: v in BUSY, "one of " + ", ".join(BUSY)),
    "episode_steps": (int, lambda v: v >= 1, "an int >= 1"),
    "actions": (int, lambda v: v == 0 or 2 <= v <= 1000, "0 (continuous) or an int in 2..1000"),
}


class DelayEnv(gymnasium.Env):
    metadata = {"render_modes": []}

    def __init__(self, obs_dim: int = 41, act_dim: int = 18, cost_s: float = 0.01,
                 dist: str = "fixed", tail: float = 0.5, busy: str = "sleep",
                 episode_steps: int = 1000, actions: int = 0) -> None:
        if dist not in DISTRIBUTIONS:
            raise ValueError(f"dist={dist!r}; allowed: {', '.join(DISTRIBUTIONS)}")
        if busy not in BUSY:
            raise ValueError(f"busy={busy!r}; allowed: {', '.join(BUSY)}")
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.cost_s, self.dist, self.tail, self.busy = cost_s, dist, tail, busy
        self.episode_steps = episode_steps
        self.observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.levels = None
        if actions:            # discrete: action a sets every entry to a / (actions - 1)
            self.action_space = gymnasium.spaces.Discrete(actions)
            self.levels = np.linspace(0.0, 1.0, actions, dtype=np.float32)
        else:
            self.action_space = gymnasium.spaces.Box(0.0, 1.0, (act_dim,), np.float32)
        self._track = np.arange(act_dim) % obs_dim     # the entry each action tracks
        self._obs = np.zeros(obs_dim, dtype=np.float32)
        self._t = 0

    def draw_cost(self) -> float:
        """Seconds the next step will cost (capped at an hour: a tail, not a hang)."""
        if self.dist == "fixed":
            return self.cost_s
        if self.dist == "lognormal":
            cost = self.cost_s * float(np.exp(self.tail * self.np_random.standard_normal()))
        else:
            cost = self.cost_s * float((1.0 - self.np_random.random()) ** (-1.0 / self.tail))
        return min(cost, MAX_COST_S)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._obs = self.np_random.standard_normal(self.obs_dim).astype(np.float32)
        self._t = 0
        return self._obs.copy(), {}

    def step(self, action):
        start = time.perf_counter()
        cost = self.draw_cost()
        if cost > 0:
            if self.busy == "sleep":
                time.sleep(cost)
            else:
                while time.perf_counter() - start < cost:
                    pass
        if self.levels is not None:
            action = np.full(self.act_dim, self.levels[int(action)], dtype=np.float32)
        target = 0.5 * (1.0 + np.tanh(self._obs[self._track]))
        reward = -float(np.mean((np.clip(action, 0.0, 1.0) - target) ** 2))
        noise = self.np_random.standard_normal(self.obs_dim).astype(np.float32)
        self._obs = (0.9 * self._obs + 0.3 * noise).astype(np.float32)
        self._t += 1
        truncated = self._t >= self.episode_steps
        return self._obs.copy(), reward, False, truncated, \
            {"sim_s": time.perf_counter() - start}
