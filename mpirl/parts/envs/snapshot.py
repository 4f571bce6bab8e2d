"""An env's dynamic state as text, and back: what lets a checkpoint continue a rollout.

Classic-control envs keep all of it in ``unwrapped.state``; gymnasium's MuJoCo envs in
their ``MjData``, whose whole integration state (``mj_getState`` with
``mjSTATE_INTEGRATION``: time, positions, velocities, actuator state, controls, the
solver's warm start) continues a simulation bit for bit.  Both add their RNG and the
time limit's step count.  Other envs (OpenSim, Delay-v0) cannot be captured, and a
resumed run reseeds them instead (it is then no longer bit-identical to an
uninterrupted one).
"""

from __future__ import annotations

import json

import numpy as np


def _mujoco(u):
    """The ``mujoco`` module when ``u`` is a MuJoCo env (a model and its data), else None."""
    if not (hasattr(u, "model") and hasattr(u, "data")):
        return None
    try:
        import mujoco
    except ImportError:
        return None
    return mujoco if isinstance(u.data, mujoco.MjData) else None


def _dynamic_state(u) -> dict | None:
    mujoco = _mujoco(u)
    if mujoco is not None:
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        state = np.empty(mujoco.mj_stateSize(u.model, spec), np.float64)
        mujoco.mj_getState(u.model, u.data, state, spec)
        return {"mujoco": state.tolist()}
    state = getattr(u, "state", None)
    if state is None:
        return None
    return {"state": np.asarray(state, dtype=np.float64).tolist(),
            "steps_beyond_terminated": getattr(u, "steps_beyond_terminated", None)}


def _set_dynamic_state(u, saved: dict) -> None:
    if "mujoco" in saved:
        mujoco = _mujoco(u)
        mujoco.mj_setState(u.model, u.data, np.asarray(saved["mujoco"], np.float64),
                           mujoco.mjtState.mjSTATE_INTEGRATION)
        return
    u.state = np.asarray(saved["state"], dtype=np.float64)
    if hasattr(u, "steps_beyond_terminated"):
        u.steps_beyond_terminated = saved["steps_beyond_terminated"]


def env_state(envs) -> str | None:
    """The dynamic state of every sub-env as JSON, or None when it cannot be captured
    (floats as JSON writes them: the shortest text that reads back to the same double)."""
    out = []
    for env in envs.envs:
        u = env.unwrapped
        state = _dynamic_state(u)
        if state is None:
            return None
        wrapper, elapsed = env, None
        while wrapper is not u:
            if hasattr(wrapper, "_elapsed_steps"):
                elapsed = wrapper._elapsed_steps
            wrapper = wrapper.env
        out.append({**state, "elapsed": elapsed, "rng": u.np_random.bit_generator.state})
    return json.dumps(out)


def restore_env_state(envs, text: str | None) -> bool:
    """Put the sub-envs back in the state :func:`env_state` saved; False (and nothing
    changed) when none could be saved."""
    if text is None:
        return False
    for env, saved in zip(envs.envs, json.loads(text), strict=True):
        u = env.unwrapped
        _set_dynamic_state(u, saved)
        u.np_random.bit_generator.state = saved["rng"]
        wrapper = env
        while wrapper is not u:
            if hasattr(wrapper, "_elapsed_steps"):
                wrapper._elapsed_steps = saved["elapsed"]
            if hasattr(wrapper, "_has_reset"):
                wrapper._has_reset = True
            wrapper = wrapper.env
    return True
