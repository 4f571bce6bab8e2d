"""The replay part: where experience waits between the actor that made it and the
learner that uses it.

The on-policy designs need no more than a first-in, first-out buffer: an async worker
keeps the rollout it learns from in one, for as many gradients as ``--update-repeat``
asks, across a checkpoint.

Beside it, Ape-X's proportional prioritized replay, in numpy alone: :class:`SumTree`
(sums and minimums over the priorities, batched updates, a vectorised descent),
:class:`PrioritizedReplay` (one preallocated structured array of transitions, a ring
that evicts the oldest, stratified proportional sampling with importance weights, and
priority updates that skip slots overwritten since they were sampled), and
:func:`beta_at`, the linear annealing of the weights' exponent.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np


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


def _check_count(name: str, value: Any, least: int) -> int:
    """``value`` as an int, or a ValueError naming it unless it is an integer >= ``least``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < least:
        raise ValueError(f"{name}={value!r}; allowed: an integer >= {least}")
    return int(value)


def _check_real(name: str, value: Any, low: float, high: float = np.inf, *,
                open_low: bool = False) -> float:
    """``value`` as a float, or a ValueError naming it unless it lies in the interval."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = np.nan
    if not (low < x if open_low else low <= x) or not x <= high or not np.isfinite(x):
        left, right = "(" if open_low else "[", "inf)" if high == np.inf else f"{high}]"
        raise ValueError(f"{name}={value!r}; allowed: a finite number in {left}{low}, {right}")
    return x


def _as_indices(indices: Any, bound: int, name: str = "indices") -> np.ndarray:
    """``indices`` as a flat int64 array, each in ``[0, bound)``, or a ValueError."""
    idx = np.asarray(indices)
    if idx.size == 0:
        return np.zeros(0, np.int64)
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"{name} has dtype {idx.dtype} and shape {idx.shape}; "
                         "allowed: a 1-d array of integers")
    if idx.min() < 0 or idx.max() >= bound:
        raise ValueError(f"{name} range over [{idx.min()}, {idx.max()}]; "
                         f"allowed: [0, {bound})")
    return idx.astype(np.int64, copy=False)


def _as_priorities(values: Any, size: int, name: str = "priorities") -> np.ndarray:
    """``values`` (a scalar broadcasts) as a float64 array of ``size`` finite numbers."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim == 0:
        v = np.full(size, float(v))
    if v.shape != (size,):
        raise ValueError(f"{name} has shape {v.shape}; allowed: ({size},), one per item")
    if not np.isfinite(v).all():
        raise ValueError(f"{name} hold {v[~np.isfinite(v)][:3]}; allowed: finite numbers")
    return v


