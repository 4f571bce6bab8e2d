"""The environment and the budget."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .checks import at_least, doc


@dataclass
class EnvFields:
    env: str = doc("gymnasium environment id; also mpirl's own L2Run-v0 (Learning to Run on "
                    "OpenSim) and Delay-v0 (a synthetic env with a tunable step cost)",
                    default="CartPole-v1")
    env_arg: list = doc(
        "argument of L2Run-v0 or Delay-v0 as KEY=VALUE (repeatable), e.g. difficulty=2, "
        "cost_s=0.01, dist=lognormal", default_factory=list)
    seed: int = doc("base seed; rank r seeds its env with seed + 10000*r", default=1)
    total_steps: int = doc("env steps summed over all ranks before the run stops",
                            default=200_000)
    num_envs: int = doc("environments stepped in lock-step on each rank", default=4)
    rollout_steps: int = doc("steps per environment between updates (the n of n-step returns)",
                              default=16)


def check_env(cfg, world_size: int) -> None:
    import gymnasium

    from ..parts.envs import check_env_args   # registers L2Run-v0, Delay-v0 (no OpenSim)

    if cfg.env not in gymnasium.registry:
        close = [e for e in gymnasium.registry if cfg.env.split("-")[0].lower() in e.lower()]
        hint = f" (did you mean {', '.join(close[:5])}?)" if close else ""
        raise ConfigError(f"env={cfg.env!r} is not a registered gymnasium id{hint}")
    try:
        check_env_args(cfg.env, cfg.env_kwargs())
    except ValueError as err:
        raise ConfigError(str(err)) from None
    for name in ("total_steps", "num_envs", "rollout_steps"):
        at_least(name, getattr(cfg, name), 1)


def check_budget(cfg, world_size: int) -> None:
    """The budget holds at least one update (after every group's own check)."""
    workers = cfg.experience_ranks(world_size)
    per_update = workers * cfg.num_envs * cfg.rollout_steps * cfg.action_repeat
    if cfg.total_steps < per_update:
        raise ConfigError(
            f"total_steps={cfg.total_steps} is less than one update "
            f"({workers} experience-collecting ranks x num_envs {cfg.num_envs} x "
            f"rollout_steps {cfg.rollout_steps} x action_repeat {cfg.action_repeat} = "
            f"{per_update}); raise total_steps")
