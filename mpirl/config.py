"""The run configuration: one dataclass, a help text per field, YAML in, flags on top.

``python -m mpirl.run --help`` is generated from the field docs below.  A run's fully
resolved configuration is written next to its results, so any run can be repeated
with ``--config RUN_DIR/config.yaml``.  Validation happens once, at start, and every
message names the field, the value and what is allowed.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from .faults import NAN_POLICIES, FaultSpecError, parse_faults

#: --on-failure choices (mpirl.ulfm.ON_FAILURE; repeated to keep MPI out of config)
ON_FAILURE = ("stop", "shrink")

MODES = ("sync", "async", "quorum")
LATE_POLICIES = ("drop", "apply")
ACTIVATIONS = ("tanh", "relu", "elu")


class ConfigError(ValueError):
    """A configuration value, key or file that cannot be used; the message says why."""


def _doc(text: str, **kw):
    return field(metadata={"help": text}, **kw)


@dataclass
class Config:
    """Everything that defines a run; identical on every rank."""

    # --- what is compared ------------------------------------------------------------
    topology: str = _doc("gradient exchange, a name registered in topologies/", default="butterfly")
    mode: str = _doc(
        "training design: sync (every rank computes a gradient, all are averaged by the "
        "topology's allreduce, every rank steps: A2C/DPPO); async (rank 0 is a parameter "
        "server that applies each worker's gradient on arrival and answers that worker "
        "alone: A3C; needs topology star); quorum (the server waits for --quorum fresh "
        "gradients, averages them, steps and answers: DPPO's leader; needs topology star)",
        default="sync")
    quorum: int = _doc("quorum mode: fresh gradients the server waits for per update; "
                       "0 = half the workers, rounded up", default=0)
    late: str = _doc("quorum mode: a gradient computed on old parameters is 'drop'ped or "
                     "'apply'd with the fresh ones (counted and logged either way)",
                     default="drop")
    straggler: list = _doc(
        "slow ranks, as RANK:FACTOR (repeatable): after each rollout the rank idles "
        "(FACTOR-1) times as long as the rollout took", default_factory=list)
    # --- environment and budget ----------------------------------------------------
    env: str = _doc("gymnasium environment id; also mpirl's own L2Run-v0 (Learning to Run on "
                    "OpenSim) and Delay-v0 (a synthetic env with a tunable step cost)",
                    default="CartPole-v1")
    env_arg: list = _doc(
        "argument of L2Run-v0 or Delay-v0 as KEY=VALUE (repeatable), e.g. difficulty=2, "
        "cost_s=0.01, dist=lognormal", default_factory=list)
    seed: int = _doc("base seed; rank r seeds its env with seed + 10000*r", default=1)
    total_steps: int = _doc("env steps summed over all ranks before the run stops",
                            default=200_000)
    num_envs: int = _doc("environments stepped in lock-step on each rank", default=4)
    rollout_steps: int = _doc("steps per environment between updates (the n of n-step returns)",
                              default=16)
    # --- learner -----------------------------------------------------------------------
    lr: float = _doc("Adam learning rate", default=1e-3)
    gamma: float = _doc("discount factor", default=0.99)
    gae_lambda: float = _doc("GAE lambda; 1.0 gives plain n-step returns", default=0.95)
    value_coef: float = _doc("weight of the value loss", default=0.5)
    entropy_coef: float = _doc("weight of the entropy bonus", default=0.01)
    clip_ratio: float = _doc("PPO clipped objective with this epsilon (DPPO; pair it with "
                             "--update-repeat); 0 = plain advantage actor-critic",
                             default=0.0)
    max_grad_norm: float = _doc("clip the averaged gradient to this norm; 0 disables",
                                default=0.5)
    hidden: list = _doc("hidden layer widths of the actor-critic MLP",
                        default_factory=lambda: [64, 64])
    activation: str = _doc("hidden activation: tanh, relu or elu", default="tanh")
    layer_norm: bool = _doc("layer normalisation after every hidden layer", default=False)
    reward_scale: bool = _doc("divide each batch's rewards by their standard deviation",
                              default=False)
    action_repeat: int = _doc("apply each action this many times (rewards summed)", default=1)
    update_repeat: int = _doc("learn each batch this many times (a fresh gradient each time)",
                              default=1)
    # --- bookkeeping ---------------------------------------------------------------------
    run_dir: str = _doc("parent directory of run directories", default="runs")
    run_name: str = _doc("name of this run's directory (default: topology-mode-Nranks-time)",
                         default="")
    log_every: int = _doc(
        "progress line every this many rollouts (sync: rank 0) or server updates "
        "(async, quorum)", default=20)
    target_return: float = _doc(
        "stop early once every experience-collecting rank has finished 20 episodes and the "
        "mean over ranks of their last-20-episode mean return reaches this (checked at "
        "each progress line); 0 disables", default=0.0)
    log_flush_every: int = _doc(
        "HDF5 log rows buffered before they are written and flushed; a crash loses at "
        "most this many rows per rank", default=50)
    checksum_every: int = _doc(
        "compare a checksum of parameters and optimizer state across ranks every this many "
        "updates; a mismatch stops the run; 0 disables", default=50)
    torch_threads: int = _doc("torch threads per rank; 0 = cores / ranks on this node",
                              default=0)
    wait_timeout_s: float = _doc(
        "deadline for any single wait on another rank (async/quorum server and workers); "
        "a rank silent for longer stops the run with an error", default=300.0)
    watchdog_s: float = _doc(
        "end the whole job when a rank completes no update for this many seconds (a rank "
        "died, hangs or stalls; blocking collectives have no deadline of their own); "
        "0 disables", default=600.0)
    nan_policy: str = _doc(
        "a NaN/Inf in a gradient: 'stop' the job naming rank and update, or 'skip' that "
        "update on every rank (counted in summary.json)", default="stop")
    on_failure: str = _doc(
        "a rank fails: 'stop' the job (naming it), or 'shrink': the survivors agree, shrink "
        "the communicator and carry on (sync mode; needs ULFM: Open MPI 5 launched with "
        "--with-ft ulfm, see README)", default="stop")
    checkpoint_every: int = _doc(
        "every rank writes a checkpoint (parameters, Adam state, RNG, env state): sync "
        "every this many rollouts and at the end, async/quorum a snapshot every this many "
        "server updates; 0 disables (a SIGTERM/SIGINT stop still writes one)", default=100)
    resume: str = _doc(
        "continue the killed or finished run in this run directory from its checkpoints, "
        "to the same total budget (its config.yaml is the base; flags on top)", default="")
    fail: list = _doc(
        "inject a failure, as RANK@UPDATE[:KIND] (repeatable), KIND one of exit (the "
        "process dies), raise, nan (the gradient becomes NaN), hang; for tests and drills",
        default_factory=list)

    def _check_resume(self, world_size: int) -> None:
        ckpt = Path(self.resume) / "checkpoints"
        if self.mode != "sync":
            from .checkpoint import generations, latest_complete

            if latest_complete(self.resume, world_size) is None:
                have = generations(self.resume)
                raise ConfigError(
                    f"resume={self.resume!r}: no checkpoint generation that all "
                    f"{world_size} ranks wrote (found generations {have or 'none'} in "
                    f"{ckpt}); resume with the rank count the run was started with")
            return
        missing = [r for r in range(world_size) if not (ckpt / f"rank{r:04d}.pt").is_file()]
        if missing:
            have = sorted(p.name for p in ckpt.glob("rank*.pt")) if ckpt.is_dir() else []
            raise ConfigError(f"resume={self.resume!r}: no checkpoint for ranks {missing} "
                              f"(found {len(have)}: {', '.join(have) or 'none'}); resume with "
                              "the rank count the run was started with")
        extra = sorted(p.name for p in ckpt.glob("rank*.pt")
                       if p.stem[4:].isdigit() and int(p.stem[4:]) >= world_size)
        if extra:
            raise ConfigError(f"resume={self.resume!r}: checkpoints of more ranks than "
                              f"{world_size} ({', '.join(extra[:3])}); resume with the rank "
                              "count the run was started with")

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
                out[key.strip()] = yaml.load(text, Loader=_SafeLoader)
            except (yaml.YAMLError, RecursionError):
                raise ConfigError(f"env_arg={spec!r}: {text!r} is not a value") from None
        return out

    def experience_ranks(self, world_size: int) -> int:
        """Ranks that run environments: all in sync, all but the server otherwise."""
        return world_size if self.mode == "sync" else world_size - 1

    def quorum_size(self, world_size: int) -> int:
        """Fresh gradients per quorum update: ``quorum`` or half the workers, rounded up."""
        return self.quorum or -(-(world_size - 1) // 2)

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
        unknown = sorted(_printable(k) for k in data if k not in known)
        if unknown:
            raise ConfigError(f"{source}: unknown field(s) {', '.join(unknown)}; "
                              f"valid fields: {', '.join(sorted(known))}")
        cfg = cls()
        for key, value in data.items():
            setattr(cfg, key, _coerce(getattr(cfg, key), key, value, source))
        return cfg

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def save(self, path: Path) -> None:
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    # -- validation -------------------------------------------------------------------------
    def validate(self, world_size: int) -> "Config":
        """Raise ConfigError for the first unusable value; return self when all is well."""
        import gymnasium
        import topologies

        _choice("mode", self.mode, MODES)
        _choice("topology", self.topology, topologies.names())
        _choice("late", self.late, LATE_POLICIES)
        if self.mode != "sync":
            if self.topology != "star":
                raise ConfigError(
                    f"mode={self.mode!r} runs a parameter server, the star topology used "
                    f"asynchronously; topology={self.topology!r} is not allowed with it "
                    "(use --topology star, or --mode sync)")
            if world_size < 2:
                raise ConfigError(f"mode={self.mode!r} needs at least 2 ranks (a server and a "
                                  f"worker), got {world_size}; launch with mpirun -np 2 or more")
        if self.mode == "quorum" and not 0 <= self.quorum <= world_size - 1:
            raise ConfigError(f"quorum={self.quorum}; allowed with {world_size} ranks: "
                              f"0..{world_size - 1} (0 = half the workers)")
        for rank in parse_stragglers(self.straggler):
            if rank >= world_size:
                raise ConfigError(f"straggler rank {rank} does not exist; allowed ranks: "
                                  f"0..{world_size - 1}")
        _choice("activation", self.activation, ACTIVATIONS)
        _choice("nan_policy", self.nan_policy, NAN_POLICIES)
        _choice("on_failure", self.on_failure, ON_FAILURE)
        if self.on_failure == "shrink" and self.mode != "sync":
            raise ConfigError(f"on_failure='shrink' with mode={self.mode!r}: the parameter "
                              "server holds the only copy of the parameters, so its failure "
                              "cannot be survived; shrink is for mode sync")
        _at_least("checkpoint_every", self.checkpoint_every, 0)
        if self.resume:
            self._check_resume(world_size)
        _at_least("watchdog_s", self.watchdog_s, 0.0)
        try:
            planned = parse_faults(self.fail, world_size)
        except FaultSpecError as err:
            raise ConfigError(str(err)) from None
        if self.mode != "sync" and planned.get(0, (0, ""))[1] == "nan":
            raise ConfigError("fail=0@...:nan: rank 0 is the parameter server and computes no "
                              "gradient; inject nan on a worker (rank >= 1)")
        from .envs import check_env_args   # registers L2Run-v0, Delay-v0 (no OpenSim import)

        if self.env not in gymnasium.registry:
            close = [e for e in gymnasium.registry if self.env.split("-")[0].lower() in e.lower()]
            hint = f" (did you mean {', '.join(close[:5])}?)" if close else ""
            raise ConfigError(f"env={self.env!r} is not a registered gymnasium id{hint}")
        try:
            check_env_args(self.env, self.env_kwargs())
        except ValueError as err:
            raise ConfigError(str(err)) from None
        for name in ("total_steps", "num_envs", "rollout_steps", "log_every", "action_repeat",
                     "update_repeat", "log_flush_every"):
            _at_least(name, getattr(self, name), 1)
        for name in ("checksum_every", "torch_threads"):
            _at_least(name, getattr(self, name), 0)
        _in_range("lr", self.lr, 0.0, 1.0, low_open=True)
        _at_least("wait_timeout_s", self.wait_timeout_s, 0.1)
        _in_range("gamma", self.gamma, 0.0, 1.0)
        _in_range("gae_lambda", self.gae_lambda, 0.0, 1.0)
        _in_range("clip_ratio", self.clip_ratio, 0.0, 1.0)
        for name in ("value_coef", "entropy_coef", "max_grad_norm"):
            _at_least(name, getattr(self, name), 0.0)
        if not self.hidden or not all(type(h) is int and h > 0 for h in self.hidden):
            raise ConfigError(f"hidden={self.hidden!r}; allowed: a non-empty list of positive ints")
        workers = self.experience_ranks(world_size)
        per_update = workers * self.num_envs * self.rollout_steps * self.action_repeat
        if self.total_steps < per_update:
            raise ConfigError(
                f"total_steps={self.total_steps} is less than one update "
                f"({workers} experience-collecting ranks x num_envs {self.num_envs} x "
                f"rollout_steps {self.rollout_steps} x action_repeat {self.action_repeat} = "
                f"{per_update}); raise total_steps")
        return self


def config_differences(mine: dict, reference: dict) -> list[str]:
    """``field=mine vs reference`` for every field in which two configurations (as
    :meth:`Config.to_dict` gives them) differ, sorted by field: how a refusal names
    what to fix (ranks launched differently, a run directory resumed by a sweep)."""
    return [f"{key}={mine.get(key)!r} vs {reference.get(key)!r}"
            for key in sorted(set(mine) | set(reference)) if mine.get(key) != reference.get(key)]


def parse_stragglers(specs: list) -> dict[int, float]:
    """``["1:3", "2:1.5"]`` -> ``{1: 3.0, 2: 1.5}``; malformed entries raise ConfigError."""
    out: dict[int, float] = {}
    for spec in specs:
        try:
            rank_text, factor_text = str(spec).split(":")
            rank, factor = int(rank_text), float(factor_text)
        except ValueError:
            raise ConfigError(f"straggler={spec!r}; expected RANK:FACTOR, e.g. 1:3") from None
        if rank < 0 or not 1.0 <= factor < math.inf:
            raise ConfigError(f"straggler={spec!r}; allowed: RANK >= 0 and a finite FACTOR >= 1")
        out[rank] = factor
    return out


class _SafeLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, except that a tagged value it cannot construct (``!!int x``,
    ``!!float``, ``!!timestamp 1``), for which PyYAML raises a bare ValueError, IndexError
    or AttributeError, is a ConstructorError with the value's line, like its other errors."""

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, IndexError, AttributeError, OverflowError) as err:
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {node.value!r} as {node.tag.rsplit(':', 1)[-1]} "
                f"({type(err).__name__}: {err})", node.start_mark) from None