class SumTree:
    """Sums and minimums over ``capacity`` non-negative leaves, in two float64 arrays.

    Node 1 is the root, node ``k`` has the children ``2k`` and ``2k + 1``, and the leaves
    are the nodes ``size .. 2 size - 1`` (``size``: ``capacity`` rounded up to a power of
    two, at least 2).  A leaf never set holds 0 in the sum tree and +inf in the min tree,
    so it neither adds to :attr:`total` nor lowers :attr:`min`.  Every update recomputes
    its leaves' ancestors from their children, so no round-off piles up over time."""

    def __init__(self, capacity: int) -> None:
        self.capacity = _check_count("capacity", capacity, 1)
        self.size = max(2, 1 << (self.capacity - 1).bit_length())
        self.depth = self.size.bit_length() - 1
        self._sum = np.zeros(2 * self.size, np.float64)
        self._min = np.full(2 * self.size, np.inf, np.float64)

    @property
    def total(self) -> float:
        """The sum over all leaves."""
        return float(self._sum[1])

    @property
    def min(self) -> float:
        """The smallest leaf ever set; +inf while none is."""
        return float(self._min[1])

    def __getitem__(self, indices: Any) -> np.ndarray:
        """The leaves' values (0 for a leaf never set)."""
        return self._sum[self.size + _as_indices(np.atleast_1d(indices), self.capacity)]

    def update(self, indices: Any, values: Any) -> None:
        """Set the leaves ``indices`` to ``values`` (where an index repeats, its last value
        wins), then recompute their ancestors, one level of the tree at a time."""
        idx = _as_indices(indices, self.capacity)
        val = _as_priorities(values, len(idx), "values")
        if (val < 0).any():
            raise ValueError(f"values hold {val[val < 0][:3]}; allowed: numbers >= 0")
        if not len(idx):
            return
        if len(idx) > 1 and not (idx[1:] > idx[:-1]).all():
            # each index once, ascending, with its last value: its first in the reversed batch
            last = len(idx) - 1 - np.unique(idx[::-1], return_index=True)[1]
            idx, val = idx[last], val[last]
        nodes = self.size + idx
        self._sum[nodes] = val
        self._min[nodes] = val
        for _ in range(self.depth):        # sorted stays sorted: drop repeats by a mask
            nodes = nodes >> 1
            nodes = nodes[np.concatenate(([True], nodes[1:] != nodes[:-1]))]
            left, right = 2 * nodes, 2 * nodes + 1
            self._sum[nodes] = self._sum[left] + self._sum[right]
            self._min[nodes] = np.minimum(self._min[left], self._min[right])

    def find(self, prefix: Any) -> np.ndarray:
        """For each ``u`` in ``prefix``, the leaf ``i`` with ``sum(leaves[:i]) <= u <
        sum(leaves[:i + 1])``: never a leaf of value 0.

        ``u`` is clamped into ``[0, total)`` first (to just below ``total``), and a descent
        that round-off lets land on a zero leaf steps to the nearest non-zero leaf to its
        left.  A ValueError if the tree sums to 0 or a ``u`` is NaN."""
        total = self.total
        if not total > 0:
            raise ValueError(f"the tree sums to {total}: there is no leaf to find")
        u = np.asarray(prefix, dtype=np.float64).ravel()
        if np.isnan(u).any():
            raise ValueError("prefix holds NaN; allowed: numbers in [0, total)")
        u = np.clip(u, 0.0, np.nextafter(total, 0.0))
        node = np.ones(len(u), np.int64)
        for _ in range(self.depth):
            left = 2 * node
            left_sum = self._sum[left]
            right = u >= left_sum
            u = np.where(right, u - left_sum, u)
            node = left + right
        zero = self._sum[node] <= 0
        if zero.any():
            node[zero] = self._nearest_live(node[zero])
        return node - self.size

    def _nearest_live(self, nodes: np.ndarray) -> np.ndarray:
        """For each leaf node in ``nodes``, the nearest leaf node to its left with a value
        above 0 (to its right where there is none to the left)."""
        live = self.size + np.flatnonzero(self._sum[self.size:] > 0)
        pos = np.searchsorted(live, nodes) - 1
        return np.where(pos >= 0, live[np.maximum(pos, 0)], live[0])


