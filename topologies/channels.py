"""Request/reply channels: many clients, one server, fixed-size records (IMPALA, SEED, GA3C).

What travels is the caller's business (an unroll, one observation per env, a batch of
experience); this module moves bytes.  Every message is one contiguous numpy buffer
(a structured record viewed as bytes), sent with mpi4py's buffer methods: no headers
of its own, no pickling.

* A client sends a request (``send``), then waits for the reply (``wait_reply``): it has
  at most one request in flight, which bounds what the server must hold (one slot per
  client, SEED's "bounded queue", GA3C's one-slot reply queue) and gives back-pressure.
* The server pre-posts one receive per client, so a request is taken off the wire as
  soon as it arrives; ``wait_any`` returns one (arrival order), ``ready`` every one
  that has arrived (what a batching inference server drains).  A reply re-arms that
  client's receive (if its request was taken: a reply before any request, such as the
  first parameters, arms nothing), except a reply with ``last=True`` (a STOP).
* MPI moves a large reply's bytes (a rendezvous over TCP, say) and takes a request off
  the network only inside some MPI call, and MPICH's ch4 polls the network in a call only
  when shared memory made no progress in it.  A server that makes few calls while it
  computes, each finding shared-memory traffic (a learner fed by a replay rank on its
  node), would hold its replies and not see its clients' requests: with
  ``progress=True`` a thread of the server's own tests the replies in flight, and while
  none is, lets MPI progress (an ``Iprobe`` that matches nothing), polling with a
  back-off up to :data:`PROGRESS_PAUSE_S` (ranks run at MPI_THREAD_MULTIPLE).  Measured
  on the emulated cluster (docs/cluster.md): testing only its replies, apex's learner
  took its actors' requests in bursts about 32 s apart.
* A reply may be shorter than the client's reply buffer (a prefix: an acknowledgement
  without parameters); the client learns its length and tag from the probe.

Every wait has a deadline (:class:`DeadlineExceeded` names who was silent) and polls
with a back-off (up to :data:`PAUSE_S`), so a waiting rank does not spin a core its
neighbours need.
"""

from __future__ import annotations

import atexit
import threading

import numpy as np
from mpi4py import MPI

from .base import CommStats, TopologyError
from .paramserver import DeadlineExceeded, _testany, _wait_until

TAG_REQUEST = 61
#: longest sleep between polls of a wait: a parameter server's worker waits as finely for
#: its reply (paramserver.REPLY_PAUSE_S; the server for pushes up to 1 ms), as SEED's
#: actors wait once per env step (measured, seed at 4 ranks on 2 cores:
#: 3.2-3.5k env steps/s with 0.1 ms, 2.1-2.8k with 1 ms, no better with 0.02 ms)
PAUSE_S = 1e-4
#: longest sleep between a progress thread's polls
PROGRESS_PAUSE_S = 1e-3
#: the tag of the progress thread's probe: no message carries it
TAG_NONE = 32766


def as_bytes(record: np.ndarray) -> np.ndarray:
    """A C-contiguous array as a flat uint8 view (no copy)."""
    if not record.flags.c_contiguous:
        raise TopologyError("a channel message must be one C-contiguous buffer")
    return record.reshape(-1).view(np.uint8)


