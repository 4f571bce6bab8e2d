"""What the replay designs (apex, gorila) move: n-step transitions, in fixed-shape records.

One transition is a numpy structured record (:meth:`TransitionLayout.transition`):
the observation, the action, the n-step return, the discount that multiplies the
bootstrap value (0 past an episode's end), the observation to bootstrap from, the
actor's initial priority (its |n-step TD error|; 1 at ``--replay-alpha 0``) and the
parameter version that acted.
Every field is 4 bytes wide, so a field of a record array is a strided view torch can
wrap (no int64 at an odd offset).

The messages are records too, each one contiguous buffer with a float64 ``meta``
head (field names in the ``*_META`` tuples), sent whole by the request/reply
channels of :mod:`topologies.channels`:

* a *block* (actor -> replay): ``block_size`` transitions, ``count`` of them used;
* a *sample request* (learner -> replay): the priorities of the learner's previous
  batch from that replay (slot, stamp, new |TD|), and "sample the next batch";
* a *batch* (replay -> learner): ``batch`` transitions with their slots, stamps and
  importance-sampling weights.
"""

from __future__ import annotations

import numpy as np
import torch

from .records import Fields

BLOCK_META = Fields("index", "count", "env_steps", "episodes", "return_sum", "recent_mean",
                    "last", "version")
SAMPLE_META = Fields("last", "updates", "beta")
BATCH_META = Fields("count", "inserted", "stored", "evicted", "sampled")


class TransitionLayout:
    """Record dtypes for observations of ``obs_shape``: blocks of ``block_size``
    transitions (actor -> replay) and batches of ``batch`` (replay -> learner).  An
    action is an index (``action_shape`` ``()``: DQN) or a float vector (SAC)."""

    def __init__(self, obs_shape: tuple[int, ...], block_size: int, batch: int,
                 action_shape: tuple[int, ...] = ()) -> None:
        self.obs_shape, self.block_size, self.batch = tuple(obs_shape), block_size, batch
        action = ("action", "i4") if not action_shape else ("action", "f4", tuple(action_shape))
        self.transition = np.dtype([("obs", "f4", self.obs_shape), action,
                                    ("ret", "f4"), ("disc", "f4"),
                                    ("next_obs", "f4", self.obs_shape), ("prio", "f4"),
                                    ("version", "i4")])
        self.block = np.dtype([("meta", "f8", (len(BLOCK_META),)),
                               ("trans", self.transition, (block_size,))])
        self.request = np.dtype([("meta", "f8", (len(SAMPLE_META),)), ("idx", "i8", (batch,)),
                                 ("stamp", "i8", (batch,)), ("prio", "f4", (batch,))])
        self.reply = np.dtype([("meta", "f8", (len(BATCH_META),)), ("idx", "i8", (batch,)),
                               ("stamp", "i8", (batch,)), ("weight", "f4", (batch,)),
                               ("trans", self.transition, (batch,))])

    def empty(self, kind: str) -> np.ndarray:
        """One zeroed record of ``kind``: block, request or reply."""
        return np.zeros(1, dtype=getattr(self, kind))

    def nbytes(self, kind: str) -> int:
        return getattr(self, kind).itemsize


def fill(records: np.ndarray, transitions: dict, priorities: np.ndarray, version: int) -> int:
    """Write ``transitions`` (tensors from :func:`mpirl.parts.learner.dqn.nstep_transitions`)
    and their priorities into the first records; returns how many."""
    n = len(priorities)
    out = records[:n]
    for name in ("obs", "action", "ret", "disc", "next_obs"):
        out[name] = transitions[name].numpy()
    out["prio"] = priorities
    out["version"] = version
    return n


def initial_priorities(learner, trans: dict, alpha: float) -> np.ndarray:
    """The priorities new transitions enter a replay with: ``learner``'s ``|td|`` from
    the actor's copy (Ape-X), or ones where the priority exponent ``alpha`` is 0.  There
    every stored priority is ``(|p| + eps) ** 0 = 1`` whatever ``p``, so the forward
    passes would change nothing: the same samples, weights and parameters, bit for bit,
    given the same order of events (a NaN ``|td|`` is then caught where the learner's
    priorities arrive, not here)."""
    if alpha == 0:
        return np.ones(len(trans["ret"]), np.float32)
    return learner.initial_priorities(trans["obs"], trans["action"], trans["ret"],
                                      trans["disc"], trans["next_obs"])


def as_batch(trans: np.ndarray, weights: np.ndarray | None = None) -> dict[str, torch.Tensor]:
    """Tensors for a replay learner's ``gradient`` (DQN's or SAC's) from transition
    records (copied once, out of the message buffer)."""
    n = len(trans)
    return {"obs": torch.from_numpy(np.ascontiguousarray(trans["obs"])),
            "action": torch.from_numpy(trans["action"].astype(np.int64)
                                       if trans["action"].dtype.kind == "i"
                                       else np.ascontiguousarray(trans["action"])),
            "ret": torch.from_numpy(np.ascontiguousarray(trans["ret"])),
            "disc": torch.from_numpy(np.ascontiguousarray(trans["disc"])),
            "next_obs": torch.from_numpy(np.ascontiguousarray(trans["next_obs"])),
            "weights": torch.from_numpy(np.ones(n, np.float32) if weights is None
                                        else np.ascontiguousarray(weights, np.float32))}
