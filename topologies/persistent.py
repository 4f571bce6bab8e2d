"""The small-message path: a topology's call planned once per buffer, then replayed.

Below about 64 KiB an exchange's time is mostly Python's, not the wire's: every message
of a home-made topology parses its buffer specs, builds and starts a request, reads its
status back and updates counters, and that is microseconds per message where MPICH,
inside one C call, spends a fraction of one.  A topology's data flow does not depend on
the data: for one buffer (the same memory, length and dtype) it sends the same slices
to the same peers every call.  So its first repeated call is *recorded* instead of sent:
while recording, ``_send``/``_recv``/``_sendrecv`` create persistent requests
(``MPI_Send_init``/``MPI_Recv_init``) on the very slices they were given and ``_add``
notes which slices it adds; every later call *replays* the schedule: per step one
``Startall`` + ``Waitall`` of the requests that the blocking call would have made, then
the recorded adds, in the recorded order.  The algorithm stays written once, as blocking
calls, in its own file; this module knows nothing of which algorithm it replays.

What a replay keeps from the blocking path:

* the same messages in the same order, so the same sums in the same order: parameters'
  SHA-256 are those of the blocking path (``tests/topologies`` checks it);
* every received message's length is checked (``Get_count`` on its status) and a longer
  one raises :class:`~topologies.base.BufferMismatchError`, as before;
* an MPI error (a dead peer under ULFM) is raised as the error it is, not as
  ``MPI_ERR_IN_STATUS``;
* the same :class:`~topologies.base.CommStats`, added once per call.

Only buffers up to :data:`MAX_BYTES` are planned: above it a message's fixed cost is
under a percent of its transfer, and a schedule keeps its buffer alive (persistent
requests point at its memory).  At most :data:`KEPT` schedules are kept per topology,
the least recently used dropped first, and a buffer is planned only when the same live
array comes back (among the last :data:`SIGHTED` seen), so a caller passing a fresh
array each call pays nothing and pins nothing, and buffers that take turns
(``--overlap``'s buckets) are each planned.  A call whose schedule was dropped to make
room (among the last :data:`DROPPED`) is not planned again but takes the blocking path:
a caller cycling through more calls than are kept (top-k's leader, whose broadcast has
a new root every call, more buckets than :data:`KEPT`) would otherwise record, drop and
record again forever; this way the calls that fit stay planned and the rest pay
nothing more than the blocking path.  Requests are freed when a schedule is
dropped or collected and at interpreter exit, before mpi4py finalizes MPI; when a
replay fails (a dead peer, a mismatched length) the requests its ``Waitall`` left
unfinished are left to MPI instead (freeing one still active towards a dead peer is
fatal under Open MPI's ULFM).
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from typing import Callable

import numpy as np
from mpi4py import MPI

#: the environment variable that sets :data:`MAX_BYTES` (0 turns the path off), as
#: MPICH's CVARs tune its collectives: for measuring what the path buys in situ
ENV_MAX_BYTES = "MPIRL_SMALL_PATH_BYTES"


def _max_bytes() -> tuple[int, str | None]:
    """``(bytes, None)``, or ``(0, the error)`` for a value that is not a byte count: the
    error is raised where a topology is built (``topologies.base.check_env``), not at
    import, so that ``mpirl.run`` reports it as one line at start-up."""
    text = os.environ.get(ENV_MAX_BYTES, "65536")
    if not text.isdigit():
        return 0, (f"{ENV_MAX_BYTES}={text!r}; allowed: a byte count >= 0 "
                   "(0 turns the small-message path off; default 65536)")
    return int(text), None


#: the largest buffer (bytes) planned as a schedule (default 64 KiB), and the error of a
#: bad :data:`ENV_MAX_BYTES`
MAX_BYTES, ENV_ERROR = _max_bytes()


#: the environment variable that turns the C replay off (``0``) or on (``1``, the
#: default where it is built): for measuring what it buys, side by side
ENV_NATIVE = "MPIRL_SMALL_PATH_NATIVE"


def _load_native():
    """``(module, None)``: the C replay (``topologies/_replay.c``, built into the venv by
    ``python -m topologies.build_replay``) where it is built against the MPI library that
    mpi4py loaded; ``(None, None)`` where it is not (no compiler, another MPI: the Python
    replay runs, the same steps); ``(None, error)`` for a bad :data:`ENV_NATIVE`."""
    text = os.environ.get(ENV_NATIVE, "1")
    if text not in ("0", "1"):
        return None, (f"{ENV_NATIVE}={text!r}; allowed: 1 (replay small schedules in C "
                      "where it is built, the default) or 0 (in Python)")
    if text == "0":
        return None, None
    try:
        import _mpirl_replay as native
    except ImportError:
        return None, None
    same = (native.request_size == MPI._sizeof(MPI.Request)
            and native.datatype_size == MPI._sizeof(MPI.Datatype)
            and native.library_version.strip() == MPI.Get_library_version().strip())
    return (native if same else None), None


#: the C replay, or None; and the error of a bad :data:`ENV_NATIVE`
NATIVE, NATIVE_ERROR = _load_native()
ENV_ERROR = ENV_ERROR or NATIVE_ERROR
#: op codes of a compiled schedule (``topologies/_replay.c``)
_EXCHANGE, _ADD = 1, 2
#: the dtypes the C replay adds, by its code
_NATIVE_ADD = {np.dtype(np.float32): 0, np.dtype(np.float64): 1}


#: schedules kept per topology (least recently used dropped first)
KEPT = 4
#: arrays remembered as seen once, so that one coming back is planned (several: buffers
#: that take turns, as ``--overlap``'s buckets or a cast's per-length buffers, come back
#: every update but not twice in a row)
SIGHTED = 2 * KEPT
#: calls whose schedule was dropped for room, remembered so as not to plan them again
DROPPED = 4 * KEPT


class Schedule:
    """One recorded call of ``topo`` (a :class:`~topologies.base.Topology`): steps of
    ``(requests, statuses, receives)`` or ``(dst, src)`` adds, replayed in order by
    :meth:`run`."""

    def __init__(self, topo) -> None:
        self.topo = topo
        self.owner: np.ndarray | None = None       # the caller's array, kept alive
        self.steps: list[tuple] = []
        self.requests: list[MPI.Prequest] = []
        self.messages_sent = self.bytes_sent = self.bytes_recv = 0
        #: the requests a failed Waitall left unfinished (see :meth:`abandon`)
        self.unfinished: list[MPI.Prequest] = []
        #: the C replay's arguments once :meth:`compile` wrote its program, and the
        #: program's arrays (kept alive with it), and each exchange's step by its word
        self.native: tuple[int, int, int] | None = None
        self.program = self.handles = None
        self._step_at: dict[int, int] = {}
        # frees the requests when the schedule is dropped or collected, or at exit
        self._free = weakref.finalize(self, _free_requests, self.requests)

    # -- recording (called by Topology._send/_recv/_sendrecv/_add) -----------------------
    def message(self, sends: list[tuple[np.ndarray, int]],
                recvs: list[tuple[np.ndarray, int]], tag: int, datatype: MPI.Datatype) -> None:
        """One blocking call's messages: ``sends`` and ``recvs`` as (slice, peer), all of
        MPI type ``datatype``."""
        comm = self.topo.comm
        requests = [comm.Send_init([buf, datatype], dest, tag) for buf, dest in sends]
        first_recv = len(requests)
        requests += [comm.Recv_init([buf, datatype], source, tag) for buf, source in recvs]
        statuses = [MPI.Status() for _ in requests]
        receives = [(statuses[first_recv + i], buf, source, datatype)
                    for i, (buf, source) in enumerate(recvs)]
        self.requests += requests
        self.steps.append((requests, statuses, receives))
        self.messages_sent += len(sends)
        self.bytes_sent += sum(buf.nbytes for buf, _ in sends)
        self.bytes_recv += sum(buf.nbytes for buf, _ in recvs)

    def add(self, dst: np.ndarray, src: np.ndarray) -> None:
        self.steps.append((dst, src))

    def compile(self, native) -> None:
        """Write the recorded steps as a program for the C replay ``native`` (the loaded
        :data:`NATIVE`, or None), if it can add every dtype recorded; else :meth:`run`
        replays in Python."""
        if native is None:
            return
        # handles as MPI's C types hold them (mpi4py may give them sign-extended)
        mask = (1 << 8 * native.request_size) - 1
        type_mask = (1 << 8 * native.datatype_size) - 1
        words, handles, step_at = [], [], {}
        for index, step in enumerate(self.steps):
            if len(step) == 2:
                dst, src = step
                code = _NATIVE_ADD.get(dst.dtype)
                if code is None or src.dtype != dst.dtype or dst.size != src.size:
                    return
                words += [_ADD, code, dst.size, _address(dst), _address(src)]
                continue
            requests, statuses, receives = step
            if len(requests) > native.max_requests:
                return
            first_recv = len(requests) - len(receives)
            step_at[len(words)] = index
            words += [_EXCHANGE, len(requests), len(handles), len(receives)]
            for i, (_, buf, _, datatype) in enumerate(receives):
                words += [first_recv + i, buf.size, MPI._handleof(datatype) & type_mask]
            words += [MPI._addressof(status) for status in statuses]
            handles += [MPI._handleof(request) for request in requests]
        handles_array = np.array([h & mask for h in handles],
                                 dtype=np.dtype(f"u{native.request_size}"))
        self.program = np.array(words, dtype=np.int64)
        self.handles = handles_array
        self._step_at = step_at
        self.native = (_address(handles_array), _address(self.program), self.program.size)
        self.replay = native.run

    # -- replay ------------------------------------------------------------------------
    def run(self) -> None:
        native = self.native
        if native is not None:
            failed = self.replay(*native)
            if failed is not None:      # (word of the exchange, MPI error or -1: a count)
                at, code = failed
                self._check(self.steps[self._step_at[at]],
                            None if code == -1 else MPI.Exception(code))
                raise AssertionError("the C replay reported a wrong count that is not")
        else:
            self._run_in_python()
        stats = self.topo.stats
        stats.messages_sent += self.messages_sent
        stats.bytes_sent += self.bytes_sent
        stats.bytes_recv += self.bytes_recv

    def _run_in_python(self) -> None:
        for step in self.steps:
            if len(step) == 2:
                np.add(step[0], step[1], out=step[0])
                continue
            requests, statuses, _ = step
            MPI.Prequest.Startall(requests)
            try:
                MPI.Request.Waitall(requests, statuses)
            except MPI.Exception as err:
                self._check(step, err)
            self._check(step)

    def _check(self, step: tuple, err: MPI.Exception | None = None) -> None:
        """Raise what went wrong in the exchange ``step`` (its statuses filled in, by
        Python's Waitall or copied back by the C replay): ``err``, its Waitall's error,
        or else a received length that is not its buffer's."""
        requests, statuses, receives = step
        if err is not None:
            self.unfinished = _unfinished(err, requests, statuses)
            _raise_from_statuses(self.topo, err, statuses, receives)
        for status, buf, source, datatype in receives:
            if status.Get_count(datatype) != buf.size:
                self.topo._check_count(status, buf, source)      # raises, naming both

    def free(self) -> None:
        """Free the persistent requests (an active one once it completes)."""
        self.steps, self.owner, self.native = [], None, None
        self._free()

    def abandon(self) -> None:
        """Drop a schedule whose replay failed: free its requests except those the failed
        ``Waitall`` left unfinished (towards a dead peer, say): Open MPI (ULFM) treats the
        completion of a freed request as fatal ("error after request freed"), so those
        few handles are left to MPI, once per failure."""
        unfinished = {id(r) for r in self.unfinished}
        self.requests[:] = [r for r in self.requests if id(r) not in unfinished]
        self.free()


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def _free_requests(requests: list) -> None:
    """Free persistent requests while MPI is still up.  Run once per schedule: when it is
    dropped, when it is collected with its topology, or at interpreter exit (weakref's
    finalizers run from Python's atexit, before mpi4py finalizes MPI), so that MPICH
    does not warn about requests left at MPI_Finalize."""
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    for request in requests:
        try:
            if request != MPI.REQUEST_NULL:
                request.Free()
        except MPI.Exception:        # a revoked or freed communicator: nothing to free
            pass
    requests.clear()


def _unfinished(err: MPI.Exception, requests: list, statuses: list) -> list:
    """The requests a failed ``Waitall`` left active: those whose status says
    ``MPI_ERR_PENDING``, or all of them when the error did not come per status."""
    if err.Get_error_class() != MPI.ERR_IN_STATUS:
        return list(requests)
    return [r for r, s in zip(requests, statuses, strict=True)
            if s.Get_error() == MPI.ERR_PENDING]


def _raise_from_statuses(topo, err: MPI.Exception, statuses, receives):
    """Raise what went wrong as the blocking call would: a truncated receive as a
    BufferMismatchError, any other error as itself (not ``MPI_ERR_IN_STATUS``)."""
    if err.Get_error_class() != MPI.ERR_IN_STATUS:
        raise err
    for status, buf, source, _ in receives:
        code = status.Get_error()
        if code != MPI.SUCCESS:
            topo._raise_mismatch(MPI.Exception(code), buf, source)
    for status in statuses:
        code = status.Get_error()
        if code not in (MPI.SUCCESS, MPI.ERR_PENDING):
            raise MPI.Exception(code) from err
    raise err


class Schedules:
    """A topology's schedules by (op, root, buffer); see the module docstring."""

    def __init__(self, topo) -> None:
        self.topo = topo
        self.kept: OrderedDict[tuple, Schedule] = OrderedDict()
        #: the last SIGHTED keys called plainly, each with a weak reference to its array:
        #: a temporary's id is reused by the next temporary, so only the same live array
        #: counts as seen
        self.sighted: OrderedDict[tuple, weakref.ref] = OrderedDict()
        #: the last DROPPED keys whose schedule was dropped to make room, each with a weak
        #: reference to its array: while that array lives, the call takes the blocking path
        self.dropped: OrderedDict[tuple, weakref.ref] = OrderedDict()
        #: schedules recorded so far (each call's at most once, while DROPPED remembers it)
        self.recorded = 0
        #: the C replay new schedules are compiled for, or None (Topology.small_path)
        self.native = NATIVE
        #: the most recently used schedule and its key: the same call again (a training
        #: loop's) skips the lookup and the LRU reordering
        self.last_key: tuple | None = None
        self.last: Schedule | None = None

    def call(self, op: str, owner: np.ndarray, buf: np.ndarray, root: int,
             blocking: Callable[..., None], *args) -> None:
        """Run ``blocking(*args)`` (the topology's own call on ``buf``, the flat view of
        the caller's array ``owner``) or its schedule.

        A schedule is found by the caller's array object, not by its address (reading
        an address costs microseconds): the schedule holds ``owner``, so while it is kept
        no other array can take its id, and an array cannot move its memory while views
        of it exist (``resize`` refuses); its length and dtype are in the key."""
        if buf.nbytes > MAX_BYTES or not buf.nbytes:
            blocking(*args)
            return
        key = (op, root, id(owner), buf.size, buf.dtype.num)
        if key == self.last_key:            # the same call again: already the most recent
            schedule = self.last
        else:
            schedule = self._find(key, owner, blocking, args)
            if schedule is None:
                return
        try:
            schedule.run()
        except BaseException:
            del self.kept[key]
            self.last_key = self.last = None
            schedule.abandon()
            raise

    def _find(self, key: tuple, owner: np.ndarray, blocking: Callable[..., None],
              args: tuple) -> Schedule | None:
        """The kept schedule of ``key``, or a new one recorded by running ``blocking``;
        None when the call ran ``blocking`` plainly instead."""
        schedule = self.kept.get(key)
        if schedule is None:
            dropped = self.dropped.get(key)
            if dropped is not None:
                if dropped() is owner:          # planned once and dropped for room: churn
                    blocking(*args)
                    return None
                del self.dropped[key]           # another array that took a dead one's id
            seen = self.sighted.pop(key, None)
            if seen is None or seen() is not owner:    # first sight: plain, remembered
                self.sighted[key] = weakref.ref(owner)
                if len(self.sighted) > SIGHTED:
                    self.sighted.popitem(last=False)
                blocking(*args)
                return None
            schedule = self._record(blocking, args)
            schedule.owner = owner
            self.kept[key] = schedule
            if len(self.kept) > KEPT:
                self._drop(*self.kept.popitem(last=False))
        else:
            self.kept.move_to_end(key)
        self.last_key, self.last = key, schedule
        return schedule

    def _drop(self, key: tuple, schedule: Schedule) -> None:
        """Free the least recently used schedule, remembering its call as dropped."""
        if schedule is self.last:
            self.last_key = self.last = None
        self.dropped[key] = weakref.ref(schedule.owner)
        if len(self.dropped) > DROPPED:
            self.dropped.popitem(last=False)
        schedule.free()

    def _record(self, blocking: Callable[..., None], args: tuple) -> Schedule:
        topo = self.topo
        self.recorded += 1
        schedule = Schedule(topo)
        topo._recording = schedule
        try:
            blocking(*args)
        except BaseException:
            schedule.free()
            raise
        finally:
            topo._recording = None
        schedule.compile(self.native)
        return schedule

    def clear(self) -> None:
        for schedule in self.kept.values():
            schedule.free()
        self.kept.clear()
        self.last_key = self.last = None
        self.sighted.clear()
        self.dropped.clear()
