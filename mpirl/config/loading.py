"""Configurations in and out: YAML files, values checked against the fields' types, and
the command line (``python -m mpirl.run --help`` is generated from the field docs)."""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from .groups import ConfigError

if TYPE_CHECKING:
    from . import Config


class SafeLoader(yaml.SafeLoader):
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
        data = yaml.load(text, Loader=SafeLoader)
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


def coerce(default, key: str, value, source: str):
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


# -- command line -------------------------------------------------------------------------
#: list fields given one item per flag (``--straggler 1:3 --straggler 2:2``), with metavar
REPEATABLE = {"straggler": "RANK:FACTOR", "env_arg": "KEY=VALUE",
              "fail": "RANK@UPDATE[:KIND]"}


class _Parser(argparse.ArgumentParser):
    """Reports a bad flag as a ConfigError, so the caller prints it once, not once per rank."""

    def error(self, message):
        raise ConfigError(f"{message} (see --help)")


def build_parser(prog: str = "python -m mpirl.run") -> argparse.ArgumentParser:
    from . import Config

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
    from . import Config

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


def printable(key) -> str:
    """A YAML key as one printable line (keys may be numbers, null or hold line breaks)."""
    text = str(key)
    return text if text.isprintable() else repr(text)
