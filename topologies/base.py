"""The one interface every topology implements, and the checks they share.

A topology moves bytes and nothing else: it knows no RL, no torch, no model.  It works
in place on one flat, C-contiguous numpy buffer (float32 or float64; float16 and
bfloat16 for the compressed exchanges of :mod:`topologies.cast`) with mpi4py's
buffer (upper-case) methods, so no call pickles and no call sends one message per
tensor.  The communicator is passed in at construction; there are no hidden globals.

Contract, checked by ``tests/topologies/test_topologies.py`` at several rank counts:

* ``allreduce(buf)`` leaves the element-wise sum over all ranks in ``buf`` on every
  rank (``average=True``: the sum divided by the rank count), byte-identical on every
  rank and equal to ``MPI_Allreduce`` up to float rounding (the summation order may
  differ from MPI's).  Where the sum is NaN, the NaN's sign may differ between ranks
  (butterfly and native, when ranks' buffers held NaNs of both signs); where it is NaN
  does not.
* ``bcast(buf, root=r)`` leaves rank ``r``'s buffer on every rank.
* Every rank must call with a buffer of the same length and dtype; point-to-point
  topologies check the length of every message they receive and raise
  :class:`BufferMismatchError` naming both lengths instead of computing garbage.

Every topology also states its cost, next to its algorithm, as MPICH states it in each
algorithm's header: ``cost(op, p, n)`` gives the messages on the critical path, the bytes
each rank on it moves and the bytes it reduces, for ``allreduce`` and ``bcast`` of ``n``
bytes over ``p`` ranks.  :mod:`mpirl.study.costmodel` walks the registry, fits
``T = messages alpha + bytes_moved beta + bytes_reduced gamma`` (+ ``messages delta``
for topologies that send from Python) to ``mpirl.bench`` results and predicts from it.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from . import persistent
from .persistent import Schedules

#: half precision: IEEE float16, and bfloat16 (:func:`bfloat16`), for the compressed
#: exchanges of :mod:`topologies.cast`
FLOAT16 = np.dtype(np.float16)
#: MPI has no standard half type: two bytes, as a derived type so that MPI's own
#: ``MPI.SUM`` refuses it (MPI_ERR_OP) instead of adding integers; see :func:`sum_op`
HALF = MPI.BYTE.Create_contiguous(2).Commit()
#: dtypes a buffer may have, with the MPI datatype each maps to.
#: (bfloat16 joins once :func:`bfloat16` is first called)
MPI_DTYPES = {np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE,
              FLOAT16: HALF}
_HALF_SUMS: dict[np.dtype, MPI.Op] = {}


def bfloat16() -> np.dtype:
    """The bfloat16 numpy dtype (``ml_dtypes``), imported on first use: the import takes
    about 0.55 s, a quarter of a rank's start, which every run without ``bf16`` skips."""
    import ml_dtypes

    dtype = np.dtype(ml_dtypes.bfloat16)
    MPI_DTYPES.setdefault(dtype, HALF)
    return dtype


def sum_op(dtype: np.dtype) -> MPI.Op:
    """The MPI op that sums buffers of ``dtype`` in MPI's own collectives: ``MPI.SUM``,
    or for a half dtype a user op that adds with numpy (created once, on first use)."""
    if MPI_DTYPES.get(dtype) is not HALF:
        return MPI.SUM
    op = _HALF_SUMS.get(dtype)
    if op is None:
        def add(inbuf, inoutbuf, datatype, dtype=dtype) -> None:
            out = np.frombuffer(inoutbuf, dtype)
            np.add(out, np.frombuffer(inbuf, dtype), out=out)

        op = _HALF_SUMS[dtype] = MPI.Op.Create(add, commute=True)
    return op


class TopologyError(ValueError):
    """Bad input to a topology: wrong buffer, root out of range, mismatched lengths."""


class BufferMismatchError(TopologyError):
    """A rank received a message whose length differs from its own buffer's."""


class CommStats:
    """Running totals of what this rank's topology calls sent and received.

    ``wait_s`` is the time spent blocked before a peer's message had arrived, kept only by
    topologies whose ``measures_wait`` is True (their waits are polls, so they can tell
    waiting from moving data).  A blocking collective cannot tell the two apart from
    inside; for those, ``analysis`` derives each rank's waiting from when every rank
    entered the same call (the log's ``exchange_t_s``), which needs no extra messages."""

    __slots__ = ("calls", "messages_sent", "bytes_sent", "bytes_recv", "wait_s")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.calls = 0
        self.messages_sent = 0
        self.bytes_sent = 0
        self.bytes_recv = 0
        self.wait_s = 0.0

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}


