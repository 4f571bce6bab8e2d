"""Parameters to actors by one broadcast through a topology (``--param-delivery broadcast``).

The default delivery is the per-actor push: the learner answers each actor's unroll (or
request) with a copy of its parameters, so its link carries ``actors x n`` bytes per
refresh.  Here the learner (rank 0 of ``group``) and its actors share a communicator,
and a refresh is one ``bcast`` of the flat parameters through the run's topology:

* ``ring``: a pipelined chain (segments, each forwarded as it lands): the learner's
  link carries ``n`` once, and the last actor holds the parameters about
  ``n beta + (p - 2)`` segment times after the start, not ``(p - 1) n beta``;
* ``tree`` / ``butterfly`` / ``rabenseifner``: a binomial tree (``ceil(lg p)`` rounds of
  ``n``); ``native``: ``MPI_Bcast``; ``star``: the per-actor push again, as a collective;
* ``hierarchical``: inside each node over shared memory, one copy per node on the link.

Actors are not in step with the learner or each other, so neither end broadcasts on its
own main thread: :class:`Publisher` and :class:`Subscriber` each run the broadcasts on a
thread of their own, which the main thread hands a snapshot (learner) or takes a
finished copy from (actor) between unrolls.  Before each broadcast the learner sends
every actor a doorbell (one 8-byte message: the version, or :data:`STOP`); an actor's
thread waits for it with a polling back-off (a waiting actor does not spin a core its
envs need), then joins the broadcast, so the collective itself starts with every member
present.  The learner starts a broadcast only once the previous one has left it
(:meth:`Publisher.offer` says False while one is in flight: the next update offers
again), so at most one snapshot is in flight per learner.

Numerics: a broadcast copies bytes; an actor's parameters are the learner's of the
version it reports, bit for bit, as with the push.
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
from mpi4py import MPI

import topologies
from topologies.paramserver import DeadlineExceeded, _wait_until

#: the doorbell's "no more broadcasts"
STOP = -1
TAG_DOORBELL = 71
#: longest sleep between polls while an actor's thread waits for the next doorbell
PAUSE_S = 1e-3


class Push:
    """``--param-delivery push``: no broadcasts (each reply carries the parameters); the
    designs call it as they would an end of a broadcast, and nothing happens."""

    pushes = True
    watched: tuple = ()                          # no traffic of its own to log

    def offer_every(self, params: np.ndarray, version: int, every: int) -> bool:
        return False

    def take(self, into: np.ndarray) -> int | None:
        return None

    def close(self, timeout_s: float | None) -> None:
        return None

    def counts(self, actors: int = 0) -> dict:
        return {}


class _Ends:
    """What both ends share: the topology over ``group``, the thread, its error."""

    pushes = False

    def __init__(self, group: MPI.Comm, spec: str, name: str) -> None:
        self.group = group
        self.owns_group = False                  # made by open_group: freed at the end
        self.topology = topologies.get(spec)(group)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._guarded, name=name, daemon=True)

    @property
    def watched(self) -> tuple:
        """What the run log counts of this end's traffic (its broadcasts' bytes)."""
        return (self.topology,)

    def _guarded(self) -> None:
        try:
            self._serve()
        except BaseException as err:             # raised again on the main thread
            self.error = err

    def _serve(self) -> None:
        raise NotImplementedError

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def _join(self, timeout_s: float | None, what: str) -> None:
        self.thread.join(timeout_s)
        self._check()
        if self.thread.is_alive():
            raise DeadlineExceeded(f"{what} within {timeout_s:g} s")
        if self.owns_group:
            self.group.Free()
            self.owns_group = False


class Publisher(_Ends):
    """The learner's end (rank 0 of ``group``): broadcast a snapshot of the parameters."""

    def __init__(self, group: MPI.Comm, spec: str, n_params: int) -> None:
        super().__init__(group, spec, "mpirl-publish")
        if group.Get_rank() != 0:
            raise ValueError("the publisher is rank 0 of its group")
        self.snapshot = np.empty(n_params, dtype=np.float32)
        #: version of the last broadcast started (0: the first parameters, which reach
        #: the actors otherwise, before any broadcast)
        self.delivered = 0
        self.broadcasts = 0
        self._busy = threading.Event()
        self._todo: queue.SimpleQueue = queue.SimpleQueue()
        self._bell = np.zeros(1, dtype=np.int64)   # one doorbell, read by every send
        self.thread.start()

    @property
    def in_flight(self) -> bool:
        """A broadcast has been offered and has not yet left this rank."""
        return self._busy.is_set()

    def offer(self, params: np.ndarray, version: int) -> bool:
        """Broadcast ``params`` as ``version`` unless a broadcast is still in flight."""
        self._check()
        if self._busy.is_set():
            return False
        self.snapshot[:] = params                  # the learner goes on updating its own
        self.delivered = version
        self._busy.set()
        self._todo.put(version)
        return True

    def offer_every(self, params: np.ndarray, version: int, every: int) -> bool:
        """:meth:`offer` once ``version`` is ``every`` past the last broadcast started."""
        return version - self.delivered >= every and self.offer(params, version)

    def counts(self, actors: int = 0) -> dict:
        """For the ledger: broadcasts started, and the copies ``actors`` should have got."""
        return {"broadcasts_sent": self.broadcasts,
                "broadcast_copies": self.broadcasts * actors}

    def close(self, timeout_s: float | None) -> None:
        """Let the broadcast in flight finish, ring STOP, end the thread."""
        self._todo.put(STOP)
        self._join(timeout_s, "parameter broadcast: the actors did not take the last one")

    def _serve(self) -> None:
        members = range(1, self.group.Get_size())
        while True:
            version = self._todo.get()
            self._bell[0] = version
            MPI.Request.Waitall([self.group.Isend(self._bell, m, TAG_DOORBELL)
                                 for m in members])
            if version == STOP:
                return
            self.topology.bcast(self.snapshot, root=0)
            self.broadcasts += 1
            self._busy.clear()


