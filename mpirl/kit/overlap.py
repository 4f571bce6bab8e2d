"""The gradient exchanged in buckets while backward is still producing it (``--overlap``).

PyTorch DDP's ``bucket_cap_mb`` and Horovod's fusion buffer: backward computes the last
layer's gradient first, so the flat gradient buffer is cut, from its end, into buckets of
whole tensors of about ``--bucket-mb`` MiB each; a bucket's allreduce starts as soon as
every tensor in it has its gradient (``register_post_accumulate_grad_hook``), on one
communication thread, while autograd goes on with the layers below.  Each bucket is a
contiguous slice of the one flat buffer, averaged in place by the topology: no packing,
no copy, one buffer per exchange as before, just several exchanges per update.

Buckets are started in one fixed order on every rank (the order backward finishes them
on rank 0 need not be another rank's): bucket j goes out once it and every bucket
before it are complete, so every rank runs the same collectives in the same order.  The
sync loop reads as the algorithm::

    pending = overlap.start(update)     # nothing sent yet: the hooks are armed
    learner.gradient(batch)             # backward; buckets leave as they fill
    pending.wait()                      # what is left, and every bucket's end

:class:`Whole` is the same three steps without overlap (the whole buffer, averaged in
:meth:`wait`), so the loop is one loop either way.

Numerics: each bucket is summed by the topology on its own, so a topology whose order
of additions depends on the buffer's length (ring's chunks, rabenseifner's halves) sums
in another order than over the whole buffer; butterfly, tree, star and MPI's own add
element by element in an order that does not depend on the length, so their bytes are
the same with and without overlap (tested).  Every replica still gets the same bytes.
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np

from ..resilience.exchange import Exchange

MIB = 1 << 20


def buckets(sizes: list[int], itemsize: int,
            bucket_bytes: float) -> list[tuple[int, int, list[int]]]:
    """``(lo, hi, tensors)`` per bucket: runs of whole tensors, taken from the end of a
    flat buffer holding tensors of ``sizes`` elements in order, each run closed once it
    holds ``bucket_bytes`` (the last one: whatever is left)."""
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    out, hi, members, held = [], int(offsets[-1]), [], 0
    for t in range(len(sizes) - 1, -1, -1):
        members.append(t)
        held += sizes[t] * itemsize
        if held >= bucket_bytes:
            out.append((int(offsets[t]), hi, members))
            hi, members, held = int(offsets[t]), [], 0
    if members:
        out.append((0, hi, members))
    return out


class Whole:
    """No overlap: :meth:`wait` averages the whole buffer (the plain exchange)."""

    def __init__(self, exchange: Exchange, grad: np.ndarray) -> None:
        self.exchange, self.grad = exchange, grad
        self.update = 0

    def start(self, update: int) -> Whole:
        self.update = update
        return self

    def close(self) -> None:
        """Nothing to end (:meth:`Overlap.close`'s twin)."""

    def wait(self) -> None:
        self.exchange.average(self.grad, self.update)


class Overlap:
    """Buckets of ``flat`` (a :class:`~mpirl.parts.learner.flat.FlatParams`) averaged by
    ``exchange`` on a thread of their own while backward runs."""

    def __init__(self, exchange: Exchange, flat, bucket_mb: float) -> None:
        self.exchange = exchange
        grad = flat.grad_np
        sizes = [t.numel() for t in flat.tensors]
        self.plan = buckets(sizes, grad.itemsize, bucket_mb * MIB)
        #: each bucket's slice of the gradient: the same array object every update (the
        #: topologies' small-message path plans per array)
        self.views = [grad[lo:hi] for lo, hi, _ in self.plan]
        self._left = [0] * len(self.plan)
        self._members = [len(members) for _, _, members in self.plan]
        self._next = 0                         # the next bucket to start, in order
        self._armed = False                    # between start() and wait()
        self._update = 0
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._done = threading.Semaphore(0)
        self._error: BaseException | None = None
        #: per bucket of the last update: (started, ended) seconds after :meth:`start`
        self.times: list[tuple[float, float]] = [(0.0, 0.0)] * len(self.plan)
        self._t0 = 0.0
        for j, (_, _, members) in enumerate(self.plan):
            for t in members:
                flat.tensors[t].register_post_accumulate_grad_hook(
                    lambda _, j=j: self._filled(j))
        self._thread = threading.Thread(target=self._serve, name="mpirl-overlap", daemon=True)
        self._thread.start()

    def start(self, update: int) -> Overlap:
        """Arm the buckets for ``update``'s backward (nothing is sent yet)."""
        with self._lock:
            self._update, self._next, self._t0 = update, 0, time.perf_counter()
            self._left = list(self._members)
            self._armed = True
        return self

    def _filled(self, j: int) -> None:
        """A tensor of bucket ``j`` has its gradient (autograd's thread)."""
        with self._lock:
            if self._armed:                  # a backward outside start/wait sends nothing
                self._left[j] -= 1
                self._release()

    def _release(self) -> None:
        """Start every bucket whose turn it is and whose tensors are all done."""
        while self._next < len(self.plan) and self._left[self._next] <= 0:
            self._queue.put(self._next)
            self._next += 1

    def wait(self) -> None:
        """Start what backward left (tensors the loss did not reach have no hook call),
        then block until every bucket is averaged; a bucket's error is raised here."""
        with self._lock:
            self._armed = False
            self._left = [0] * len(self.plan)
            self._release()
        for _ in range(len(self.plan)):
            self._done.acquire()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        """End the exchange's thread (nothing may be in flight: after :meth:`wait`)."""
        self._queue.put(None)
        self._thread.join()

    def _serve(self) -> None:
        while True:
            j = self._queue.get()
            if j is None:
                return
            t = time.perf_counter()
            try:
                if self._error is None:          # after a failure: only count them down
                    self.exchange.average(self.views[j], self._update)
            except BaseException as err:         # handed to the loop's thread by wait()
                self._error = err
            self.times[j] = (t - self._t0, time.perf_counter() - self._t0)
            self._done.release()