class SummedStats:
    """Several exchanges' :class:`~topologies.base.CommStats` read as one, live."""

    def __init__(self, parts: list[CommStats]) -> None:
        self.parts = parts

    def __getattr__(self, name: str):
        if name == "parts":
            raise AttributeError(name)
        return sum(getattr(p, name) for p in self.parts)


OPS = ("allreduce", "bcast")


@dataclass(frozen=True)
class Cost:
    """A collective's cost terms (Hockney's model; Thakur, Rabenseifner & Gropp 2005):
    ``T = messages * alpha + bytes_moved * beta + bytes_reduced * gamma``.

    ``link_phases`` says how the critical path's bytes use the busiest link: in how many
    separate phases of equal bytes, each on a link direction that was idle before it
    (star and tree allreduce: the root receives everything, then sends everything: 2;
    butterfly and ring keep every link busy in both directions throughout: 1).  On a
    plain link it changes nothing; on a token-bucket link (a rate cap with a burst, as
    the emulated cluster's) each phase starts with a full bucket
    (:func:`mpirl.study.costmodel.link_bytes`)."""

    messages: float        # messages on the critical path (each pays a latency alpha)
    bytes_moved: float     # bytes a rank on the critical path sends or receives (beta)
    bytes_reduced: float   # bytes it adds up (gamma)
    link_phases: int = 1   # separate phases of bytes_moved on the busiest link


NO_COST = Cost(0.0, 0.0, 0.0)


def in_sequence(a: Cost, b: Cost) -> Cost:
    """Two costs paid one after the other."""
    return Cost(a.messages + b.messages, a.bytes_moved + b.bytes_moved,
                a.bytes_reduced + b.bytes_reduced, max(a.link_phases, b.link_phases))


def no_model(topology: str, op: str) -> KeyError:
    """The error for an op a topology has no cost model of."""
    return KeyError(f"no cost model for {op} {topology}; ops: {', '.join(OPS)}")


def fold(p: int) -> tuple[int, int]:
    """``(q, r)``: the largest power of two ``q <= p`` and the ranks ``r = p - q`` left
    over, which recursive doubling folds into partners."""
    q = 1 << (p.bit_length() - 1)
    return q, p - q


