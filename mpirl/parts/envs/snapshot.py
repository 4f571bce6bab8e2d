"""An env's dynamic state as text, and back: what lets a checkpoint continue a rollout.

Classic-control envs keep all of it in ``unwrapped.state`` (plus their RNG and the
time limit's step count); other envs (OpenSim, Delay-v0) cannot be captured, and a
resumed run reseeds them instead (it is then no longer bit-identical to an
uninterrupted one).
"""

from __future__ import annotations

import json

import numpy as np

def env_state(envs) -> str | None:
    """The dynamic state of every sub-env as JSON, or None when it cannot be captured."""
    out = []
    for env in envs.envs:
        u = env.unwrapped
        state = getattr(u, "state", None)
        if state is None:
            return None
        wrapper, elapsed = env, None
        while wrapper is not u:
            if hasattr(wrapper, "_elapsed_steps"):
                elapsed = wrapper._elapsed_steps
            wrapper = wrapper.env
        out.append({"state": np.asarray(state, dtype=np.float64).tolist(),
                    "steps_beyond_terminated": getattr(u, "steps_beyond_terminated", None),
                    "elapsed": elapsed,
                    "rng": u.np_random.bit_generator.state})
    return json.dumps(out)


def restore_env_state(envs, text: str | None) -> bool:
    """Put the sub-envs back in the state :func:`env_state` saved; False (and nothing
    changed) when none could be saved."""
    if text is None:
        return False
    for env, saved in zip(envs.envs, json.loads(text), strict=True):
        u = env.unwrapped
        u.state = np.asarray(saved["state"], dtype=np.float64)
        if hasattr(u, "steps_beyond_terminated"):
            u.steps_beyond_terminated = saved["steps_beyond_terminated"]
        u.np_random.bit_generator.state = saved["rng"]
        wrapper = env
        while wrapper is not u:
            if hasattr(wrapper, "_elapsed_steps"):
                wrapper._elapsed_steps = saved["elapsed"]
            if hasattr(wrapper, "_has_reset"):
                wrapper._has_reset = True
            wrapper = wrapper.env
    return True
