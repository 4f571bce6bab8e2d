"""The command line: ``python -m mpirl.run --help`` is generated from the field docs, and
flags go on top of ``--config``'s file (or ``--resume``'s run)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from .. import registry
from ..errors import ConfigError
from .config import Config
from .loading import load_yaml

#: list fields given one item per flag (``--straggler 1:3 --straggler 2:2``), with metavar
REPEATABLE = {"straggler": "RANK:FACTOR", "env_arg": "KEY=VALUE",
              "fail": "RANK@UPDATE[:KIND]"}


class _Parser(argparse.ArgumentParser):
    """Reports a bad flag as a ConfigError, so the caller prints it once, not once per rank."""

    def error(self, message):
        raise ConfigError(f"{message} (see --help)")


#: the option groups of ``--help``: each field group's title, in the order a
#: configuration is read (the Config dataclass's bases, first to last)
GROUPS = {
    "DesignFields": "design: what is compared (mode, topology, quorum, stragglers)",
    "EnvFields": "environment and budget",
    "LearnerFields": "learner: losses, optimizer, network, the book's tricks",
    "ActorLearnerFields": "actor-learner designs (impala, seed, ga3c)",
    "ReplayFields": "replay designs (apex, gorila, sync-replay): replay, DQN, SAC, shards",
    "TelemetryFields": "run files, progress and logs",
    "ResilienceFields": "faults, checkpoints, resume, replay of schedules",
}


def _owner(name: str) -> str:
    """The field group (dataclass base of Config) that declares field ``name``."""
    for base in reversed(Config.__mro__):
        if name in getattr(base, "__dataclass_fields__", {}) and base.__name__ in GROUPS:
            return base.__name__
    raise KeyError(name)


def _designs() -> str:
    from .. import registry

    import textwrap

    lines = ["designs (--mode):"]
    for d in registry.DESIGNS.values():
        lines += textwrap.wrap(f"{d.name:<12} {d.about}", 88, initial_indent="  ",
                               subsequent_indent=" " * 15)
    return "\n".join(lines)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """The description and epilog as written (one line per design); options wrapped."""


def build_parser(prog: str = "python -m mpirl.run") -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog, formatter_class=_Formatter,
        description="Run one distributed RL design on every MPI rank: what travels between "
                    "the ranks (gradients,\nparameters, unrolls, observations, transitions) "
                    "is the design's (--mode); how gradients\nare combined is the "
                    f"topology's (--topology). Launch with: mpirun -np N {prog}\n\n"
                    + _designs(),
        epilog="Every flag also reads from --config YAML (snake_case keys); flags given "
               "here go on top.\nThe Python API: mpirl.train(config, ranks=N) "
               "(docs/api.md).")
    parser.add_argument("--config", metavar="YAML",
                        help="experiment file; flags given here override its values")
    groups = {name: parser.add_argument_group(title) for name, title in GROUPS.items()}
    defaults = Config()
    for f in fields(Config):
        group = groups[_owner(f.name)]
        default = getattr(defaults, f.name)
        flag = "--" + f.name.replace("_", "-")
        own = "".join(f"; {d.name}: {dict(d.defaults)[f.name]}"
                      for d in registry.DESIGNS.values() if f.name in dict(d.defaults))
        shown = "" if default in ("", []) else f" (default: {default}{own})"
        if isinstance(default, bool):
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                               default=None, help=f.metadata["help"] + shown)
        elif f.name in REPEATABLE:
            group.add_argument(flag, dest=f.name, action="append", default=None,
                               metavar=REPEATABLE[f.name], help=f.metadata["help"])
        elif isinstance(default, list):
            group.add_argument(flag, dest=f.name, type=int, nargs="+", default=None,
                               metavar="N", help=f.metadata["help"] + shown)
        else:
            group.add_argument(flag, dest=f.name, type=type(default), default=None,
                               metavar=type(default).__name__.upper(),
                               help=f.metadata["help"] + shown)
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
    given = set(load_yaml(args.config)) if args.config else set()
    for f in fields(Config):
        value = getattr(args, f.name)
        if value is not None:
            setattr(cfg, f.name, value)
            given.add(f.name)
    if not args.resume or args.config:   # a run's saved configuration holds every field;
        cfg.take_design_defaults(given)  # --config FILE --resume builds the run from FILE
    if cfg.resume:     # what the run goes on with is saved into its config.yaml: the flags
        # given on top of it, or, built from FILE, every field (Config.save_resumed)
        cfg.resumed_with = tuple(f.name for f in fields(Config)) if args.config \
            else tuple(sorted(given))
    return cfg
