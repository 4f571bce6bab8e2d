"""Running statistics for PPO's normalizations ("The 37 implementation details of PPO",
details 5-7 of the continuous-control ones): observations scaled by their running mean
and standard deviation, rewards by the running standard deviation of the discounted
return.

:class:`Moments` is count, mean and M2 (the sum of squared deviations) in float64; two
of them merge exactly (Chan, Golub and LeVeque 1979), so statistics collected on several
ranks are combined into the ones a single process would have had, up to rounding, and
every rank that merges the same parts in the same order holds the same bytes.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

#: added to the variance before the square root (gymnasium's wrappers use the same)
EPSILON = 1e-8
#: normalized observations and rewards are clipped to +- this (CleanRL's wrappers)
CLIP = 10.0


class Moments:
    """Count, mean and M2 of a stream of vectors of ``shape`` (float64)."""

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.count = 0.0
        self.mean = np.zeros(shape)
        self.m2 = np.zeros(shape)

    @classmethod
    def of(cls, values: np.ndarray) -> "Moments":
        """The moments of ``values`` (samples along the first axis)."""
        values = np.asarray(values, dtype=np.float64)
        out = cls(values.shape[1:])
        out.count = float(values.shape[0])
        if out.count:
            out.mean = values.mean(axis=0)
            out.m2 = ((values - out.mean) ** 2).sum(axis=0)
        return out

    @property
    def var(self) -> np.ndarray:
        """The population variance (1 before any sample)."""
        return self.m2 / self.count if self.count else np.ones_like(self.mean)

    def merge(self, other: "Moments") -> None:
        """Add ``other``'s samples (exact: Chan et al.'s pairwise update)."""
        if not other.count:
            return
        total = self.count + other.count
        delta = other.mean - self.mean
        self.mean = self.mean + delta * (other.count / total)
        self.m2 = self.m2 + other.m2 + delta ** 2 * (self.count * other.count / total)
        self.count = total

    # one flat float64 record: what travels between ranks, and what a checkpoint holds
    def pack(self) -> np.ndarray:
        return np.concatenate([[self.count], self.mean.ravel(), self.m2.ravel()])

    @classmethod
    def unpack(cls, record: np.ndarray, shape: tuple[int, ...]) -> "Moments":
        out = cls(shape)
        n = int(np.prod(shape, dtype=np.int64))
        out.count = float(record[0])
        out.mean = np.array(record[1:1 + n]).reshape(shape)
        out.m2 = np.array(record[1 + n:1 + 2 * n]).reshape(shape)
        return out


class ObsNormalizer(nn.Module):
    """The network's first step: ``clip((obs - mean) / sqrt(var + eps), +-10)`` with the
    statistics last :meth:`load`\\ ed (buffers: they are no parameters, and no gradient
    or exchange sees them)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("std", torch.ones(shape))

    def load(self, moments: Moments) -> None:
        self.mean.copy_(torch.from_numpy(moments.mean))
        self.std.copy_(torch.from_numpy(np.sqrt(moments.var + EPSILON)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return ((obs - self.mean) / self.std).clamp(-CLIP, CLIP)


class RewardNormalizer:
    """Rewards divided by the running standard deviation of each env's discounted
    return ``G <- gamma G (1 - done) + r`` (gymnasium's ``NormalizeReward``, as CleanRL
    uses it), then clipped to +-10; the statistics are updated step by step."""

    def __init__(self, num_envs: int, gamma: float) -> None:
        self.gamma = gamma
        self.returns = np.zeros(num_envs)
        self.live = np.ones(num_envs)     # each env's episode goes on after the last batch
        self.moments = Moments()

    def __call__(self, rewards: torch.Tensor, dones: torch.Tensor) -> torch.Tensor:
        """``rewards`` ``[T, E]`` (``dones`` 1 where the episode ended at that step),
        scaled."""
        raw, ended = rewards.double().numpy(), dones.double().numpy()
        out = np.empty_like(raw)
        for t in range(raw.shape[0]):
            # an episode that ended at t - 1 starts afresh at t (the env reset then)
            live = 1.0 - ended[t - 1] if t else self.live
            self.returns = self.returns * self.gamma * live + raw[t]
            self.moments.merge(Moments.of(self.returns))
            out[t] = raw[t] / np.sqrt(self.moments.var + EPSILON)
        self.live = 1.0 - ended[-1]
        return torch.from_numpy(np.clip(out, -CLIP, CLIP)).to(rewards.dtype)

    def state(self) -> dict:
        return {"returns": self.returns.copy(), "moments": self.moments.pack(),
                "live": self.live.copy()}

    def load_state(self, state: dict) -> None:
        self.returns = np.array(state["returns"])
        self.moments = Moments.unpack(np.asarray(state["moments"]), ())
        self.live = np.array(state["live"])
