"""Carrying on without a failed rank: User-Level Failure Mitigation (MPI-4 ULFM).

``--on-failure stop`` (default) ends the job when a rank fails (MPICH's launcher does it
at once; under Open MPI with ULFM the survivors see the failure as an error, name the
failed ranks and abort).  ``--on-failure shrink`` (sync mode) lets the survivors go on:

1. The communicator's error handler is ``ERRORS_RETURN``, so a failed peer surfaces as
   an exception (``MPI_ERR_PROC_FAILED``, or ``MPI_ERR_REVOKED`` where another rank
   revoked first) instead of killing the job.  Open MPI's failure detector (a heartbeat,
   ``--mca mpi_ft_detector true``) bounds how long a rank waits on a dead peer: about
   ``mpi_ft_detector_timeout`` seconds.
2. A rank that saw the error revokes the communicator at once: ranks blocked on a
   *live* peer (a butterfly partner that is itself stuck on the dead one) get
   ``MPI_ERR_REVOKED`` instead of waiting forever.  Every protected collective is then
   followed by ``MPI_Comm_agree`` on "did it succeed here?".  Agreement is uniform over
   the survivors even when a rank dies during it, so either every survivor accepts the
   result or every survivor redoes the operation: a butterfly round or a ring step can
   succeed on some ranks and fail on others, and without agreement some replicas would
   apply a gradient others never saw.
3. On failure: ``Shrink`` (a new communicator of the survivors), the topology is rebuilt on it by
   the caller's ``rebuild`` callback, and the operation is redone from the caller's
   saved inputs (the exchange restores the gradient from a copy taken before it: the one
   copy this mode adds to the hot path, with one agreement per exchange).

The topologies know nothing of this: they only move bytes on the communicator they are
given, and name the communicators they split from it (``communicators()``: a
node-aware topology's node and leaders), which are revoked with it, so a rank waiting in
its node's broadcast for a leader that went on to the agreement is woken too.

What survives is decided by where the state lives: in sync mode every rank holds a full
replica of parameters and optimizer, so any survivor set can carry on, whatever
the topology (the star's root is only a reducer there).  The parameter server of
async/quorum holds the only copy of the parameters: its failure ends the run, which is
why ``shrink`` is refused for those modes.

With MPICH there is no real ULFM (mpi4py's ``Shrink`` is a plain copy and the launcher
kills the job when a rank dies): ``shrink`` is refused at start, saying so.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

import numpy as np
from mpi4py import MPI

from ..launch import OPENMPI_ULFM_ARGS, fault_tolerant_launch, mpi_library
from .faults import ON_FAILURE

T = TypeVar("T")

_FAILURE_CLASSES = {getattr(MPI, name) for name in
                    ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
                    if hasattr(MPI, name)}


def unsupported() -> str | None:
    """Why ranks cannot survive a failure with this MPI and launch (None when they can)."""
    library = mpi_library()
    if not library.startswith("Open MPI"):
        return (f"the MPI library is {library.split(',')[0].strip()!r}, which has no working "
                "ULFM (MPICH's launcher kills the job when a rank dies); run under Open MPI 5 "
                f"(pip install openmpi mpi4py) as  mpiexec {' '.join(OPENMPI_ULFM_ARGS)} ...")
    if not fault_tolerant_launch():
        return ("Open MPI was launched without fault tolerance; add  "
                f"{' '.join(OPENMPI_ULFM_ARGS)}  to mpiexec")
    if os.environ.get("OMPI_MCA_mpi_ft_detector", "").lower() not in ("1", "true"):
        return ("Open MPI's failure detector is off, so survivors would wait on a dead rank "
                "forever; add  --mca mpi_ft_detector true  to mpiexec")
    return None


def is_failure(err: BaseException) -> bool:
    """An MPI error that means "a peer failed" (or "someone revoked after one did")."""
    return isinstance(err, MPI.Exception) and err.Get_error_class() in _FAILURE_CLASSES


class PeerFailed(RuntimeError):
    """A rank failed and ``--on-failure stop`` is in force."""


@dataclass
class FailureEvent:
    """One recovery, as seen by one survivor."""

    failed: list[int]          # world ranks lost in this recovery
    unix_s: float              # when this rank saw the error
    detect_s: float            # from entering the failed operation to the error
    recover_s: float           # revoke + shrink + agreement + rebuild
    size_after: int


class Team:
    """The ranks still alive, as a communicator that survives failures (see module doc).

    ``world`` maps the current communicator's ranks to the launch's ranks, so messages
    and logs always name ranks as the user launched them."""

    def __init__(self, comm: MPI.Comm, policy: str = "stop") -> None:
        if policy not in ON_FAILURE:
            raise ValueError(f"on_failure={policy!r}; allowed: {', '.join(ON_FAILURE)}")
        self.policy = policy
        self.comm = comm
        self.world = list(range(comm.Get_size()))
        self.events: list[FailureEvent] = []
        self._rebuild: list[Callable[[MPI.Comm], None]] = []
        self._derived: Callable[[], list[MPI.Comm]] = list
        self._ulfm = unsupported() is None
        if self._ulfm:              # failures become exceptions on our own communicator
            self.comm = comm.Dup()
            self.comm.Set_errhandler(MPI.ERRORS_RETURN)

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    def on_shrink(self, rebuild: Callable[[MPI.Comm], None]) -> None:
        """Call ``rebuild(new_comm)`` after every shrink (to rebuild a topology on it)."""
        self._rebuild.append(rebuild)

    def derived(self, communicators: Callable[[], list[MPI.Comm]]) -> None:
        """The communicators split from :attr:`comm` that a protected operation also sends
        on (a topology's ``communicators()``, asked again after every rebuild): failures
        there surface as errors too, and a failure seen anywhere revokes them all, so a
        rank blocked on one of them (in its node's broadcast, waiting for a leader that
        went on to the agreement) is woken as well."""
        self._derived = communicators
        if self._ulfm:
            for comm in self._extra():
                comm.Set_errhandler(MPI.ERRORS_RETURN)

    def _extra(self) -> list[MPI.Comm]:
        return [c for c in self._derived() if c != MPI.COMM_NULL and c != self.comm]

    def _revoke(self) -> None:
        """Revoke :attr:`comm` and every derived communicator not yet revoked."""
        for comm in [self.comm, *self._extra()]:
            if not comm.Is_revoked():
                comm.Revoke()

    def run(self, op: Callable[[MPI.Comm], T], what: str,
            restore: Callable[[], None] | None = None) -> T:
        """``op(comm)``, agreed by every survivor; after a failure, ``restore()`` puts the
        inputs back and ``op`` runs again on the shrunk communicator."""
        if not self._ulfm:          # MPICH: a failure never comes back as an error
            return op(self.comm)
        while True:
            entered = time.monotonic()
            result, seen = self._attempt(op)       # seen: when a failure showed here
            if self.policy == "stop":
                if seen is None:
                    return result
                self._revoke()        # every rank blocked on these communicators gets an error
                raise PeerFailed(f"rank(s) {self._failed_world_ranks() or '?'} failed ({what}) "
                                 f"after {seen - entered:.1f} s; ending the job "
                                 "(--on-failure shrink carries on without them, in sync mode)")
            if seen is not None:      # wake ranks blocked on live peers that wait on us
                self._revoke()
            if self._agree(seen is None):
                return result
            self._recover(entered, time.monotonic() if seen is None else seen)
            if restore is not None:
                restore()

    def _attempt(self, op: Callable[[MPI.Comm], T]) -> tuple[T | None, float | None]:
        """``(result, None)``, or ``(None, when)`` if a failure showed in ``op``."""
        try:
            return op(self.comm), None
        except MPI.Exception as err:
            if not is_failure(err):
                raise
            return None, time.monotonic()

    def _agree(self, ok: bool) -> bool:
        """Whether every survivor succeeded (``MPI_Comm_agree``; uniform even when a rank
        dies during it)."""
        try:
            return bool(self.comm.Agree(int(ok)))
        except MPI.Exception as err:
            if not is_failure(err):
                raise
            return False

    def _recover(self, entered: float, seen: float) -> None:
        self._revoke()
        new = self.comm.Shrink()
        new.Set_errhandler(MPI.ERRORS_RETURN)
        survivors = MPI.Group.Translate_ranks(new.Get_group(), list(range(new.Get_size())),
                                              self.comm.Get_group())
        lost = sorted(set(self.world) - {self.world[r] for r in survivors})
        self.world = [self.world[r] for r in survivors]
        old, self.comm = self.comm, new
        old.Free()
        for rebuild in self._rebuild:
            rebuild(self.comm)
        self.derived(self._derived)          # the rebuilt topology's own communicators
        self.events.append(FailureEvent(failed=lost, unix_s=time.time(),
                                        detect_s=seen - entered,
                                        recover_s=time.monotonic() - seen,
                                        size_after=self.size))

    def _failed_world_ranks(self) -> list[int]:
        try:
            self.comm.Ack_failed()
            group = self.comm.Get_failed()
            ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())),
                                              self.comm.Get_group())
            return sorted(self.world[r] for r in ranks if r != MPI.UNDEFINED)
        except (MPI.Exception, AttributeError, NotImplementedError):
            return []


class Backup:
    """A copy of a buffer kept across an operation that may have to be redone; one
    allocation for the run, one ``copyto`` per save (only under ``--on-failure shrink``)."""

    def __init__(self, buf: np.ndarray) -> None:
        self.buf = buf
        self.saved = np.empty_like(buf)

    def save(self) -> None:
        np.copyto(self.saved, self.buf)

    def restore(self) -> None:
        np.copyto(self.buf, self.saved)
