"""The environment and the budget."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .checks import at_least, doc


@dataclass
class EnvFields:
    env: str = doc("gymnasium environment id; also mpirl's own L2Run-v0 (Learning to Run on "
                    "OpenSim) and Delay-v0 (a synthetic env with a tunable step cost); "
                    "MODULE:ENV_ID imports MODULE first (which registers your env), as "
                    "gymnasium.make does", default="CartPole-v1")
    env_arg: list = doc(
        "argument of L2Run-v0 or Delay-v0 as KEY=VALUE (repeatable), e.g. difficulty=2, "
        "cost_s=0.01, dist=lognormal", default_factory=list)
    seed: int = doc("base seed; rank r seeds its env with seed + 10000*r", default=1)
    total_steps: int = doc("env steps summed over all ranks before the run stops",
                            default=200_000)
    num_envs: int = doc("environments stepped in lock-step on each rank", default=4)
    rollout_steps: int = doc("steps per environment between updates (the n of n-step returns)",
                              default=16)


def registered_id(env: str) -> str:
    """The gymnasium id ``env`` names, its module imported first where it is given as
    ``MODULE:ENV_ID`` (gymnasium.make's syntax); ConfigError when the module cannot be
    imported or the id is not registered."""
    import importlib

    import gymnasium

    from ..parts import envs  # noqa: F401  (registers L2Run-v0, Delay-v0; no OpenSim)

    module, sep, env_id = env.rpartition(":")
    if sep:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ConfigError(f"env={env!r}: cannot import {module!r} ({err}); it must be "
                              "importable where the ranks start (the working directory or "
                              "PYTHONPATH)") from None
    if env_id not in gymnasium.registry:
        close = [e for e in gymnasium.registry if env_id.split("-")[0].lower() in e.lower()]
        hint = f" (did you mean {', '.join(close[:5])}?)" if close else ""
        after = f" after importing {module}" if sep else ""
        raise ConfigError(f"env={env!r} is not a registered gymnasium id{after}{hint}; "
                          "allowed: a registered id, or MODULE:ENV_ID for your own")
    return env_id


def check_env(cfg, world_size: int) -> None:
    from ..parts.envs import check_env_args

    env_id = registered_id(cfg.env)
    try:
        check_env_args(env_id, cfg.env_kwargs())
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
