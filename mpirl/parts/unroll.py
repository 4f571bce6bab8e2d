"""Unrolls: what IMPALA ships and SEED's learner assembles, as one fixed-shape record.

An unroll is ``T`` steps of an actor's ``E`` envs: the ``T + 1`` observations (the last
one bootstraps), actions, the behaviour policy's log-probabilities, rewards, episode
ends, the value of a time limit's cut-off observation (``boot``, 0 elsewhere) and a few
numbers (:data:`UNROLL_META`), among them the parameter version that produced the actions.
:class:`UnrollLayout` makes that one numpy structured record, contiguous, of a size
known to both sides before the first one travels: sent as bytes, never pickled.  A
learner batches records along the env axis into :class:`Unrolls` for V-trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium
import numpy as np
import torch

from .records import Fields

#: the numbers an unroll carries besides its arrays (float64)
UNROLL_META = Fields("version", "index", "env_steps", "episodes", "return_sum",
                     "recent_mean", "wants_params", "stop", "rtt_s", "busy_s", "wait_share")


@dataclass
class Unrolls:
    """Several unrolls side by side: ``[T, B]`` with ``B`` = unrolls x envs."""

    obs: torch.Tensor        # [T+1, B, obs...]
    actions: torch.Tensor    # [T, B] or [T, B, act_dim]
    logp: torch.Tensor       # [T, B] behaviour log-probabilities
    rewards: torch.Tensor    # [T, B] reward (+ gamma * boot where a time limit cut)
    discounts: torch.Tensor  # [T, B] gamma, 0 where the episode ended
    versions: np.ndarray     # [unrolls] the parameter version of each


class UnrollLayout:
    """The record of one unroll of ``steps`` steps of ``num_envs`` envs."""

    def __init__(self, steps: int, num_envs: int, obs_space: gymnasium.Space,
                 act_space: gymnasium.Space) -> None:
        self.steps, self.num_envs = steps, num_envs
        obs_shape = tuple(int(d) for d in obs_space.shape)
        if isinstance(act_space, gymnasium.spaces.Discrete):
            act = ("actions", "i8", (steps, num_envs))
        else:
            act = ("actions", "f4", (steps, num_envs, *act_space.shape))
        per_step = (steps, num_envs)
        self.dtype = np.dtype([("meta", "f8", (len(UNROLL_META),)),
                               ("obs", "f4", (steps + 1, num_envs, *obs_shape)), act,
                               ("logp", "f4", per_step), ("rewards", "f4", per_step),
                               ("dones", "f4", per_step), ("boot", "f4", per_step)])

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize

    def empty(self) -> np.ndarray:
        """One zeroed record (an array of shape ``(1,)``, contiguous)."""
        return np.zeros(1, dtype=self.dtype)

    def view(self, raw: np.ndarray) -> np.ndarray:
        """Bytes received as a record (no copy)."""
        return raw.view(self.dtype)

    def pack(self, record: np.ndarray, rollout, last_obs: torch.Tensor) -> None:
        """Copy an actor's :class:`~mpirl.parts.actor.Rollout` into ``record``."""
        r = record[0]
        r["obs"][:-1] = rollout.obs.numpy()
        r["obs"][-1] = last_obs.numpy()
        r["actions"] = rollout.actions.numpy()
        for name in ("logp", "rewards", "dones", "boot"):
            r[name] = getattr(rollout, name).numpy()


class UnrollAssembler:
    """SEED's learner side: unrolls assembled from one request per env step per client.

    Request k of a client carries the observation its envs are at and the reward and
    episode end of step k-1; the action for step k is chosen on it.  So the reward of an
    unroll's last step, and its bootstrap observation, come with the first request of the
    next unroll, which starts on that same observation (unrolls overlap by one
    observation, as seed_rl's do).  An unroll's version is the parameter version of its
    first action (versions only grow, so its lag is the largest of its steps').  A time
    limit counts as an episode end here (no bootstrap value: the actor holds no network).
    Episodes are tracked per client from the rewards, for progress and the target."""

    def __init__(self, layout: UnrollLayout, clients: list[int], env_steps_per_step: int
                 ) -> None:
        self.layout = layout
        self.env_steps_per_step = env_steps_per_step      # num_envs x action_repeat
        self.records = {c: layout.empty() for c in clients}
        self.filled = {c: 0 for c in clients}             # steps with an action so far
        self.made = {c: 0 for c in clients}               # unrolls completed
        n = layout.num_envs
        self.running = {c: (np.zeros(n), np.zeros(n, dtype=np.int64)) for c in clients}
        self.finished: dict[int, list[tuple[float, int]]] = {c: [] for c in clients}

    def step(self, client: int, obs: np.ndarray, reward: np.ndarray, done: np.ndarray,
             first: bool, action: np.ndarray, logp: np.ndarray, version: int
             ) -> np.ndarray | None:
        """Take one request's data and the action chosen for it; the completed unroll
        (a copy), when this request completed one."""
        r, t, out = self.records[client][0], self.filled[client], None
        if not first:
            r["rewards"][t - 1], r["dones"][t - 1] = reward, done
            self._track(client, reward, done)
            if t == self.layout.steps:
                r["obs"][t] = obs
                out = self.records[client].copy()
                t = 0
        if t == 0:
            self.made[client] += 1
            r["meta"][:] = 0.0
            r["meta"][UNROLL_META["version"]] = version
            r["meta"][UNROLL_META["index"]] = self.made[client]
            r["meta"][UNROLL_META["env_steps"]] = self.layout.steps * self.env_steps_per_step
        r["obs"][t], r["actions"][t], r["logp"][t] = obs, action, logp
        self.filled[client] = t + 1
        return out

    def _track(self, client: int, reward: np.ndarray, done: np.ndarray) -> None:
        returns, lengths = self.running[client]
        returns += reward
        lengths += 1
        for i in np.flatnonzero(done):
            self.finished[client].append((float(returns[i]), int(lengths[i])))
            returns[i], lengths[i] = 0.0, 0

    def drain_episodes(self, client: int) -> list[tuple[float, int]]:
        done, self.finished[client] = self.finished[client], []
        return done


def batch_unrolls(records: list[np.ndarray], gamma: float) -> Unrolls:
    """Records side by side along the env axis, as the tensors V-trace takes."""
    def cat(name):
        return torch.from_numpy(np.concatenate([r[0][name] for r in records], axis=1))

    dones = cat("dones")
    return Unrolls(obs=cat("obs"), actions=cat("actions"), logp=cat("logp"),
                   rewards=cat("rewards") + gamma * cat("boot"),
                   discounts=gamma * (1.0 - dones),
                   versions=np.array([r[0]["meta"][UNROLL_META["version"]] for r in records],
                                     dtype=np.int64))