class PrioritizedReplay:
    """Ape-X's proportional prioritized replay over one preallocated structured array.

    ``fields`` (a structured dtype, or what ``np.dtype`` makes one of) describes one
    transition; :attr:`data` holds ``capacity`` of them as a ring, the oldest evicted when
    it is full.  A transition of priority ``p`` is stored with ``(|p| + eps) ** alpha`` in
    a :class:`SumTree` and sampled with probability proportional to it.  :attr:`stamp`
    holds, per slot, the insertion number of the record there (-1: never written), so
    that :meth:`update_priorities` skips a slot whose record was replaced since it was
    sampled.

    Counts: ``inserted`` records, ``evicted`` ones (overwritten, also inside one batch
    longer than the ring), ``sampled`` hand-outs, ``updated`` priorities set and
    ``stale_updates`` skipped; at every moment ``inserted == len(self) + evicted``."""

    def __init__(self, capacity: int, fields: Any, *, alpha: float = 0.6,
                 eps: float = 1e-6) -> None:
        self.capacity = _check_count("capacity", capacity, 1)
        self.alpha = _check_real("alpha", alpha, 0.0)
        self.eps = _check_real("eps", eps, 0.0, open_low=True)
        dtype = np.dtype(fields)
        if dtype.names is None:
            raise ValueError(f"fields={fields!r}; allowed: a structured dtype (named fields)")
        self.data = np.zeros(self.capacity, dtype)
        self.stamp = np.full(self.capacity, -1, np.int64)
        self._tree = SumTree(self.capacity)
        self._next = self._len = 0                 # the slot written next; records held
        self._max_seen = 0.0
        self.inserted = self.evicted = self.sampled = self.updated = self.stale_updates = 0

    def __len__(self) -> int:
        return self._len

    @property
    def max_priority(self) -> float:
        """The largest ``|p|`` (raw, before ``eps`` and ``alpha``) given to :meth:`add` or
        :meth:`update_priorities` so far (a stale update's too), 1.0 while there is none:
        the priority Ape-X gives new data whose own is not known yet."""
        return self._max_seen if self._max_seen > 0 else 1.0

    def priorities(self, indices: Any) -> np.ndarray:
        """The stored priorities ``(|p| + eps) ** alpha`` of the slots ``indices``."""
        return self._tree[indices]

    def _seen(self, priorities: np.ndarray) -> np.ndarray:
        """``priorities``, their largest magnitude noted for :attr:`max_priority`."""
        if len(priorities):
            self._max_seen = max(self._max_seen, float(np.abs(priorities).max()))
        return priorities

    def _stored(self, priorities: np.ndarray) -> np.ndarray:
        return (np.abs(priorities) + self.eps) ** self.alpha

    def add(self, records: np.ndarray, priorities: Any) -> np.ndarray:
        """Insert ``records`` (of :attr:`data`'s dtype) with their raw ``priorities`` (one
        each, or one for all), wrapping around the ring.  Of a batch longer than
        ``capacity`` only the last ``capacity`` records stay; all count as inserted, the
        ones overwritten as evicted.  Returns the slots written, in order: the record
        ``records[len(records) - len(slots) + j]`` now lives in ``slots[j]``."""
        records = np.asarray(records)
        if records.dtype != self.data.dtype or records.ndim != 1:
            raise ValueError(f"records have dtype {records.dtype} and shape "
                             f"{records.shape}; allowed: a 1-d array of {self.data.dtype}")
        k = len(records)
        prio = self._seen(_as_priorities(priorities, k))
        lost = k - min(k, self.capacity)             # overwritten within the batch itself
        start = (self._next + lost) % self.capacity
        run = min(k - lost, self.capacity - start)   # records up to the end of the ring
        ends = np.arange(start, start + run)
        wrapped = np.arange(k - lost - run)          # the rest, from slot 0
        self.data[start:start + run] = records[lost:lost + run]    # slices: no fancy copy
        self.data[:len(wrapped)] = records[lost + run:]
        self.stamp[start:start + run] = self.inserted + np.arange(lost, lost + run)
        self.stamp[:len(wrapped)] = self.inserted + np.arange(lost + run, k)
        stored = self._stored(prio[lost:])
        # ascending slots (the wrapped ones lie below ``start``): the tree's fast path
        self._tree.update(np.concatenate([wrapped, ends]),
                          np.concatenate([stored[run:], stored[:run]]))
        held = min(self._len + k, self.capacity)
        self.evicted += self._len + k - held
        self.inserted += k
        self._len, self._next = held, (self._next + k) % self.capacity
        return np.concatenate([ends, wrapped])

    def sample(self, n: int, rng: np.random.Generator, beta: float,
               out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``n`` slots drawn in proportion to their priorities, stratified (one uniform
        draw in each of ``n`` equal segments of ``[0, total)``), with replacement.

        Returns ``(indices, stamps, weights)``: the slots, their :attr:`stamp` (to hand
        back to :meth:`update_priorities`) and float32 importance weights
        ``(N P(i)) ** -beta`` divided by the largest possible one, ``(N p_min / total) **
        -beta`` (``N = len(self)``, ``p_min`` the smallest stored priority).  The records
        are ``self.data[indices]``; ``out`` (of :attr:`data`'s dtype, length >= n) gets
        them copied into ``out[:n]`` without a new allocation."""
        n = _check_count("n", n, 1)
        beta = _check_real("beta", beta, 0.0, 1.0)
        if not self._len:
            raise ValueError("the replay is empty: add transitions before sampling")
        if out is not None and (out.dtype != self.data.dtype or out.ndim != 1
                                or len(out) < n):
            raise ValueError(f"out has dtype {out.dtype} and shape {out.shape}; allowed: "
                             f"a 1-d array of {self.data.dtype}, length >= {n}")
        total = self._tree.total
        indices = self._tree.find((np.arange(n) + rng.random(n)) * (total / n))
        # (N P(i)) ** -beta / (N p_min / total) ** -beta, with N and total cancelled
        weights = (self._tree[indices] / self._tree.min) ** -beta
        if out is not None:
            np.take(self.data, indices, out=out[:n], mode="clip")
        self.sampled += n
        return indices, self.stamp[indices], weights.astype(np.float32)

    def update_priorities(self, indices: Any, stamps: Any, priorities: Any) -> int:
        """Set the raw ``priorities`` of the slots ``indices`` whose :attr:`stamp` still
        equals ``stamps`` (as :meth:`sample` handed them out); where a slot repeats, its
        last priority wins.  Returns how many were skipped as stale (overwritten since)."""
        idx = _as_indices(indices, self.capacity)
        stamps = np.asarray(stamps)
        if stamps.shape != idx.shape:
            raise ValueError(f"stamps have shape {stamps.shape}; allowed: {idx.shape}, "
                             "one per index")
        prio = self._seen(_as_priorities(priorities, len(idx)))
        live = self.stamp[idx] == stamps
        if self.alpha:       # at alpha 0 every stored priority is 1 and stays 1: no change
            self._tree.update(idx[live], self._stored(prio[live]))
        skipped = len(idx) - int(live.sum())
        self.updated += len(idx) - skipped
        self.stale_updates += skipped
        return skipped

    #: the counts a checkpoint keeps besides the records
    COUNTS = ("inserted", "evicted", "sampled", "updated", "stale_updates")

    def state(self) -> dict:
        """What continues this replay exactly (numpy arrays and numbers): the records held
        (slots ``0 .. len - 1``, as raw bytes), their stamps and stored priorities, the
        ring's next slot, the largest priority seen and the counts.  The sum tree is not
        kept: every update recomputes ancestors from their children, so the leaves
        rebuild it bit for bit."""
        n = self._len
        return {"records": self.data[:n].view(np.uint8), "itemsize": self.data.itemsize,
                "capacity": self.capacity,
                "stamp": self.stamp[:n], "priority": self._tree[np.arange(n)],
                "next": self._next, "max_seen": self._max_seen,
                **{key: getattr(self, key) for key in self.COUNTS}}

    def load_state(self, state: dict) -> None:
        """Continue from :meth:`state` (a replay of the same capacity and record layout:
        a ring's slots mean nothing in another; a ValueError otherwise)."""
        n = len(state["stamp"])
        # a file from before the capacity was kept (3f6541a): one that fits as it lies, a
        # ring never wrapped or full at this size, is taken for this replay's own
        fits = n == self.capacity or (n < self.capacity and int(state["next"]) == n)
        capacity = int(state.get("capacity", self.capacity if fits else n))
        if int(state["itemsize"]) != self.data.itemsize or capacity != self.capacity:
            raise ValueError(f"a saved replay of capacity {capacity}, records of "
                             f"{int(state['itemsize'])} bytes; this replay: capacity "
                             f"{self.capacity}, {self.data.itemsize} bytes (resume with the "
                             "run's own --replay-capacity and env)")
        self.data[:n] = np.asarray(state["records"], np.uint8).view(self.data.dtype)
        self.stamp[:n] = state["stamp"]
        self._tree.update(np.arange(n), state["priority"])
        self._len, self._next = n, int(state["next"])
        self._max_seen = float(state["max_seen"])
        for key in self.COUNTS:
            setattr(self, key, int(state[key]))


def beta_at(step: int, beta0: float, anneal_steps: int) -> float:
    """The importance-weight exponent at ``step``: linear from ``beta0`` at step 0 to 1 at
    ``anneal_steps`` and 1 after (``anneal_steps == 0``: ``beta0`` throughout)."""
    step = _check_count("step", step, 0)
    beta0 = _check_real("beta0", beta0, 0.0, 1.0)
    anneal_steps = _check_count("anneal_steps", anneal_steps, 0)
    if anneal_steps == 0:
        return beta0
    return beta0 + (1.0 - beta0) * min(step / anneal_steps, 1.0)
