"""Rollouts and the advantage actor-critic loss: what one rank learns from its envs."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium
import numpy as np
import torch

from .model import ActorCritic


class ActionRepeat(gymnasium.Wrapper):
    """Apply each action ``k`` times, summing the rewards (one of the book's five tricks);
    a simulator's per-step time (``info["sim_s"]``) is summed too."""

    def __init__(self, env: gymnasium.Env, k: int) -> None:
        super().__init__(env)
        self.k = k

    def step(self, action):
        total, sim_s = 0.0, 0.0
        for _ in range(self.k):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            sim_s += info.get("sim_s", 0.0)
            if terminated or truncated:
                break
        if "sim_s" in info:
            info = {**info, "sim_s": sim_s}
        return obs, total, terminated, truncated, info


def make_envs(env_id: str, num_envs: int, seed: int, action_repeat: int = 1,
              kwargs: dict | None = None) -> gymnasium.vector.SyncVectorEnv:
    """``num_envs`` copies of ``env_id`` that reset themselves in the step that ends them."""
    from . import envs as own_envs  # noqa: F401  (registers mpirl's own ids)

    def make():
        env = gymnasium.make(env_id, **(kwargs or {}))
        return ActionRepeat(env, action_repeat) if action_repeat > 1 else env

    envs = gymnasium.vector.SyncVectorEnv(
        [make for _ in range(num_envs)],
        autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)
    envs.action_space.seed(seed)
    return envs


@dataclass
class Batch:
    obs: torch.Tensor        # [T*E, obs_dim]
    actions: torch.Tensor    # [T*E] or [T*E, act_dim]
    returns: torch.Tensor    # [T*E]
    advantages: torch.Tensor  # [T*E]
    logp_old: torch.Tensor   # [T*E] log-probability of the action when it was taken


class Roller:
    """Steps a vector of envs with the current policy and keeps episode statistics."""

    def __init__(self, envs: gymnasium.vector.VectorEnv, gamma: float, gae_lambda: float,
                 reward_scale: bool = False) -> None:
        self.envs, self.gamma, self.gae_lambda = envs, gamma, gae_lambda
        self.reward_scale = reward_scale
        self.obs: torch.Tensor | None = None   # set by start()
        self._running_return = np.zeros(envs.num_envs)
        self._running_length = np.zeros(envs.num_envs, dtype=np.int64)
        self.finished: list[tuple[float, int]] = []   # (return, length) since last drain
        self.sim_times: list[np.ndarray] = []   # per step: each env's info["sim_s"], if any
        box = envs.single_action_space
        self._low = getattr(box, "low", None)
        self._high = getattr(box, "high", None)

    def start(self, seed: int) -> None:
        obs, _ = self.envs.reset(seed=[seed + i for i in range(self.envs.num_envs)])
        self.obs = torch.as_tensor(obs, dtype=torch.float32)

    def state(self) -> dict:
        """What a checkpoint needs to continue the rollout exactly (tensors only)."""
        return {"obs": self.obs.clone(),
                "running_return": torch.as_tensor(self._running_return),
                "running_length": torch.as_tensor(self._running_length)}

    def load_state(self, state: dict) -> None:
        self.obs = state["obs"].clone()
        self._running_return = state["running_return"].numpy().copy()
        self._running_length = state["running_length"].numpy().copy()

    def drain_episodes(self) -> list[tuple[float, int]]:
        done, self.finished = self.finished, []
        return done

    def drain_sim_times(self) -> np.ndarray:
        """Seconds each env step took inside the simulator since the last drain, as an
        array ``[steps, num_envs]`` (empty when the env does not report ``sim_s``)."""
        times, self.sim_times = self.sim_times, []
        return np.stack(times) if times else np.zeros((0, self.envs.num_envs))

    @torch.no_grad()
    def collect(self, model: ActorCritic, steps: int, timer) -> Batch:
        """Run ``steps`` steps in every env; returns the batch with GAE advantages."""
        n = self.envs.num_envs
        obs_buf = torch.empty((steps, n, *self.obs.shape[1:]))
        act_buf = []
        rew_buf, boot_buf, done_buf, val_buf, logp_buf = (torch.zeros(steps, n) for _ in range(5))
        for t in range(steps):
            with timer("forward_s"):
                dist, value = model(self.obs)
                action = dist.sample()
                logp_buf[t] = dist.log_prob(action)
            env_action = action.numpy()
            if not model.discrete:
                env_action = np.clip(env_action, self._low, self._high)
            with timer("env_s"):
                next_obs, reward, terminated, truncated, info = self.envs.step(env_action)
            self._track_sim_time(info)
            reward = np.asarray(reward, dtype=np.float64)
            self._track_episodes(reward, terminated | truncated)
            if truncated.any():   # a time limit is not a terminal state: bootstrap from it
                final = np.stack([info["final_obs"][i] for i in np.flatnonzero(truncated)])
                with timer("forward_s"):
                    boot = model.value(torch.as_tensor(final, dtype=torch.float32)).squeeze(-1)
                boot_buf[t, torch.as_tensor(truncated)] = self.gamma * boot
            obs_buf[t], val_buf[t] = self.obs, value
            act_buf.append(action)
            rew_buf[t] = torch.as_tensor(reward)
            done_buf[t] = torch.as_tensor(terminated | truncated, dtype=torch.float32)
            self.obs = torch.as_tensor(next_obs, dtype=torch.float32)
        with timer("forward_s"):
            last_value = model.value(self.obs).squeeze(-1)
        if self.reward_scale:   # the book's trick: rewards divided by the batch's std
            rew_buf /= rew_buf.std() + 1e-8
        adv = self._gae(rew_buf + boot_buf, val_buf, done_buf, last_value)
        actions = torch.stack(act_buf)
        return Batch(obs=obs_buf.flatten(0, 1), actions=actions.flatten(0, 1),
                     returns=(adv + val_buf).flatten(), advantages=adv.flatten(),
                     logp_old=logp_buf.flatten())

    def _gae(self, rewards, values, dones, last_value) -> torch.Tensor:
        adv = torch.zeros_like(rewards)
        running = torch.zeros_like(last_value)
        next_value = last_value
        for t in reversed(range(rewards.shape[0])):
            live = 1.0 - dones[t]
            delta = rewards[t] + self.gamma * next_value * live - values[t]
            running = delta + self.gamma * self.gae_lambda * live * running
            adv[t] = running
            next_value = values[t]
        return adv

    def _track_sim_time(self, info: dict) -> None:
        """Keep each env's ``sim_s`` of this step; an env whose episode ended in it (and
        reset at once) reports its step in ``final_info``."""
        final = info.get("final_info", {})
        if "sim_s" not in info and "sim_s" not in final:
            return
        step = np.zeros(self.envs.num_envs)
        for source in (info, final):
            if "sim_s" in source:
                mask = source["_sim_s"]
                step[mask] = np.asarray(source["sim_s"], dtype=np.float64)[mask]
        self.sim_times.append(step)

    def _track_episodes(self, reward: np.ndarray, done: np.ndarray) -> None:
        self._running_return += reward
        self._running_length += 1
        for i in np.flatnonzero(done):
            self.finished.append((float(self._running_return[i]), int(self._running_length[i])))
            self._running_return[i] = 0.0
            self._running_length[i] = 0


def actor_critic_loss(model: ActorCritic, batch: Batch, value_coef: float,
                      entropy_coef: float, clip_ratio: float = 0.0):
    """Policy-gradient loss with advantages, value regression, entropy bonus.

    ``clip_ratio`` 0 gives A2C's ``-logp * A``; above 0, PPO's clipped surrogate
    ``-min(r A, clip(r, 1-e, 1+e) A)`` with ``r = exp(logp - logp_old)``, the objective of
    DPPO (Heess et al. 2017), whose repeated updates on one batch (``update_repeat``)
    it keeps close to the policy that collected it."""
    dist, value = model(batch.obs)
    logp = dist.log_prob(batch.actions)
    if clip_ratio > 0:
        ratio = torch.exp(logp - batch.logp_old)
        clipped = torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
        policy_loss = -torch.min(ratio * batch.advantages, clipped * batch.advantages).mean()
    else:
        policy_loss = -(logp * batch.advantages).mean()
    value_loss = 0.5 * (batch.returns - value).pow(2).mean()
    entropy = dist.entropy().mean()
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy
    return loss, {"policy_loss": policy_loss.item(), "value_loss": value_loss.item(),
                  "entropy": entropy.item()}
