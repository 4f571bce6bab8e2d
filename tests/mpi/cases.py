"""What the case-by-case MPI check scripts share: one verdict per case, agreed by every
rank, printed by rank 0 as ``OK CASE`` or ``FAIL CASE: why``."""

from __future__ import annotations

from mpi4py import MPI


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
