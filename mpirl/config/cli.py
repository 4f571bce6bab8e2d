"""The command line: ``python -m mpirl.run --help`` is generated from the field docs, and
flags go on top of ``--config``'s file (or ``--resume``'s run)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from ..errors import ConfigError
from .config import Config

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
