"""The exchange a design calls: a topology on a communicator that survives failures.

Every collective of a synchronous design goes through an :class:`Exchange`.  Under
``--on-failure shrink`` (ULFM, :mod:`mpirl.resilience.ulfm`) it owns the recovery, the
way Horovod's elastic ``State`` does: a failed allreduce is agreed by the survivors,
the communicator shrinks, the topology is rebuilt on it, the gradient is put back from
its saved copy and the allreduce redone.  A topology with state (error feedback's
residuals, top-k's turn, PowerSGD's warm start) is rebuilt with its state from *before*
the failed call: survivors that finished the call before the failure showed elsewhere
had moved theirs on, and the redo would start from different states on different ranks.
The loop that called it never sees the retry; it only finds fewer ranks in :attr:`size`
afterwards.  Every failure survived is handed to ``failed(update, event)`` (the log's
``failures`` table), whichever of the exchange's collectives saw it: the allreduce of
``update``, or a collective after it (a checksum, a progress line, the stop check),
which names the last update averaged.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import numpy as np
from mpi4py import MPI

import topologies
from topologies.base import CommStats, SummedStats

from .checkpoint import as_arrays, as_tensors
from .ulfm import Backup, FailureEvent, Team

T = TypeVar("T")


class Exchange:
    """``topology`` (a registry name) over ``comm``, protected by a :class:`Team`."""

    def __init__(self, topology: str, comm: MPI.Comm, on_failure: str = "stop", *,
                 announce: Callable[[str], None] | None = None,
                 failed: Callable[[int, FailureEvent], None] | None = None,
                 own_comm: bool = False) -> None:
        self.team = Team(comm, on_failure)
        self.name = topology
        if own_comm and on_failure == "shrink":
            raise ValueError("own_comm: a shrink rebuilds the topology on the team's comm")
        # own_comm: the topology on a duplicate (the same ranks, another context), so an
        # average in flight on a thread never shares a communicator with :meth:`collective`
        self._own = self.team.comm.Dup() if own_comm else None
        self.topology = topologies.get(topology)(self._own if own_comm else self.team.comm)
        self.team.on_shrink(self._rebuild)
        self.team.derived(lambda: self.topology.communicators())
        self._keep_copy = on_failure == "shrink"
        self._backup: Backup | None = None
        #: the topology's state before the average in progress (under shrink, for a
        #: topology with state), what a rebuild during that average starts from
        self._before: dict | None = None
        #: told what the rank waits in before each exchange (the watchdog's "now doing")
        self.announce: Callable[[str], None] = announce or (lambda what: None)
        #: told of each failure survived, with the update whose exchange saw it
        self.failed: Callable[[int, FailureEvent], None] = failed or (lambda update, event: None)
        self.update = 0               # the update of the last (or current) average
        self._earlier = CommStats()   # what the topologies before a rebuild moved
        self._shapes: list | None = None

    def close(self) -> None:
        """Free the duplicate communicator of ``own_comm`` (collective; nothing may be in
        flight on it).  The topology is not used after."""
        if self._own is not None:
            self._own.Free()
            self._own = None

    def describe(self, shapes: list[tuple[int, ...]]) -> None:
        """The tensors the averaged buffer holds (``Topology.describe``: PowerSGD's
        matrices); told again to a topology rebuilt after a failure."""
        self._shapes = shapes
        self.topology.describe(shapes)

    # -- what a checkpoint keeps (error feedback's residuals): Stateful ------------------
    def state(self) -> dict:
        return topology_state(self.topology)

    def load_state(self, state: dict) -> None:
        load_topology_state(self.topology, state)

    @property
    def size(self) -> int:
        """Ranks taking part now (fewer than launched after a survived failure)."""
        return self.team.size

    @property
    def rank(self) -> int:
        return self.team.rank

    @property
    def world(self) -> list[int]:
        """Launch rank of each current rank."""
        return self.team.world

    @property
    def shrunk(self) -> bool:
        """A failure was survived: the run goes on with fewer ranks than launched."""
        return bool(self.team.events)

    def average(self, buf: np.ndarray, update: int) -> None:
        """Replace ``buf`` with its mean over every rank, in place (the whole exchange)."""
        where = f"in the exchange of update {update}, waiting for other ranks"
        self.announce(where)
        restore = None
        if self._keep_copy:                   # one copy per exchange, only under shrink
            if self._backup is None or self._backup.buf is not buf:
                self._backup = Backup(buf)
            self._backup.save()
            restore = self._backup.restore
            self._before = self.topology.state()      # {} for a topology without state
        self.update = update
        try:
            self._run(lambda c: self.topology.allreduce(buf, average=True), where, restore)
        finally:
            self._before = None

    def bcast(self, buf: np.ndarray, root: int = 0) -> None:
        """Rank ``root``'s ``buf`` on every rank (at start: not protected)."""
        self.topology.bcast(buf, root=root)

    def collective(self, op: Callable[[MPI.Comm], T], what: str) -> T:
        """``op(comm)`` (a few numbers for progress, a checksum, a stop), agreed and
        redone after a failure like the exchange itself."""
        return self._run(op, what)

    def _run(self, op: Callable[[MPI.Comm], T], what: str,
             restore: Callable[[], None] | None = None) -> T:
        """``op`` through the team; every failure it survived is told to :attr:`failed`."""
        known = len(self.team.events)
        result = self.team.run(op, what, restore)
        for event in self.team.events[known:]:
            self.failed(self.update, event)
        return result

    @property
    def stats(self) -> SummedStats:
        """What this rank's exchanges moved, over every topology it used (a topology
        rebuilt after a failure starts its own counters at zero)."""
        return SummedStats([self._earlier, self.topology.stats])

    def _rebuild(self, comm: MPI.Comm) -> None:
        for name in CommStats.__slots__:
            setattr(self._earlier, name, getattr(self._earlier, name)
                    + getattr(self.topology.stats, name))
        # this rank's residuals survive the shrink: as they were before the average in
        # progress, if the failure showed in one (a rank that finished it moved them on)
        state = self._before if self._before is not None else self.topology.state()
        self.topology = topologies.get(self.name)(comm)
        if self._shapes is not None:
            self.topology.describe(self._shapes)
        self.topology.load_state(state)


#: the checkpoint keys of a topology's own state
TOPOLOGY_PREFIX = "exchange."


def topology_state(topology) -> dict:
    """A topology's state (:meth:`topologies.base.Topology.state`: error feedback's
    residuals) as tensors, under ``exchange.`` keys; none for exchanges without state."""
    return {TOPOLOGY_PREFIX + key: value for key, value in as_tensors(topology.state()).items()}


def load_topology_state(topology, state: dict) -> None:
    """Put back into ``topology`` what :func:`topology_state` saved (if anything)."""
    mine = as_arrays({key[len(TOPOLOGY_PREFIX):]: value for key, value in state.items()
                      if key.startswith(TOPOLOGY_PREFIX)})
    if mine:
        topology.load_state(mine)
