"""Parameter server: the star topology used asynchronously (A3C, Gorila) or by quorum (DPPO).

One server rank (``root``) owns the parameters.  Each worker repeatedly *pushes* a flat
buffer (its gradient) to the server and *pulls* a flat buffer (fresh parameters) back.
Unlike the synchronous :class:`~topologies.star.Star`, the server answers each worker
on its own schedule, so workers never wait for each other; what the server does with a
pushed buffer (apply it at once, wait for a quorum, drop it) is the caller's business.
This module moves bytes only.

Protocol (all messages are the flat buffers themselves; no headers, no pickling):

* worker -> server, tag ``META``: a small float64 vector of ``meta_len`` numbers that the
  caller fills (e.g. env steps, episode statistics), then tag ``PUSH``: one buffer of
  ``count`` elements.  Both are sent at once (two ``Isend``), and the server has both
  receives pre-posted.
* server -> worker, tag ``PARAMS``: one buffer of ``count`` elements, the reply to that
  worker's last push; or tag ``STOP``: a 0-element message that ends the worker's loop.
  Two more reply tags carry the same buffer plus an instruction for the caller (the
  checkpoint snapshot of :mod:`mpirl.designs.paramserver`): ``SNAPSHOT`` (save a
  checkpoint now, then go on) and ``SNAPSHOT_STOP`` (save a checkpoint, then stop: no
  further push); :attr:`ParameterServer.snapshot` tells the worker which one came.
* A worker has at most one push outstanding (it waits for the reply before it pushes
  again), so the server keeps one pre-posted receive per worker and the version of
  the parameters each worker last received tells it how stale that worker's next push is.

The server's pre-posted receives mean a push is taken off the wire as soon as it
arrives, whatever the server is doing; ``wait_push`` returns pushes in arrival order
(``MPI_Waitany``) with a deadline, so a silent worker is reported, never waited on forever.
``wait_push(only=...)`` takes pushes from some workers alone; the others' pushes stay
where MPI put them until a later ``wait_push`` takes them.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from .base import MPI_DTYPES, BufferMismatchError, CommStats, TopologyError, check_buffer

TAG_PUSH = 51
TAG_PARAMS = 52
TAG_STOP = 53
TAG_META = 54
TAG_SNAPSHOT = 55          # parameters + "save a checkpoint, then go on"
TAG_SNAPSHOT_STOP = 56     # parameters + "save a checkpoint, then stop"
_PARAM_TAGS = (TAG_PARAMS, TAG_SNAPSHOT, TAG_SNAPSHOT_STOP)


class DeadlineExceeded(TimeoutError):
    """A blocking wait of the parameter server passed its deadline."""


class ParameterServer:
    """Push/pull exchange between workers and one server rank."""

    name = "paramserver"
    measures_wait = True      # stats.wait_s: time polling for a push (server) or a reply

    def __init__(self, comm: MPI.Comm = MPI.COMM_WORLD, *, root: int = 0,
                 meta_len: int = 0) -> None:
        self.comm = comm
        self.meta_len = meta_len
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        if self.size < 2:
            raise TopologyError("a parameter server needs at least 2 ranks (1 server, 1 worker)")
        if not 0 <= root < self.size:
            raise TopologyError(f"root={root!r}; allowed: 0..{self.size - 1}")
        self.root = root
        self.workers = [r for r in range(self.size) if r != root]
        self.is_server = self.rank == root
        self.stats = CommStats()
        self._recv_bufs: dict[int, np.ndarray] = {}
        self._meta_bufs: dict[int, np.ndarray] = {}
        self._send_bufs: dict[int, np.ndarray] = {}
        self._recv_reqs: list[MPI.Request] = []
        self._meta_reqs: list[MPI.Request] = []
        self._send_reqs: dict[int, MPI.Request] = {}
        self._push_reqs: list[MPI.Request] = []
        #: worker side: the last reply asked for a checkpoint (SNAPSHOT or SNAPSHOT_STOP)
        self.snapshot = False

    # -- worker side ------------------------------------------------------------------------
    def push(self, buf: np.ndarray, meta: np.ndarray | None = None) -> None:
        """Start sending ``meta`` and ``buf`` to the server; both must stay untouched until
        :meth:`pull` returns."""
        flat = check_buffer(buf)
        meta = np.zeros(0) if meta is None else meta
        if meta.dtype != np.float64 or meta.size != self.meta_len:
            raise TopologyError(f"meta must be float64 of {self.meta_len} numbers, got "
                                f"{meta.dtype} of {meta.size}")
        self._push_reqs = [self.comm.Isend([meta, MPI.DOUBLE], self.root, TAG_META),
                           self.comm.Isend([flat, MPI_DTYPES[flat.dtype]], self.root, TAG_PUSH)]
        self.stats.calls += 1
        self.stats.messages_sent += 2
        self.stats.bytes_sent += meta.nbytes + flat.nbytes

    def pull(self, buf: np.ndarray, *, timeout_s: float | None = None) -> bool:
        """Wait for the server's reply into ``buf``: True with fresh data, False on STOP
        or SNAPSHOT_STOP (the latter with fresh data).  Sets :attr:`snapshot`."""
        flat = check_buffer(buf)
        status = MPI.Status()
        _wait_until(lambda: self.comm.Iprobe(self.root, MPI.ANY_TAG, status), timeout_s,
                    f"worker {self.rank}: no reply from the parameter server", self.stats,
                    REPLY_PAUSE_S)
        tag = status.Get_tag()
        if tag == TAG_STOP:
            self.comm.Recv([flat[:0], MPI_DTYPES[flat.dtype]], self.root, TAG_STOP)
        else:
            if tag not in _PARAM_TAGS:
                raise TopologyError(f"worker {self.rank}: unexpected tag {tag} from the server")
            got = status.Get_count(MPI_DTYPES[flat.dtype])
            if got != flat.size:
                raise BufferMismatchError(
                    f"worker {self.rank}: server sent {got} elements, buffer holds {flat.size}")
            self.comm.Recv([flat, MPI_DTYPES[flat.dtype]], self.root, tag)
            self.stats.bytes_recv += flat.nbytes
        self.snapshot = tag in (TAG_SNAPSHOT, TAG_SNAPSHOT_STOP)
        stopped = tag in (TAG_STOP, TAG_SNAPSHOT_STOP)
        MPI.Request.Waitall(self._push_reqs)   # received long ago: this only frees them
        self._push_reqs = []
        return not stopped

    # -- server side ------------------------------------------------------------------------
    def open(self, count: int, dtype=np.float32, *, reply_count: int | None = None) -> None:
        """Allocate one receive buffer per worker (pushes of ``count`` elements) and one
        reply buffer (``reply_count`` elements, ``count`` unless given: the caller's
        replies may carry more than a push, e.g. state sent with the parameters), and
        pre-post a receive on each."""
        dtype = np.dtype(dtype)
        if dtype not in MPI_DTYPES:
            raise TopologyError(f"dtype {dtype}; allowed: float32, float64")
        replies = count if reply_count is None else reply_count
        self._recv_bufs = {w: np.empty(count, dtype=dtype) for w in self.workers}
        self._send_bufs = {w: np.empty(replies, dtype=dtype) for w in self.workers}
        self._meta_bufs = {w: np.empty(self.meta_len, dtype=np.float64) for w in self.workers}
        self._recv_reqs, self._meta_reqs = [], []
        for w in self.workers:
            self._post(w)

    def wait_push(self, *, timeout_s: float | None = None, only=None
                  ) -> tuple[int, np.ndarray, np.ndarray]:
        """The next push to arrive: ``(worker, buffer, meta)``; both arrays are valid until
        :meth:`reply` or :meth:`stop` is called for that worker.  ``only``: take pushes
        from these workers alone (the others' stay queued for a later call)."""
        status = MPI.Status()
        reqs = self._recv_reqs
        if only is not None:
            reqs = [r if w in only else MPI.REQUEST_NULL
                    for w, r in zip(self.workers, reqs, strict=True)]
        index = _wait_until(lambda: _testany(reqs, status), timeout_s,
                            "parameter server: no worker pushed", self.stats)
        worker = self.workers[index]
        buf = self._recv_bufs[worker]
        got = status.Get_count(MPI_DTYPES[buf.dtype])
        if got != buf.size:
            raise BufferMismatchError(
                f"parameter server: worker {worker} pushed {got} elements, expected {buf.size}")
        self._recv_reqs[index] = MPI.REQUEST_NULL
        meta_req, self._meta_reqs[index] = self._meta_reqs[index], MPI.REQUEST_NULL
        meta_req.Wait()   # sent before the buffer that has arrived: already here or close
        self.stats.bytes_recv += buf.nbytes + self._meta_bufs[worker].nbytes
        return worker, buf, self._meta_bufs[worker]

    def reply(self, worker: int, params: np.ndarray, *, tag: int = TAG_PARAMS) -> None:
        """Send a copy of ``params`` to ``worker`` and re-arm the receive for its next push
        (none after ``tag=TAG_SNAPSHOT_STOP``, the worker's last reply).

        The copy (one per reply, into this worker's own send buffer) is what lets the
        server go on updating ``params`` while the send is still in flight."""
        if tag not in _PARAM_TAGS:
            raise TopologyError(f"reply tag {tag}; allowed: {_PARAM_TAGS}")
        flat = check_buffer(params)
        self._finish_send(worker)
        copy = self._send_bufs[worker]
        np.copyto(copy, flat)
        self._send_reqs[worker] = self.comm.Isend([copy, MPI_DTYPES[copy.dtype]], worker, tag)
        self.stats.calls += 1
        self.stats.messages_sent += 1
        self.stats.bytes_sent += copy.nbytes
        if tag != TAG_SNAPSHOT_STOP and \
                self._recv_reqs[self.workers.index(worker)] == MPI.REQUEST_NULL:
            self._post(worker)      # its last push was taken: listen for the next one

    def stop(self, worker: int) -> None:
        """Tell ``worker`` to finish (its last push has been taken)."""
        self._finish_send(worker)
        buf = self._recv_bufs[worker]
        self._send_reqs[worker] = self.comm.Isend([buf[:0], MPI_DTYPES[buf.dtype]], worker,
                                                  TAG_STOP)

    def close(self, *, timeout_s: float | None = None) -> None:
        """Complete every outstanding send (no request left pending at MPI_Finalize)."""
        pending = [r for r in self._send_reqs.values() if r != MPI.REQUEST_NULL]
        _wait_until(lambda: MPI.Request.Testall(pending), timeout_s,
                    "parameter server: workers did not take their last reply")
        self._send_reqs.clear()
        for req in self._recv_reqs:
            if req != MPI.REQUEST_NULL:
                raise RuntimeError("parameter server closed with a worker's push still expected")

    def _post(self, worker: int) -> None:
        """(Re-)post the receives for ``worker``'s next push and its meta."""
        buf, meta = self._recv_bufs[worker], self._meta_bufs[worker]
        meta_req = self.comm.Irecv([meta, MPI.DOUBLE], worker, TAG_META)
        push_req = self.comm.Irecv([buf, MPI_DTYPES[buf.dtype]], worker, TAG_PUSH)
        if len(self._recv_reqs) < len(self.workers):     # first posting, from open()
            self._meta_reqs.append(meta_req)
            self._recv_reqs.append(push_req)
        else:
            index = self.workers.index(worker)
            self._meta_reqs[index], self._recv_reqs[index] = meta_req, push_req

    def _finish_send(self, worker: int) -> None:
        req = self._send_reqs.pop(worker, None)
        if req is not None:
            req.Wait()


#: longest sleep between a worker's polls for its reply, finer than a server's 1 ms: the
#: reply follows one optimizer step.  Measured side by side, 3 runs each, on 2 cores
#: (env steps/s, 1 ms -> 0.1 ms): gorila SAC on Pendulum at 2 ranks 135 -> 196; async
#: CartPole at 4 ranks 10.9k -> 12.5k, at 8 ranks 11.3k -> 11.9k
REPLY_PAUSE_S = 1e-4


def _testany(requests: list[MPI.Request], status: MPI.Status):
    index, flag = MPI.Request.Testany(requests, status)
    return index if flag and index != MPI.UNDEFINED else None


def _wait_until(poll, timeout_s: float | None, what: str, stats: CommStats | None = None,
                max_pause_s: float = 1e-3):
    """Call ``poll`` until it returns something truthy (or an int index); deadline-bound.

    Polls with a back-off from 0 to ``max_pause_s`` (1 ms) of sleep, so a waiting rank
    does not spin a core that an oversubscribed neighbour needs.  The time until the poll
    succeeds is added to ``stats.wait_s``."""
    start = time.perf_counter()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pause = 0.0
    while True:
        result = poll()
        if result is not None and result is not False:
            if stats is not None:
                stats.wait_s += time.perf_counter() - start
            return result
        if deadline is not None and time.monotonic() > deadline:
            raise DeadlineExceeded(f"{what} within {timeout_s:g} s")
        if pause:
            time.sleep(pause)
        pause = min(max_pause_s, pause * 2 or 1e-5)