class ChannelServer:
    """The server's end: one pre-posted receive of ``nbytes`` per client."""

    def __init__(self, comm: MPI.Comm, clients: list[int], nbytes: int, *,
                 tag: int = TAG_REQUEST, progress: bool = False) -> None:
        self.comm, self.clients, self.tag = comm, list(clients), tag
        self.stats = CommStats()
        self.buffers = {c: np.empty(nbytes, dtype=np.uint8) for c in self.clients}
        self._recv = [self._post(c) for c in self.clients]
        self._send: dict[int, MPI.Request] = {}
        #: held while a request of ``_send`` is started, taken out or tested: a progress
        #: thread tests them too, and MPI forbids two threads testing one request
        #: (uncontended without one)
        self._lock = threading.Lock()
        #: replies completed by the progress thread (not by a wait of the server's own)
        self.progressed = 0
        self._progress: _ReplyProgress | None = None
        if progress:
            if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
                raise TopologyError("channel: a progress thread needs MPI_THREAD_MULTIPLE")
            self._progress = _ReplyProgress(self)

    def _post(self, client: int) -> MPI.Request:
        return self.comm.Irecv([self.buffers[client], MPI.BYTE], client, self.tag)

    def _take(self, index: int, status: MPI.Status) -> int:
        client = self.clients[index]
        got, want = status.Get_count(MPI.BYTE), self.buffers[client].size
        if got != want:
            raise TopologyError(f"channel: rank {client} sent {got} bytes, expected {want}")
        self._recv[index] = MPI.REQUEST_NULL
        self.stats.bytes_recv += got
        return client

    def wait_any(self, *, timeout_s: float | None, only=None) -> int:
        """The next client whose request has arrived (its bytes in ``buffers[client]``)."""
        self._check()
        reqs = self._recv if only is None else [
            r if c in only else MPI.REQUEST_NULL
            for c, r in zip(self.clients, self._recv, strict=True)]
        if all(r == MPI.REQUEST_NULL for r in reqs):
            raise TopologyError("channel: waiting on no client")
        status = MPI.Status()
        index = _wait_until(lambda: _testany(reqs, status), timeout_s,
                            f"channel: no request from ranks {sorted(only or self.clients)}",
                            self.stats, PAUSE_S)
        return self._take(index, status)

    def ready(self) -> list[int]:
        """Every client whose request has arrived, without waiting."""
        self._check()
        statuses = [MPI.Status() for _ in self.clients]
        indices = MPI.Request.Testsome(self._recv, statuses) or []
        if indices == MPI.UNDEFINED:
            return []
        return [self._take(i, statuses[k]) for k, i in enumerate(indices)]

    def reply(self, client: int, message: np.ndarray, *, tag: int, last: bool = False) -> None:
        """Send ``message`` (kept untouched until the next reply to ``client``) and listen
        for the client's next request, unless this is its ``last`` reply."""
        self._check()
        self._finish(client)
        data = as_bytes(message)
        with self._lock:
            self._send[client] = self.comm.Isend([data, MPI.BYTE], client, tag)
        if self._progress is not None:
            self._progress.wake.set()
        self.stats.calls += 1
        self.stats.messages_sent += 1
        self.stats.bytes_sent += data.size
        index = self.clients.index(client)
        if not last and self._recv[index] == MPI.REQUEST_NULL:   # its request was taken
            self._recv[index] = self._post(client)

    def pending(self) -> list[int]:
        """Clients whose receive is armed (a request of theirs is still expected)."""
        return [c for c, r in zip(self.clients, self._recv, strict=True) if r != MPI.REQUEST_NULL]

    def _check(self) -> None:
        """Raise the progress thread's error, if it ended by one: a dead thread would
        leave requests unseen and replies held, and the clients would time out naming
        this server instead."""
        if self._progress is not None:
            self._progress.check()

    def _finish(self, client: int) -> None:
        with self._lock:
            req = self._send.pop(client, None)
        if req is not None:
            req.Wait()

    def close(self, *, timeout_s: float | None) -> None:
        """Complete every reply; no client may still be expected to send."""
        self._check()
        waiting = self.pending()
        if waiting:
            raise TopologyError(f"channel closed with requests of ranks {waiting} expected")
        if self._progress is not None:
            self._progress.stop()
            self._progress.check()
        sends = list(self._send.values())
        _wait_until(lambda: MPI.Request.Testall(sends), timeout_s,
                    "channel: clients did not take their last reply")
        self._send.clear()


