"""The actor part: steps a rank's envs with whatever policy it is handed.

A policy is anything with ``act(obs) -> (action, logp, value)`` and
``value(obs) -> value`` over a batch of observations (one per env); it may also have
``observe(reward, done)``, told what each step gave (what travels with SEED's next
request), and ``phase``, the timer phase its calls are logged under (``forward_s``
unless it says otherwise).  :class:`ModelPolicy` is a rank's own replica; a design that
runs inference elsewhere hands the actor a policy whose answers come back from another
rank (:class:`mpirl.kit.inference.RemotePolicy`).  The actor keeps
what an episode leaves behind (returns, lengths, simulator step times) and the state
that lets a checkpoint continue its rollout exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import gymnasium
import numpy as np
import torch

from .envs import env_state, restore_env_state


@dataclass
class Rollout:
    """``T`` steps of ``E`` envs, as the actor saw them (what IMPALA ships whole)."""

    obs: torch.Tensor         # [T, E, obs...] the observation each action was chosen on
    actions: torch.Tensor     # [T, E] or [T, E, act_dim]
    logp: torch.Tensor        # [T, E] behaviour log-probability of each action
    values: torch.Tensor      # [T, E] the policy's value estimate of each observation
    rewards: torch.Tensor     # [T, E]
    dones: torch.Tensor       # [T, E] 1 where the episode ended (and the env reset)
    boot: torch.Tensor        # [T, E] value of the final observation where a time limit
                              # cut the episode (it is not over there), else 0
    last_value: torch.Tensor  # [E] value of the observation after the last step


class ModelPolicy:
    """A local network as the actor's policy (``model(obs) -> (distribution, value)``).
    Actions are sampled with torch's global generator."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def act(self, obs: torch.Tensor):
        dist, value = self.model(obs)
        action = dist.sample()
        return action, dist.log_prob(action), value

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.model.value(obs).squeeze(-1)


class Actor:
    """A vector of envs and the state of the rollout through them.

    ``seed`` seeds torch's global generator (the actions this rank samples) and the
    envs' first reset; ``slowdown`` > 1 makes this actor a straggler: after each rollout
    it idles ``slowdown - 1`` times as long as the rollout took (``--straggler``)."""

    def __init__(self, envs: gymnasium.vector.VectorEnv, seed: int,
                 slowdown: float = 1.0) -> None:
        self.envs = envs
        self.seed = seed
        self.slowdown = slowdown
        self.rollouts = 0                       # collected so far (a resume's reseed)
        self.obs: torch.Tensor | None = None
        self._running_return = np.zeros(envs.num_envs)
        self._running_length = np.zeros(envs.num_envs, dtype=np.int64)
        self.finished: list[tuple[float, int]] = []   # (return, length) since last drain
        self.sim_times: list[np.ndarray] = []   # per step: each env's info["sim_s"], if any
        box = envs.single_action_space
        self._clip = (box.low, box.high) if isinstance(box, gymnasium.spaces.Box) else None
        torch.manual_seed(seed)                 # each rank samples its own actions
        self.start(seed)

    def start(self, seed: int) -> None:
        """Reset every env (env i with ``seed + i``)."""
        obs, _ = self.envs.reset(seed=[seed + i for i in range(self.envs.num_envs)])
        self.obs = torch.as_tensor(obs, dtype=torch.float32)

    @torch.no_grad()
    def collect(self, policy, steps: int, timer) -> Rollout:
        """Run ``steps`` steps in every env with ``policy``."""
        started = time.perf_counter()
        n = self.envs.num_envs
        obs_buf = torch.empty((steps, n, *self.obs.shape[1:]))
        act_buf = []
        rew_buf, boot_buf, done_buf, val_buf, logp_buf = (torch.zeros(steps, n) for _ in range(5))
        phase, observe = getattr(policy, "phase", "forward_s"), getattr(policy, "observe", None)
        for t in range(steps):
            with timer(phase):
                action, logp_buf[t], value = policy.act(self.obs)
            env_action = action.numpy()
            if self._clip is not None:
                env_action = np.clip(env_action, *self._clip)
            with timer("env_s"):
                next_obs, reward, terminated, truncated, info = self.envs.step(env_action)
            self._track_sim_time(info)
            reward = np.asarray(reward, dtype=np.float64)
            self._track_episodes(reward, terminated | truncated)
            if observe is not None:
                observe(reward, terminated | truncated)
            if truncated.any():
                final = np.stack([info["final_obs"][i] for i in np.flatnonzero(truncated)])
                with timer(phase):
                    boot = policy.value(torch.as_tensor(final, dtype=torch.float32))
                boot_buf[t, torch.as_tensor(truncated)] = boot
            obs_buf[t], val_buf[t] = self.obs, value
            act_buf.append(action)
            rew_buf[t] = torch.as_tensor(reward)
            done_buf[t] = torch.as_tensor(terminated | truncated, dtype=torch.float32)
            self.obs = torch.as_tensor(next_obs, dtype=torch.float32)
        with timer(phase):
            last_value = policy.value(self.obs)
        self.rollouts += 1
        if self.slowdown > 1.0:
            with timer("straggle_s"):
                time.sleep((self.slowdown - 1.0) * (time.perf_counter() - started))
        return Rollout(obs=obs_buf, actions=torch.stack(act_buf), logp=logp_buf,
                       values=val_buf, rewards=rew_buf, dones=done_buf, boot=boot_buf,
                       last_value=last_value)

    def drain_episodes(self) -> list[tuple[float, int]]:
        """(return, length) of every episode finished since the last call."""
        done, self.finished = self.finished, []
        return done

    def drain_sim_times(self) -> np.ndarray:
        """Seconds each env step took inside the simulator since the last drain, as an
        array ``[steps, num_envs]`` (empty when the env does not report ``sim_s``)."""
        times, self.sim_times = self.sim_times, []
        return np.stack(times) if times else np.zeros((0, self.envs.num_envs))

    def state(self) -> dict:
        """What a checkpoint needs to continue the rollout exactly (tensors, text)."""
        return {"torch_rng": torch.get_rng_state(), "envs": env_state(self.envs),
                "roller": {"obs": self.obs.clone(),      # "roller": the older files' name
                           "running_return": torch.tensor(self._running_return),
                           "running_length": torch.tensor(self._running_length),
                           "rollouts": self.rollouts}}

    def load_state(self, state: dict) -> None:
        """Continue from a checkpoint; envs whose state could not be saved are reset
        with ``seed + rollouts collected`` instead (their rollout starts afresh)."""
        torch.set_rng_state(state["torch_rng"])
        saved = state["roller"]
        self.rollouts = int(saved.get("rollouts", 0))
        if not restore_env_state(self.envs, state["envs"]):
            self.start(self.seed + self.rollouts)
            return
        self.obs = saved["obs"].clone()
        self._running_return = saved["running_return"].numpy().copy()
        self._running_length = saved["running_length"].numpy().copy()

    def close(self) -> None:
        self.envs.close()

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
