"""MPI's own collectives: ``MPI_Allreduce`` and ``MPI_Bcast``, the baseline.

Every other topology is measured against this one.  Which algorithm MPI runs is MPI's
choice (MPICH picks by message size and rank count); ``python -m mpirl.bench`` can force
one through MPICH's CVARs to compare like with like.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .base import Topology, _msg


class Native(Topology):
    """The MPI library's ``Allreduce(IN_PLACE, SUM)`` and ``Bcast``."""

    name = "native"

    def _allreduce_sum(self, buf: np.ndarray) -> None:
        self.comm.Allreduce(MPI.IN_PLACE, _msg(buf), op=MPI.SUM)
        # What the library sends is its own business; count one logical message.
        self._count_sent(buf)
        self.stats.bytes_recv += buf.nbytes

    def _bcast(self, buf: np.ndarray, root: int) -> None:
        self.comm.Bcast(_msg(buf), root=root)
        if self.rank == root:
            self._count_sent(buf)
        else:
            self.stats.bytes_recv += buf.nbytes
