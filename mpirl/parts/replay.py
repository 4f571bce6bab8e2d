"""The replay part: where experience waits between the actor that made it and the
learner that uses it.

Today's designs are on-policy, so a first-in, first-out buffer is all that lives here:
an async worker keeps the rollout it learns from in one, for as many gradients as
``--update-repeat`` asks, across a checkpoint.  A prioritized replay (Ape-X) belongs
beside it.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class FifoReplay:
    """First in, first out, each item handed out ``reuse`` times before it leaves.

    Adding to a full buffer evicts the oldest item.  Counts: ``inserted`` items,
    ``evicted`` before their last use, ``sampled`` hand-outs; at every moment
    ``inserted == len(self) + evicted + used up``."""

    def __init__(self, capacity: int, reuse: int = 1) -> None:
        if capacity < 1 or reuse < 1:
            raise ValueError(f"capacity={capacity}, reuse={reuse}; allowed: >= 1 each")
        self.capacity, self.reuse = capacity, reuse
        self._items: deque[list] = deque()        # [item, uses left]
        self.inserted = self.evicted = self.sampled = 0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: Any) -> None:
        if len(self._items) == self.capacity:
            self._items.popleft()
            self.evicted += 1
        self._items.append([item, self.reuse])
        self.inserted += 1

    def next(self) -> Any:
        """The oldest item; it leaves once it has been handed out ``reuse`` times."""
        if not self._items:
            raise IndexError("the replay is empty")
        entry = self._items[0]
        entry[1] -= 1
        if entry[1] == 0:
            self._items.popleft()
        self.sampled += 1
        return entry[0]

    def state(self, encode=lambda item: item) -> dict:
        """Items (through ``encode``, to checkpointable values) with their uses left."""
        return {"items": [[encode(item), left] for item, left in self._items],
                "inserted": self.inserted, "evicted": self.evicted, "sampled": self.sampled}

    def load_state(self, state: dict, decode=lambda item: item) -> None:
        self._items = deque([decode(item), int(left)] for item, left in state["items"])
        self.inserted, self.evicted = state["inserted"], state["evicted"]
        self.sampled = state["sampled"]
