"""The run configuration as one dataclass: every group's fields, flat keys, YAML in and
out, and the groups' checks run in order (:meth:`Config.validate`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from .. import registry
from ..errors import ConfigError
from .actorlearner import ActorLearnerFields, check_actor_learner
from .design import DesignFields, check_design, check_wiring, parse_stragglers
from .env import EnvFields, check_budget, check_env
from .learner import LearnerFields, check_learner, check_model
from .loading import ValueLoader, coerce, load_yaml, printable
from .replay import ReplayFields, check_replay
from .resilience import ResilienceFields, check_resilience
from .telemetry import TelemetryFields, check_telemetry

#: the groups' checks, in the order a configuration is validated
CHECKS = (check_design, check_actor_learner, check_replay, check_wiring, check_learner,
          check_telemetry, check_resilience, check_env, check_model, check_budget)


#: fields never written into a resumed run's config.yaml, and not compared by a sweep
#: deciding whether a run directory is its point's: where the run lives (set per launch)
#: and the failures injected (the file's list is the record of the first start's;
#: ``--resume`` drops it)
NOT_RESUMED = ("run_dir", "run_name", "resume", "fail")


@dataclass
class Config(ResilienceFields, TelemetryFields, ReplayFields, ActorLearnerFields, LearnerFields,
             EnvFields, DesignFields):
    """Everything that defines a run; identical on every rank.  Fields come in the order
    design, environment, learner, bookkeeping, faults (dataclass bases, last first)."""

    #: not a field: the fields a resumed run goes on with that :meth:`save_resumed` saves
    #: (set by :func:`mpirl.config.cli.parse_args`): the flags given on top of the run's
    #: own config.yaml or, with ``--config FILE``, every field
    resumed_with = ()

    # -- derived ---------------------------------------------------------------------------
    def slowdown_of(self, rank: int) -> float:
        """The straggler factor of ``rank`` (1.0 when it is not a straggler)."""
        return parse_stragglers(self.straggler).get(rank, 1.0)

    def env_kwargs(self) -> dict:
        """``env_arg`` as keyword arguments; values are read as YAML (2 -> int, 5e-5 ->
        float, x -> str)."""
        out = {}
        for spec in self.env_arg:
            key, sep, text = str(spec).partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"env_arg={spec!r}; expected KEY=VALUE, e.g. difficulty=2")
            try:
                out[key.strip()] = yaml.load(text, Loader=ValueLoader)
            except (yaml.YAMLError, RecursionError):
                raise ConfigError(f"env_arg={spec!r}: {text!r} is not a value") from None
        return out

    @property
    def design(self) -> registry.Design:
        """This mode's row of the design registry."""
        return registry.design(self.mode)

    @property
    def uses_topology(self) -> bool:
        """``--topology`` plays a part: the design allreduces (or is the star's server), or
        impala's several learners combine their gradients with it, or learners broadcast
        parameters through it (impala's and apex's ``--param-delivery broadcast``)."""
        use = self.design.topology_use
        return (use in ("allreduce", "star") or (use == "learners" and self.learners > 1)
                or self.param_delivery == "broadcast")

    @property
    def topology_spec(self) -> str:
        """What ``topologies.get`` builds: the name, with its options
        (``hierarchical:INNER[:NODE_SIZE]``, ``auto:PARAMS.json``), inside its compression
        wrapper (``fp16:SPEC``) when ``compress`` is not none."""
        spec = self.topology
        if self.topology == "hierarchical":
            spec = f"hierarchical:{self.inner}" + (f":{self.node_size}" if self.node_size
                                                   else "")
        elif self.topology == "auto" and self.cost_params:
            spec = f"auto:{self.cost_params}"
        return spec if self.compress == "none" else f"{self.compress}:{spec}"

    def default_run_name(self, world_size: int) -> str:
        """A run's directory name when ``run_name`` is empty: the design (with its
        topology where it uses one), the rank count and the time of day."""
        import time

        design = f"{self.topology}-{self.mode}" if self.uses_topology else self.mode
        if self.compress != "none":
            design = f"{self.compress.replace(':', '')}-{design}"
        return f"{design}-{world_size}r-{time.strftime('%Y%m%d-%H%M%S')}"

    def take_design_defaults(self, given: set[str]) -> None:
        """The design's own starting values (its registry row's ``defaults``) for the
        fields the user did not set (``given``: set by a flag or a YAML key)."""
        if self.mode not in registry.DESIGNS:
            return                 # validation names it
        for name, value in self.design.defaults:
            if name not in given:
                setattr(self, name, value)

    def run_dir_name(self, world_size: int) -> str:
        """The run's directory under ``run_dir``: ``run_name`` (or the default name); under
        an elastic driver, the attempt's directory below it (``NAME/attemptN``)."""
        from ..resilience.elastic import Launch

        launch = Launch.from_env()
        if launch is not None:
            return launch.run_name(self.run_name)
        return self.run_name or self.default_run_name(world_size)

    def roles(self, world_size: int) -> tuple[str, ...]:
        """The role of each rank (:meth:`mpirl.registry.Design.roles`)."""
        return self.design.roles(self, world_size)

    def experience_ranks(self, world_size: int) -> int:
        """Ranks that run environments (the design's workers or actors)."""
        return self.design.experience_ranks(self, world_size)

    def inference_mode(self) -> str:
        """seed/ga3c batching: ``fixed`` or ``drain`` (``auto``: the design's own)."""
        if self.inference_policy != "auto":
            return self.inference_policy
        return self.design.inference or "fixed"

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

    def save_resumed(self, path: Path) -> list[str]:
        """``--resume``: write the fields of :attr:`resumed_with` (the flags given on top
        of the run's ``config.yaml``, or every field of a run built from ``--config
        FILE``; the budget, above all: a later resume goes on to the new one) into it
        where they differ, but never those of :data:`NOT_RESUMED`.  Returns the fields
        changed as ``name old -> new``."""
        saved = Config.from_yaml(path).to_dict()
        now = self.to_dict()
        changed = [k for k in self.resumed_with
                   if k not in NOT_RESUMED and saved[k] != now[k]]
        if changed:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(yaml.safe_dump({**saved, **{k: now[k] for k in changed}},
                                          sort_keys=False))
            tmp.replace(path)                  # whole, or the old file untouched
        return [f"{k} {saved[k]} -> {now[k]}" for k in changed]

    # -- validation -------------------------------------------------------------------------
    def validate(self, world_size: int) -> "Config":
        """Raise ConfigError for the first unusable value; return self when all is well."""
        for check in CHECKS:
            check(self, world_size)
        return self
