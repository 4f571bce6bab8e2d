"""The environment part: a rank's vector of envs, and the action repeat trick."""

from __future__ import annotations

import gymnasium


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

    def make():
        env = gymnasium.make(env_id, **(kwargs or {}))
        return ActionRepeat(env, action_repeat) if action_repeat > 1 else env

    envs = gymnasium.vector.SyncVectorEnv(
        [make for _ in range(num_envs)],
        autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)
    envs.action_space.seed(seed)
    return envs
