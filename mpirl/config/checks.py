"""What every group of fields shares: a field with its help text, and the value checks
whose messages name the field, the value and what is allowed."""

from __future__ import annotations

from dataclasses import field

from ..errors import ConfigError


def doc(text: str, **kw):
    """A dataclass field whose help text is ``text`` (``--help`` prints it)."""
    return field(metadata={"help": text}, **kw)


def choice(name, value, allowed):
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not allowed; choose one of: {', '.join(allowed)}")


def at_least(name, value, low):
    if not value >= low:             # NaN is not >= anything: refused too
        raise ConfigError(f"{name}={value!r}; allowed: >= {low}")


def in_range(name, value, low, high, low_open=False):
    ok = (low < value if low_open else low <= value) and value <= high
    if not ok:
        bracket = "(" if low_open else "["
        raise ConfigError(f"{name}={value!r}; allowed: {bracket}{low}, {high}]")