def ceil_log2(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


#: one message of a round of a schedule (:meth:`Topology.rounds`): (source rank,
#: destination rank, bytes, bytes the destination adds into its buffer)
Message = tuple[int, int, float, float]


def split_levels(rounds: list[list[Message]], per_node: int,
                 link_phases: int = 1) -> tuple[Cost, Cost]:
    """``(node level, link level)`` of a schedule run over nodes of ``per_node``
    consecutive ranks (rank // per_node is the node).

    A round whose messages all stay inside their nodes is paid at the node level: one
    latency, the most bytes one rank sends or receives in it, the most it adds.  A round
    with a message that crosses is paid at the link level (the rest of it, in shared
    memory, runs meanwhile): one latency, and the most bytes that one node's ranks send,
    or receive, over its link in that round, added up (they share the link; full
    duplex).  Folds, a pipelined chain and every other schedule are priced by the same
    rule, wherever their partners happen to sit."""
    totals = {False: [0.0, 0.0, 0.0], True: [0.0, 0.0, 0.0]}
    for messages in rounds:
        if not messages:
            continue
        crossing = [m for m in messages if m[0] // per_node != m[1] // per_node]
        sent: dict[int, float] = {}
        received: dict[int, float] = {}
        for src, dst, nbytes, _ in crossing or messages:
            src, dst = (src // per_node, dst // per_node) if crossing else (src, dst)
            sent[src] = sent.get(src, 0.0) + nbytes
            received[dst] = received.get(dst, 0.0) + nbytes
        added: dict[int, float] = {}
        for _, dst, _, reduced in messages:
            added[dst] = added.get(dst, 0.0) + reduced
        level = totals[bool(crossing)]
        level[0] += 1
        level[1] += max(*sent.values(), *received.values())
        level[2] += max(added.values())
    node, link = (Cost(*totals[k], link_phases=link_phases) if totals[k][0] else NO_COST
                  for k in (False, True))
    return node, link


#: the modes of :meth:`Topology.small_path`
SMALL_PATHS = ("c", "python", "off")


def check_env() -> None:
    """Raise TopologyError when an environment setting the topologies read is bad
    (:data:`topologies.persistent.ENV_MAX_BYTES`, :data:`~topologies.persistent.ENV_NATIVE`);
    called when a topology is built."""
    if persistent.ENV_ERROR:
        raise TopologyError(persistent.ENV_ERROR)


def check_buffer(buf, what: str = "buffer") -> np.ndarray:
    """Return ``buf`` as a flat view, or raise TopologyError saying what is allowed."""
    if not isinstance(buf, np.ndarray):
        raise TopologyError(
            f"{what} must be a numpy.ndarray of float32 or float64 (or float16, bfloat16), "
            f"got {type(buf).__name__}")
    dtype = buf.dtype
    if dtype not in MPI_DTYPES:
        if dtype.name == "bfloat16":
            bfloat16()                  # the caller imported ml_dtypes itself
        if dtype not in MPI_DTYPES:
            raise TopologyError(
                f"{what} has dtype {dtype}; allowed dtypes: float32, float64 (and the half "
                "precisions float16, bfloat16 that topologies.cast sends)")
    flags = buf.flags                   # (a new object at every access)
    if not flags.c_contiguous:
        raise TopologyError(
            f"{what} is not C-contiguous (a strided view?); pass one flat contiguous "
            "buffer, e.g. numpy.ascontiguousarray(x)")
    if not flags.writeable:
        raise TopologyError(f"{what} is read-only; topologies work in place")
    return buf if buf.ndim == 1 else buf.reshape(-1)


class Topology(abc.ABC):
    """Allreduce and broadcast over ``comm``, in place on one flat buffer.

    Subclasses implement :meth:`_allreduce_sum` and :meth:`_bcast` on an already
    checked flat buffer, and register themselves with one row in
    ``topologies/__init__.py``.
    """

    #: registry name, set by each subclass.
    name: str = ""
    #: True when there is a distinguished rank that everything flows through.
    has_master: bool = False
    #: True when ``stats.wait_s`` is kept (see :class:`CommStats`).
    measures_wait: bool = False
    #: True when the topology sends its messages from Python (mpirl's own), so that each
    #: pays the per-message overhead ``delta`` of the cost model; False for MPI's own.
    from_python: bool = True
    #: the ops (``allreduce``, ``bcast``) whose small calls are planned once per buffer and
    #: replayed as persistent requests (:mod:`topologies.persistent`): those that message
    #: only through ``_send``/``_recv``/``_sendrecv`` and add only through ``_add``.
    persistent: tuple[str, ...] = ()

    def __init__(self, comm: MPI.Comm = MPI.COMM_WORLD, *, root: int = 0) -> None:
        if comm == MPI.COMM_NULL:
            raise TopologyError("comm is MPI.COMM_NULL; pass a valid communicator")
        check_env()
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.root = self._check_root(root)
        self.stats = CommStats()
        self._scratch_by_dtype: dict[np.dtype, np.ndarray] = {}
        self._status = MPI.Status()        # reused by every receive: no allocation per call
        self._schedules = Schedules(self)
        self._divisors: dict[np.dtype, np.generic] = {}
        self._recording = None             # the Schedule being recorded, if any
        self.small_path("c")               # sets _plans_allreduce and _plans_bcast

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size}, root={self.root})"

    def small_path(self, mode: str) -> Topology:
        """Take this topology's small calls (those of :attr:`persistent`) through the
        small-message path replayed in C (``"c"``, the default where it is built),
        replayed in Python (``"python"``), or not at all (``"off"``: every call the
        topology's own blocking one): what each buys, side by side in one run
        (``mpirl.bench --blocking``).  Same messages, same sums in every mode."""
        if mode not in SMALL_PATHS:
            raise ValueError(f"small_path {mode!r}; allowed: {', '.join(SMALL_PATHS)}")
        on = mode != "off" and persistent.MAX_BYTES > 0
        self._plans_allreduce = on and "allreduce" in self.persistent
        self._plans_bcast = on and "bcast" in self.persistent
        self._schedules.clear()
        self._schedules.native = persistent.NATIVE if mode == "c" else None
        return self

    # -- public interface ---------------------------------------------------------------
    def allreduce(self, buf: np.ndarray, *, average: bool = False) -> np.ndarray:
        """Sum ``buf`` over all ranks in place (divide by the rank count if ``average``)."""
        flat = check_buffer(buf)
        self.stats.calls += 1
        if self.size > 1:
            self._sum(buf, flat)
            if average:
                # by the rank count as a scalar of the buffer's dtype: the same bits as
                # dividing by the int, without numpy resolving a Python scalar every call
                divisor = self._divisors.get(flat.dtype)
                if divisor is None:
                    divisor = self._divisors[flat.dtype] = flat.dtype.type(self.size)
                np.divide(flat, divisor, out=flat)
        return buf

    def bcast(self, buf: np.ndarray, *, root: int | None = None) -> np.ndarray:
        """Copy rank ``root``'s ``buf`` into ``buf`` on every rank (default: ``self.root``)."""
        flat = check_buffer(buf)
        root = self.root if root is None else self._check_root(root)
        self.stats.calls += 1
        if self.size > 1:
            self._broadcast(buf, flat, root)
        return buf

    def _sum(self, owner: np.ndarray, flat: np.ndarray) -> None:
        """:meth:`_allreduce_sum` of ``flat`` (the flat view of the caller's ``owner``),
        through its schedule where the topology plans allreduce; the call is not counted.
        A topology running this one inside it (hierarchical's leaders) calls this."""
        if self._plans_allreduce:
            self._schedules.call("allreduce", owner, flat, -1, self._allreduce_sum, flat)
        else:
            self._allreduce_sum(flat)

    def _broadcast(self, owner: np.ndarray, flat: np.ndarray, root: int) -> None:
        """:meth:`_bcast`, as :meth:`_sum` is :meth:`_allreduce_sum`."""
        if self._plans_bcast:
            self._schedules.call("bcast", owner, flat, root, self._bcast, flat, root)
        else:
            self._bcast(flat, root)

    @classmethod
    def cost(cls, op: str, p: int, n: float) -> Cost:
        """The cost of ``op`` (``allreduce`` or ``bcast``) of ``n`` bytes over ``p`` ranks;
        :data:`NO_COST` at ``p == 1``.  Raises KeyError for an op it has no model of."""
        if op not in OPS:
            raise no_model(cls.name, op)
        return NO_COST if p == 1 else cls._cost(op, p, n)

    @classmethod
    def rounds(cls, op: str, p: int, n: float, root: int = 0) -> list[list[Message]]:
        """The schedule of ``op`` of ``n`` bytes over ``p`` ranks (``root``: the tree's
        root, the broadcast's source), written out message by message, round by round:
        what :meth:`levels` splits by where each message's partners sit.  Each rank's
        messages and bytes are those its algorithm sends (``tests/mpi/check_topologies.py``
        compares them with its :class:`CommStats`).  KeyError where the topology states
        none (MPI's own algorithms, star: one level, :meth:`cost`)."""
        raise KeyError(f"{cls.name} has one level; predict it with predict()")

    @classmethod
    def levels(cls, op: str, nodes: int, per_node: int, n: float) -> tuple[Cost, Cost]:
        """``(node level, link level)``: the cost of ``op`` of ``n`` bytes over ``nodes``
        nodes of ``per_node`` consecutive ranks, its :meth:`rounds` split into those whose
        messages stay inside a node and those that cross the nodes' links
        (:func:`split_levels`), at any node and rank counts.  KeyError where the topology
        has no such model (one level: :meth:`cost`)."""
        if nodes < 1 or per_node < 1:
            raise KeyError(f"no two-level model of {cls.name} over {nodes} nodes x "
                           f"{per_node} ranks")
        p = nodes * per_node
        return split_levels(cls.rounds(op, p, n), per_node, cls.cost(op, p, n).link_phases)

    @classmethod
    def levels_from_python(cls, nodes: int) -> tuple[bool, bool]:
        """Whether each of :meth:`levels`' levels sends from Python (delta applies)."""
        return cls.from_python, cls.from_python

    def describe(self, shapes: list[tuple[int, ...]]) -> None:
        """The tensors the exchanged buffer holds, in order, for an exchange that compresses
        per tensor (:mod:`topologies.powersgd`); every other topology ignores it."""
        return None

    def state(self) -> dict:
        """What a checkpoint keeps of this exchange between calls, as numpy arrays and
        numbers (error feedback's residuals, :mod:`topologies.topk`); none by default."""
        return {}

    def load_state(self, state: dict) -> None:
        """Put back what :meth:`state` gave (nothing to put back by default)."""
        return None

    def collective(self, op, what: str):
        """``op(comm)`` on this exchange's communicator: a few numbers beside the exchange
        (``what`` names them), outside its statistics.  The runtime's resilient exchange
        offers the same call and redoes ``op`` after a failure."""
        return op(self.comm)

    def communicators(self) -> list[MPI.Comm]:
        """Every communicator this rank's exchange sends on: the one it was given, and any
        it split from it (a node-aware topology's node and leaders).  Whoever makes
        failures survivable (``mpirl.resilience``) revokes them all, so no rank stays
        blocked on a communicator the failure never touched."""
        return [self.comm]

    def layout(self) -> str | None:
        """One line on how the topology laid itself out over the ranks, where that is
        not evident from its name (the runtime prints it at start); None otherwise."""
        return None

    # -- what each topology implements ---------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def _cost(cls, op: str, p: int, n: float) -> Cost:
        """:meth:`cost` for ``op`` in :data:`OPS` and ``p >= 2``, from the formula in the
        topology's module docstring."""

    @abc.abstractmethod
    def _allreduce_sum(self, buf: np.ndarray) -> None:
        """Element-wise sum over ranks, in place, identical bytes on every rank."""

    @abc.abstractmethod
    def _bcast(self, buf: np.ndarray, root: int) -> None:
        """Rank ``root``'s contents into ``buf`` on every rank."""

    # -- helpers shared by the point-to-point topologies ----------------------------------
    def _check_root(self, root: int) -> int:
        if not isinstance(root, (int, np.integer)) or isinstance(root, bool) \
                or not 0 <= root < self.size:
            raise TopologyError(
                f"root={root!r} is not a rank of this communicator; allowed: 0..{self.size - 1}")
        return int(root)

    def _scratch(self, count: int, dtype: np.dtype) -> np.ndarray:
        """A reusable receive buffer of ``count`` elements (grown, never shrunk)."""
        scratch = self._scratch_by_dtype.get(dtype)
        if scratch is None or scratch.size < count:
            scratch = np.empty(max(count, 1), dtype=dtype)
            self._scratch_by_dtype[dtype] = scratch
        return scratch[:count]

    def _send(self, buf: np.ndarray, dest: int, tag: int) -> None:
        if self._recording is not None:
            self._recording.message([(buf, dest)], [], tag, MPI_DTYPES[buf.dtype])
            return
        self.comm.Send(_msg(buf), dest=dest, tag=tag)
        self._count_sent(buf)

    def _recv(self, buf: np.ndarray, source: int, tag: int) -> None:
        if self._recording is not None:
            self._recording.message([], [(buf, source)], tag, MPI_DTYPES[buf.dtype])
            return
        status = self._status
        try:
            self.comm.Recv(_msg(buf), source=source, tag=tag, status=status)
        except MPI.Exception as err:
            self._raise_mismatch(err, buf, source)
        self._check_count(status, buf, source)

    def _sendrecv(self, sendbuf: np.ndarray, dest: int, recvbuf: np.ndarray, source: int,
                  tag: int) -> None:
        if self._recording is not None:
            self._recording.message([(sendbuf, dest)], [(recvbuf, source)], tag,
                                    MPI_DTYPES[sendbuf.dtype])
            return
        status = self._status
        try:
            self.comm.Sendrecv(_msg(sendbuf), dest, tag, _msg(recvbuf), source, tag,
                               status=status)
        except MPI.Exception as err:
            self._raise_mismatch(err, recvbuf, source)
        self._count_sent(sendbuf)
        self._check_count(status, recvbuf, source)

    def _add(self, dst: np.ndarray, src: np.ndarray) -> None:
        """``dst += src`` in place (recorded, not done, while a schedule is recorded)."""
        if self._recording is not None:
            self._recording.add(dst, src)
        else:
            np.add(dst, src, out=dst)

    def _count_sent(self, buf: np.ndarray) -> None:
        self.stats.messages_sent += 1
        self.stats.bytes_sent += buf.nbytes

    def _check_count(self, status: MPI.Status, buf: np.ndarray, source: int) -> None:
        got = status.Get_count(MPI_DTYPES[buf.dtype])
        if got != buf.size:
            raise BufferMismatchError(
                f"{self.name}: rank {self.rank} expected {buf.size} elements from rank "
                f"{source} but received {got}; every rank must pass a buffer of the same "
                "length and dtype")
        self.stats.bytes_recv += buf.nbytes

    def _raise_mismatch(self, err: MPI.Exception, buf: np.ndarray, source: int):
        if err.Get_error_class() == MPI.ERR_TRUNCATE:
            raise BufferMismatchError(
                f"{self.name}: rank {self.rank} received a message from rank {source} longer "
                f"than its {buf.size}-element buffer; every rank must pass a buffer of the "
                "same length and dtype") from err
        raise err


def _msg(buf: np.ndarray):
    """The mpi4py buffer spec for a flat float array: no datatype lookup, no copy."""
    return [buf, MPI_DTYPES[buf.dtype]]
