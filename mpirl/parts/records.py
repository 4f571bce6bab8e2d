"""The numbers a message carries at its head: one kind of record for every message.

Every record that travels (a push, an unroll, a block of transitions, a sample request
or batch, a parameter request or reply) starts with a few float64 numbers; their names,
in order, are a :class:`Fields`, and a number is found by its name, one way everywhere:
``meta[PUSH_META["env_steps"]]``.
"""

from __future__ import annotations


class Fields(tuple):
    """The names of a record's head numbers, in order: a tuple of names, and
    ``fields[name]`` a name's position."""

    def __new__(cls, *names: str) -> "Fields":
        fields = super().__new__(cls, names)
        fields.at = {name: i for i, name in enumerate(names)}
        return fields

    def __getitem__(self, key):
        if isinstance(key, str):
            try:
                return self.at[key]
            except KeyError:
                raise KeyError(f"no field {key!r}; fields: {', '.join(self)}") from None
        return super().__getitem__(key)
