"""``mpirun -np N python -m mpirl.run [--config YAML] [--flag value ...]``

Every rank runs its own environments and its own actor-critic replica; after each
rollout the ranks exchange gradients through the chosen topology and take the same
optimizer step, so the replicas stay identical (checked every ``checksum_every``
updates).  Rank 0 prints progress and writes the run directory.

The configuration is checked before torch is even imported, so a bad flag costs a
second, not a torch start-up per rank.
"""

from __future__ import annotations

import sys

from .config import ConfigError, build_parser, parse_args
from .launch import abort_job, apply_mpi_defaults

apply_mpi_defaults()            # MPICH reads its settings when MPI starts: before the import
from mpi4py import MPI  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if "-h" in argv or "--help" in argv:
        if rank == 0:
            build_parser().print_help()
        return 0
    try:
        cfg = parse_args(argv).validate(comm.Get_size())
    except ConfigError as err:   # every rank sees the same error; one prints it
        if rank == 0:
            print(f"mpirl.run: error: {err}", file=sys.stderr, flush=True)
        return 2
    from .modes.sync import ReplicaDivergence   # heavy imports (torch) only from here on
    from .train import train
    try:
        train(cfg, comm)
    except ReplicaDivergence as err:        # seen by every rank alike: a clean exit
        if rank == 0:
            print(f"mpirl.run: error: {err}", file=sys.stderr, flush=True)
        return 3
    except Exception as err:                # seen by this rank alone: end the whole job now
        abort_job(comm, f"mpirl.run: error on rank {rank}: {type(err).__name__}: {err}", 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