class Subscriber(_Ends):
    """An actor's end: join every broadcast; hand over the newest finished one."""

    def __init__(self, group: MPI.Comm, spec: str, n_params: int) -> None:
        super().__init__(group, spec, "mpirl-subscribe")
        self._buffers = np.empty((2, n_params), dtype=np.float32)   # filling, finished
        self._finished = 0                        # which row holds the newest finished one
        self._version = -1
        self._fresh = False
        self._lock = threading.Lock()
        self.received = 0
        #: the last broadcast's (doorbell arrived, broadcast finished), ``time.time()``
        #: seconds (one pair, not one per broadcast: a long run would grow a list)
        self.last_times = (float("nan"), float("nan"))
        self.thread.start()

    def take(self, into: np.ndarray) -> int | None:
        """Copy the newest broadcast not yet taken into ``into``; its version, or None."""
        self._check()
        with self._lock:
            if not self._fresh:
                return None
            into[:] = self._buffers[self._finished]
            self._fresh = False
            return self._version

    def counts(self, actors: int = 0) -> dict:
        """For the ledger: the broadcasts this actor joined."""
        return {"broadcasts_received": self.received}

    def close(self, timeout_s: float | None) -> None:
        """Wait for the learner's STOP doorbell (rung before its last replies)."""
        self._join(timeout_s, "parameter broadcast: no STOP from the learner")

    def _serve(self) -> None:
        bell = np.zeros(1, dtype=np.int64)
        while True:
            request = self.group.Irecv(bell, 0, TAG_DOORBELL)
            _wait_until(request.Test, None, "doorbell", max_pause_s=PAUSE_S)
            if bell[0] == STOP:
                return
            arrived = time.time()
            filling = 1 - self._finished
            self.topology.bcast(self._buffers[filling], root=0)
            with self._lock:
                self._finished, self._version, self._fresh = filling, int(bell[0]), True
            self.received += 1
            self.last_times = (arrived, time.time())


def open_group(comm: MPI.Comm, color: int | None, publishes: bool, spec: str,
               n_params: int) -> Publisher | Subscriber | None:
    """This rank's end of the group ``color`` of ``comm`` (collective over ``comm``; None:
    in no group, no end): one publisher per color, rank 0 of its group; the group is
    freed when the end closes."""
    group = comm.Split(MPI.UNDEFINED if color is None else color,
                       0 if publishes else comm.Get_rank() + 1)
    if color is None:
        return None
    end = (Publisher if publishes else Subscriber)(group, spec, n_params)
    end.owns_group = True
    return end


#: what a design holds for its parameter delivery: an end of a broadcast, or the push
Delivery = Publisher | Subscriber | Push


def open_ends(cfg, comm: MPI.Comm, color: int | None, publishes: bool,
              n_params: int) -> Delivery:
    """:func:`open_group` over ``cfg``'s topology where ``cfg.param_delivery`` is
    broadcast (collective over ``comm``; a rank in no group pushes nothing either);
    :class:`Push` otherwise."""
    if cfg.param_delivery != "broadcast":
        return Push()
    return open_group(comm, color, publishes, cfg.topology_spec, n_params) or Push()


__all__ = ["Delivery", "Publisher", "Push", "STOP", "Subscriber", "open_ends", "open_group"]
