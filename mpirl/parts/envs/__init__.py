"""The environment part: vectors of gymnasium envs, and mpirl's own envs, registered
with gymnasium when this package is imported.

``L2Run-v0``
    NIPS 2017 Learning to Run on OpenSim (:mod:`mpirl.parts.envs.l2run`); needs the ``osim``
    extra: ``pip install -e '.[osim]'``.
``Delay-v0``
    a synthetic env with a tunable per-step cost (:mod:`mpirl.parts.envs.delay`), to emulate a
    slow simulator at any scale.

Keyword arguments reach them from ``--env-arg KEY=VALUE`` (repeatable) or the YAML
field ``env_arg``; :func:`check_env_args` validates them at start, before any rank
builds an environment.  Importing this package is cheap: OpenSim is imported only when
an ``L2Run-v0`` is made.
"""

from __future__ import annotations

import importlib.util

import gymnasium

from . import delay, l2run
from .snapshot import env_state, restore_env_state
from .vector import ActionRepeat, make_envs

#: id -> (entry point, the module whose KWARGS describe its keyword arguments)
ENVS = {
    "L2Run-v0": ("mpirl.parts.envs.l2run:L2RunEnv", l2run),
    "Delay-v0": ("mpirl.parts.envs.delay:DelayEnv", delay),
}

for _id, (_entry, _module) in ENVS.items():
    if _id not in gymnasium.registry:
        gymnasium.register(_id, entry_point=_entry)


def check_env_args(env_id: str, kwargs: dict) -> None:
    """Raise ValueError naming the first unusable keyword argument of ``env_id``."""
    if env_id not in ENVS:
        if kwargs:
            raise ValueError(f"env_arg is only for mpirl's own envs ({', '.join(ENVS)}); "
                             f"{env_id} takes none")
        return
    spec = ENVS[env_id][1].KWARGS
    for key, value in kwargs.items():
        if key not in spec:
            raise ValueError(f"{env_id} has no argument {key!r}; allowed: "
                             f"{', '.join(sorted(spec))}")
        kind, ok, allowed = spec[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool) \
                or not ok(value):
            raise ValueError(f"{env_id} argument {key}={value!r}; allowed: {allowed}")
    if env_id == "L2Run-v0":
        missing = [m for m in ("opensim", "osim") if importlib.util.find_spec(m) is None]
        if missing:
            raise ValueError(f"L2Run-v0 needs OpenSim and osim-rl ({', '.join(missing)} not "
                             "installed): pip install -e '.[osim]' (make test installs it)")


__all__ = ["ENVS", "ActionRepeat", "check_env_args", "env_state", "make_envs",
           "restore_env_state"]
