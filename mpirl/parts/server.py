"""The parameter-server part: what a server does with a push.  No MPI here.

A push is a worker's gradient computed on the parameter version it was last sent.  The
design that owns the server moves the bytes (:class:`topologies.paramserver.ParameterServer`),
applies the steps (its learner) and answers the workers; a policy below decides, push
by push, whether a step is due, on which gradient, and whose reply is due after it:

* :class:`AsyncPolicy` (A3C): apply every push at once; answer that worker alone.
  Nobody waits for anybody; the price is *staleness*, the number of updates the
  server made between sending a worker its parameters and applying the gradient
  computed on them.
* :class:`QuorumPolicy` (DPPO's leader): hold each push until ``quorum`` *fresh* ones
  (computed on the current parameters) have arrived, average what is held, take one
  step, answer every held worker.  A *late* push (computed on older parameters) is
  dropped, or with ``late="apply"`` averaged in with the fresh ones; either way its
  worker waits for the round.

Both count every push as applied or dropped, and keep the staleness of every applied
one, in the order applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .learner.optim import FlatAdam, FlatSGD


@dataclass
class Decision:
    """What the server does after a push: apply ``grad`` (None: no step now), then reply
    to the ``release``d workers, in that order."""

    grad: np.ndarray | None = None
    release: list[int] = field(default_factory=list)


class AsyncPolicy:
    """Apply each push on arrival (A3C)."""

    #: replies come in rounds (quorum): a snapshot then starts with the next round
    answers_in_rounds = False

    def __init__(self) -> None:
        self.version = 0                         # steps taken
        self.applied = self.dropped = 0
        self.staleness: list[int] = []           # of every applied push, in order
        self.sent_version: dict[int, int] = {}   # the version each worker was last sent

    def staleness_of(self, worker: int) -> int:
        return self.version - self.sent_version[worker]

    def push(self, worker: int, grad: np.ndarray, *, hold_all: int | None = None) -> Decision:
        """A push from ``worker``; ``hold_all`` (quorum only) is ignored."""
        self.staleness.append(self.staleness_of(worker))
        self.applied += 1
        return Decision(grad, [worker])

    def stepped(self) -> None:
        """The caller applied the decision's gradient."""
        self.version += 1

    def sent(self, worker: int) -> None:
        """The caller sent ``worker`` the current parameters."""
        self.sent_version[worker] = self.version

    def drop(self) -> None:
        """A push taken but not used (the budget was already spent)."""
        self.dropped += 1

    def state(self) -> dict:
        return {"version": self.version, "applied": self.applied, "dropped": self.dropped,
                "staleness": torch.tensor(self.staleness, dtype=torch.int64),
                "sent_version": dict(self.sent_version)}

    def load_state(self, state: dict) -> None:
        self.version, self.applied = state["version"], state["applied"]
        self.dropped = state["dropped"]
        self.staleness = state["staleness"].tolist()
        self.sent_version = dict(state["sent_version"])


class QuorumPolicy(AsyncPolicy):
    """Hold pushes until ``quorum`` fresh ones are in, then one step on their mean.

    Its :meth:`state` is that of a round boundary (a snapshot is a barrier round, so
    nothing is held at the cut); a round in progress is not part of it."""

    answers_in_rounds = True

    def __init__(self, quorum: int, late: str, count: int, dtype=np.float32) -> None:
        super().__init__()
        if quorum < 1 or late not in ("drop", "apply"):
            raise ValueError(f"quorum={quorum}, late={late!r}; allowed: quorum >= 1, "
                             "late 'drop' or 'apply'")
        self.quorum, self.late = quorum, late
        self.acc = np.zeros(count, dtype=dtype)  # sum of the held pushes that count
        self.held: list[int] = []                # workers waiting for the round's step
        self.in_acc = 0
        self.fresh = 0

    def push(self, worker: int, grad: np.ndarray, *, hold_all: int | None = None) -> Decision:
        """A push from ``worker``.  ``hold_all``: complete the round only once that many
        workers are held (a snapshot's barrier round)."""
        staleness = self.staleness_of(worker)
        if staleness == 0 or self.late == "apply":
            np.add(self.acc, grad, out=self.acc)
            self.in_acc += 1
            self.applied += 1
            self.staleness.append(staleness)
        else:
            self.dropped += 1
        self.fresh += staleness == 0
        self.held.append(worker)
        if self.fresh < self.quorum or (hold_all is not None and len(self.held) < hold_all):
            return Decision()
        np.divide(self.acc, self.in_acc, out=self.acc)
        release, self.held = self.held, []
        return Decision(self.acc, release)

    def stepped(self) -> None:
        super().stepped()
        self.acc[:] = 0.0
        self.in_acc = self.fresh = 0


class ShardOptimizer:
    """The optimizer of one parameter shard (a sharded server's, Gorila): Adam (or plain
    SGD) over ``params``, a flat float32 view into the server's parameter buffer, with
    a pushed gradient shard used in place.  No clipping here: a gradient is clipped by
    its global norm where it is whole, on the worker, before it is split.

    Adam and SGD act element by element, so S shards stepped on the slices of the same
    gradients end bit-identical to one unsharded optimizer (a test checks it)."""

    def __init__(self, params: np.ndarray, lr: float, kind: str = "adam") -> None:
        if kind not in ("adam", "sgd"):
            raise ValueError(f"kind={kind!r}; allowed: adam, sgd")
        self.tensor = torch.nn.Parameter(torch.from_numpy(params), requires_grad=False)
        self.opt = (FlatAdam if kind == "adam" else FlatSGD)(self.tensor, lr=lr)

    def step(self, grad: np.ndarray) -> None:
        self.tensor.grad = torch.from_numpy(grad)
        try:
            self.opt.step()
        finally:
            self.tensor.grad = None

    def state(self) -> dict:
        return self.opt.state_dict()
