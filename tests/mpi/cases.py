"""What the case-by-case MPI check scripts share: MPI started with the project's
defaults, the world's ``comm``, ``rank`` and ``size``, and :data:`cases`, one verdict per
case, agreed by every rank, printed by rank 0 as ``OK CASE`` or ``FAIL CASE: why``::

    from cases import cases, comm, rank, report, size   # before anything imports mpi4py

Importing it starts MPI, so a script imports it first."""

from __future__ import annotations

from mpirl.launch import apply_mpi_defaults

apply_mpi_defaults()    # before MPI starts, as every entry point of the project does
from mpi4py import MPI  # noqa: E402


class Cases:
    """Collects the failed cases of a check script run on ``comm``."""

    def __init__(self, comm: MPI.Comm) -> None:
        self.comm = comm
        self.failed: list[str] = []

    def report(self, case: str, problems: list[str]) -> None:
        """Every rank's ``problems`` for ``case`` (collective): rank 0 prints the verdict."""
        problems = [p for ps in self.comm.allgather(problems) for p in ps]
        if problems:
            self.failed.append(case)
        if self.comm.Get_rank() == 0:
            print(f"FAIL {case}: {'; '.join(problems)}" if problems else f"OK {case}",
                  flush=True)


comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
cases = Cases(comm)
report = cases.report
