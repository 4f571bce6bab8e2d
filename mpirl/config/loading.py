"""Configurations in and out: YAML files, values checked against the fields' types, and
how two configurations differ."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ..errors import ConfigError


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


#: numbers YAML 1.1 leaves as strings (an exponent without a dot, or without its sign:
#: 3e-4, 1E5, 1.5e3)
_YAML11_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


class ValueLoader(SafeLoader):
    """:class:`SafeLoader` that reads YAML 1.2's floats without a dot too: ``5e-5`` and
    ``1e3`` are numbers, as a user writing ``--env-arg integrator_accuracy=5e-5`` means
    (PyYAML follows YAML 1.1, where they are strings: ``5.0e-5`` is its float)."""


ValueLoader.add_implicit_resolver("tag:yaml.org,2002:float",
                                  re.compile(f"^{_YAML11_FLOAT.pattern}$"), list("-+.0123456789"))




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


def config_differences(mine: dict, reference: dict) -> list[str]:
    """``field=mine vs reference`` for every field in which two configurations (as
    :meth:`Config.to_dict` gives them) differ, sorted by field: how a refusal names
    what to fix (ranks launched differently, a run directory resumed by a sweep)."""
    return [f"{key}={mine.get(key)!r} vs {reference.get(key)!r}"
            for key in sorted(set(mine) | set(reference)) if mine.get(key) != reference.get(key)]




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


def printable(key) -> str:
    """A YAML key as one printable line (keys may be numbers, null or hold line breaks)."""
    text = str(key)
    return text if text.isprintable() else repr(text)