class _ReplyProgress:
    """A server's progress thread: poll with a back-off up to :data:`PROGRESS_PAUSE_S`
    (from the start again after each reply); each poll tests the replies in flight
    (``Testsome``, under the server's lock), dropping the finished ones, or, with none
    in flight, probes for a message that never comes (``Iprobe`` of :data:`TAG_NONE`:
    MPI's progress, so requests land).  Stopped by the server's ``close``, or at
    interpreter exit (before mpi4py finalizes MPI).  An error ends the thread and is
    raised again by the server's next ``reply`` or its ``close``."""

    def __init__(self, server: ChannelServer) -> None:
        self.server = server
        self.wake = threading.Event()
        self._stopping = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._guarded, name="mpirl-reply-progress",
                                       daemon=True)
        self.thread.start()
        atexit.register(self.stop)

    def _poll(self) -> None:
        """Test the replies in flight once, or with none, let MPI progress once."""
        sends = self.server._send
        with self.server._lock:
            if sends:
                done = MPI.Request.Testsome(list(sends.values()))   # done: REQUEST_NULL
                if done:
                    self.server.progressed += len(done)
                    for client in [c for c, r in sends.items() if r == MPI.REQUEST_NULL]:
                        del sends[client]
                return
        self.server.comm.Iprobe(MPI.ANY_SOURCE, TAG_NONE)

    def _guarded(self) -> None:
        try:
            self._run()
        except BaseException as err:         # raised again on the server's thread
            self.error = err

    def _run(self) -> None:
        pause = 0.0
        while not self._stopping:
            if self.wake.is_set():           # a new reply (or stop): poll closely again
                self.wake.clear()
                pause = 0.0
            self._poll()
            self.wake.wait(pause)
            pause = min(PROGRESS_PAUSE_S, pause * 2 or 1e-5)

    def check(self) -> None:
        """Raise the thread's error, if it ended by one."""
        if self.error is not None:
            raise TopologyError(f"channel: the progress thread failed: {self.error!r}") \
                from self.error

    def stop(self) -> None:
        """End the thread (it tests nothing more); the server then completes its replies."""
        if not self._stopping:
            self._stopping = True
            self.wake.set()
            self.thread.join()
            atexit.unregister(self.stop)


class ChannelClient:
    """A client's end: send a request, wait for the reply (deadline-bound)."""

    def __init__(self, comm: MPI.Comm, server: int, *, tag: int = TAG_REQUEST) -> None:
        self.comm, self.server, self.tag = comm, server, tag
        self.stats = CommStats()
        self._req: MPI.Request | None = None

    def send(self, message: np.ndarray) -> None:
        """Start sending ``message``; it must stay untouched until :meth:`wait_reply`."""
        data = as_bytes(message)
        self._req = self.comm.Isend([data, MPI.BYTE], self.server, self.tag)
        self.stats.calls += 1
        self.stats.messages_sent += 1
        self.stats.bytes_sent += data.size

    @property
    def in_flight(self) -> bool:
        """A request was sent whose reply has not been taken."""
        return self._req is not None

    def poll_reply(self, into: np.ndarray) -> tuple[int, int] | None:
        """The reply, if it has arrived (as :meth:`wait_reply`); else None at once."""
        status = MPI.Status()
        if not self.comm.Iprobe(self.server, MPI.ANY_TAG, status):
            return None
        return self._receive(into, status)

    def wait_reply(self, into: np.ndarray, *, timeout_s: float | None) -> tuple[int, int]:
        """Receive the reply into (a prefix of) ``into``: ``(tag, bytes received)``."""
        status = MPI.Status()
        _wait_until(lambda: self.comm.Iprobe(self.server, MPI.ANY_TAG, status), timeout_s,
                    f"rank {self.comm.Get_rank()}: no reply from rank {self.server}",
                    self.stats, PAUSE_S)
        return self._receive(into, status)

    def _receive(self, into: np.ndarray, status: MPI.Status) -> tuple[int, int]:
        data = as_bytes(into)
        tag, count = status.Get_tag(), status.Get_count(MPI.BYTE)
        if count > data.size:
            raise TopologyError(f"rank {self.comm.Get_rank()}: reply of {count} bytes from "
                                f"rank {self.server}, buffer holds {data.size}")
        self.comm.Recv([data[:count], MPI.BYTE], self.server, tag)
        self.stats.bytes_recv += count
        if self._req is not None:
            self._req.Wait()          # taken long ago: this only frees it
            self._req = None
        return tag, count


__all__ = ["ChannelClient", "ChannelServer", "DeadlineExceeded", "TAG_REQUEST", "as_bytes"]