def load_yaml(path: str | Path) -> dict:
    """Safe-load a YAML file; errors name the file and, for syntax errors, the line."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        line = err.object.count(b"\n", 0, err.start) + 1
        raise ConfigError(f"{path} line {line}: not UTF-8 text (byte {err.object[err.start]:#x} "
                          f"at offset {err.start})") from None
    try:
        data = yaml.load(text, Loader=_SafeLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        if mark is not None:
            line = mark.line + 1
        else:               # a ReaderError (a character YAML forbids) has a position only
            line = text.count("\n", 0, getattr(err, "position", 0)) + 1
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{path} line {line}: not valid YAML: {problem}") from None
    except RecursionError:     # PyYAML composes nested collections recursively
        raise ConfigError(f"{path}: collections nested too deeply to load") from None
    return {} if data is None else data


#: numbers YAML 1.1 leaves as strings (an exponent without a dot: 3e-4, 1E5)
_YAML11_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _coerce(default, key: str, value, source: str):
    """Check a loaded value against the field's type; ints are accepted for floats."""
    kind = type(default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is float and isinstance(value, str) and _YAML11_FLOAT.fullmatch(value.strip()):
        return float(value)       # "3e-4": YAML 1.1 (PyYAML) reads it as a string
    if kind is list and isinstance(value, (list, tuple)):
        return list(value)
    if type(value) is not kind:
        raise ConfigError(f"{source}: {key}={value!r} is a {type(value).__name__}; "
                          f"expected {kind.__name__}")
    return value


def _choice(name, value, allowed):
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not allowed; choose one of: {', '.join(allowed)}")


def _printable(key) -> str:
    text = str(key)
    return text if text.isprintable() else repr(text)


def _at_least(name, value, low):
    if not value >= low:             # NaN is not >= anything: refused too
        raise ConfigError(f"{name}={value!r}; allowed: >= {low}")


def _in_range(name, value, low, high, low_open=False):
    ok = (low < value if low_open else low <= value) and value <= high
    if not ok:
        bracket = "(" if low_open else "["
        raise ConfigError(f"{name}={value!r}; allowed: {bracket}{low}, {high}]")


# -- command line -------------------------------------------------------------------------
#: list fields given one item per flag (``--straggler 1:3 --straggler 2:2``), with metavar
REPEATABLE = {"straggler": "RANK:FACTOR", "env_arg": "KEY=VALUE",
              "fail": "RANK@UPDATE[:KIND]"}


class _Parser(argparse.ArgumentParser):
    """Reports a bad flag as a ConfigError, so the caller prints it once, not once per rank."""

    def error(self, message):
        raise ConfigError(f"{message} (see --help)")


def build_parser(prog: str = "python -m mpirl.run") -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Train an actor-critic on every MPI rank, exchanging gradients "
                    "through a chosen topology. Launch with: mpirun -np N " + prog)
    parser.add_argument("--config", metavar="YAML",
                        help="experiment file; flags given here override its values")
    defaults = Config()
    for f in fields(Config):
        default = getattr(defaults, f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=None, help=f.metadata["help"] + f" (default: {default})")
        elif f.name in REPEATABLE:
            parser.add_argument(flag, dest=f.name, action="append", default=None,
                                metavar=REPEATABLE[f.name], help=f.metadata["help"])
        elif isinstance(default, list):
            parser.add_argument(flag, dest=f.name, type=int, nargs="+", default=None,
                                metavar="N", help=f.metadata["help"] + f" (default: {default})")
        else:
            parser.add_argument(flag, dest=f.name, type=type(default), default=None,
                                metavar=type(default).__name__.upper(),
                                help=f.metadata["help"] + f" (default: {default})")
    return parser


def parse_args(argv: list[str] | None = None) -> Config:
    """Config from ``--config`` (if given) with command-line flags applied on top."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.config:
        cfg = Config.from_yaml(args.config)
    elif args.resume:              # the run's own configuration, minus injected failures
        saved = Path(args.resume) / "config.yaml"
        if not saved.is_file():
            raise ConfigError(f"resume={args.resume!r}: no {saved}; give a run directory")
        cfg = Config.from_yaml(saved)
        cfg.fail = []
    else:
        cfg = Config()
    for f in fields(Config):
        value = getattr(args, f.name)
        if value is not None:
            setattr(cfg, f.name, value)
    return cfg
