"""The run configuration: one dataclass, a help text per field, YAML in, flags on top.

``python -m mpirl.run --help`` is generated from the field docs.  The fields are
defined and checked in groups (:mod:`mpirl.config.groups`: design, environment and
budget, learner, bookkeeping, faults), but their keys are flat, as sweeps use them.  A
run's fully resolved configuration is written next to its results, so any run can be
repeated with ``--config RUN_DIR/config.yaml``.  Validation happens once, at start,
before torch is imported, and every message names the field, the value and what is
allowed.

Validation looks things up in the registries it checks against: topology names
(``topologies``), env ids and their arguments (:mod:`mpirl.parts.envs`, importing no
simulator), and for ``--resume`` the checkpoint files (:mod:`mpirl.resilience.checkpoint`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from .groups import (ACTIVATIONS, ACTOR_LEARNER_MODES, CHECKS, DQN_MODES, FAIL_KINDS,
                     GRADIENT_MODES, LATE_POLICIES, MODES, NAN_POLICIES, ON_FAILURE,
                     ActorLearnerFields, ConfigError, DesignFields, EnvFields, FaultSpecError,
                     LearnerFields, ReplayFields, ResilienceFields, TelemetryFields,
                     parse_faults, parse_stragglers)
from .loading import SafeLoader, build_parser, coerce, load_yaml, parse_args, printable


@dataclass
class Config(ResilienceFields, TelemetryFields, ReplayFields, ActorLearnerFields, LearnerFields,
             EnvFields, DesignFields):
    """Everything that defines a run; identical on every rank.  Fields come in the order
    design, environment, learner, bookkeeping, faults (dataclass bases, last first)."""

    # -- derived ---------------------------------------------------------------------------
    def slowdown_of(self, rank: int) -> float:
        """The straggler factor of ``rank`` (1.0 when it is not a straggler)."""
        return parse_stragglers(self.straggler).get(rank, 1.0)

    def env_kwargs(self) -> dict:
        """``env_arg`` as keyword arguments; values are read as YAML (2 -> int, x -> str)."""
        out = {}
        for spec in self.env_arg:
            key, sep, text = str(spec).partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"env_arg={spec!r}; expected KEY=VALUE, e.g. difficulty=2")
            try:
                out[key.strip()] = yaml.load(text, Loader=SafeLoader)
            except (yaml.YAMLError, RecursionError):
                raise ConfigError(f"env_arg={spec!r}: {text!r} is not a value") from None
        return out

    def experience_ranks(self, world_size: int) -> int:
        """Ranks that run environments: all in sync, all but the server(s) (async,
        quorum, gorila; gorila's replay ranks too), all but the learners (impala), the
        learner (seed), the trainer and the predictor (ga3c), or the learner and the
        replay ranks (apex)."""
        servers = {"sync": 0, "impala": self.learners, "ga3c": 2, "apex": 1 + self.replay_ranks,
                   "gorila": self.servers + (self.replay_ranks
                                             if self.gorila_replay == "service" else 0),
                   "async": self.servers}.get(self.mode, 1)
        return world_size - servers

    def inference_mode(self) -> str:
        """seed/ga3c batching: ``fixed`` or ``drain`` (``auto`` resolved by design)."""
        if self.inference_policy != "auto":
            return self.inference_policy
        return "drain" if self.mode == "ga3c" else "fixed"

    def quorum_size(self, world_size: int) -> int:
        """Fresh gradients per quorum update: ``quorum`` or half the workers, rounded up."""
        return self.quorum or -(-(world_size - 1) // 2)

    @property
    def steps_per_batch(self) -> int:
        """Env steps in one rollout of one rank (one update's experience there)."""
        return self.num_envs * self.rollout_steps * self.action_repeat

    # -- loading --------------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, path: str | Path) -> "Config":
        return cls.from_dict(load_yaml(path), source=str(path))

    @classmethod
    def from_dict(cls, data: dict, source: str = "config") -> "Config":
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a mapping of field: value, got "
                              f"{type(data).__name__}")
        known = {f.name for f in fields(cls)}
        # YAML keys may be numbers, null or hold line breaks: named printably, one line
        unknown = sorted(printable(k) for k in data if k not in known)
        if unknown:
            raise ConfigError(f"{source}: unknown field(s) {', '.join(unknown)}; "
                              f"valid fields: {', '.join(sorted(known))}")
        cfg = cls()
        for key, value in data.items():
            setattr(cfg, key, coerce(getattr(cfg, key), key, value, source))
        return cfg

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def save(self, path: Path) -> None:
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    # -- validation -------------------------------------------------------------------------
    def validate(self, world_size: int) -> "Config":
        """Raise ConfigError for the first unusable value; return self when all is well."""
        for check in CHECKS:
            check(self, world_size)
        return self


def config_differences(mine: dict, reference: dict) -> list[str]:
    """``field=mine vs reference`` for every field in which two configurations (as
    :meth:`Config.to_dict` gives them) differ, sorted by field: how a refusal names
    what to fix (ranks launched differently, a run directory resumed by a sweep)."""
    return [f"{key}={mine.get(key)!r} vs {reference.get(key)!r}"
            for key in sorted(set(mine) | set(reference)) if mine.get(key) != reference.get(key)]


__all__ = ["ACTIVATIONS", "ACTOR_LEARNER_MODES", "DQN_MODES", "FAIL_KINDS", "GRADIENT_MODES",
           "LATE_POLICIES", "MODES", "NAN_POLICIES", "ON_FAILURE",
           "Config", "ConfigError", "FaultSpecError", "build_parser", "config_differences",
           "load_yaml", "parse_args", "parse_faults", "parse_stragglers"]
