"""``mpirun -np N python -m mpirl.run [--config YAML] [--flag value ...]``

Every rank runs its own environments and its own actor-critic replica; after each
rollout the ranks exchange gradients through the chosen topology and take the same
optimizer step, so the replicas stay identical (checked every ``checksum_every``
updates).  Rank 0 prints progress and writes the run directory.

The configuration is checked before torch is even imported, so a bad flag costs a
second, not a torch start-up per rank.
"""

from __future__ import annotations

import os
import sys

from .config import ConfigError, build_parser, config_differences, parse_args
from .launch import abort_job, apply_mpi_defaults

apply_mpi_defaults()            # MPICH reads its settings when MPI starts: before the import
from mpi4py import MPI  # noqa: E402


def agree_on_config(comm, cfg, error: str | None) -> str | None:
    """The error every rank reports (collective): the lowest rank's own error, or the
    fields in which some rank's configuration differs from rank 0's."""
    mine = (error, None if cfg is None else config_digest(cfg), None)
    states = comm.allgather(mine)
    for r, (err, _, _) in enumerate(states):
        if err:
            return err if r == 0 else f"rank {r}: {err}"
    if len({digest for _, digest, _ in states}) == 1:
        return None
    configs = comm.allgather(cfg.to_dict())
    odd = [r for r, c in enumerate(configs) if c != configs[0]]
    first = odd[0]
    detail = ", ".join(config_differences(configs[first], configs[0])[:4])
    return (f"ranks {odd} were launched with a configuration different from rank 0's "
            f"(rank {first}: {detail}); every rank must run the same configuration")


def config_digest(cfg) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(cfg.to_dict(), sort_keys=True).encode()).hexdigest()


def startup_error(comm, argv: list[str]):
    """``(cfg, None)``, or ``(cfg or None, the error every rank reports)`` (collective).

    All ranks agree before anything starts: a rank whose flags were bad, or which was
    launched with a different configuration (MPMD launches, per-node config files),
    stops everyone, with one line from rank 0."""
    cfg, error = None, None
    try:
        cfg = parse_args(argv).validate(comm.Get_size())
    except ConfigError as err:
        error = str(err)
    error = agree_on_config(comm, cfg, error)
    if not error and cfg.on_failure == "shrink":
        from .resilience.ulfm import unsupported   # same answer on every rank (same launch)
        why = unsupported()
        if why:
            error = f"on_failure='shrink' needs an MPI that survives failures (ULFM): {why}"
    return cfg, error


def clean_exits() -> dict:
    """Exceptions that every rank sees alike, so the job ends cleanly: the exit status
    and the prefix of rank 0's one line.  Anything else is one rank's and aborts the job."""
    from .errors import ReplicaDivergence, StartupMismatch
    from .resilience.stop import StopRequested

    return {StopRequested: (None, ""),   # every rank stopped at the same update: 128 + signal
            StartupMismatch: (2, "error: "),
            ReplicaDivergence: (3, "error: ")}


def run_main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if "-h" in argv or "--help" in argv:
        if rank == 0:
            build_parser().print_help()
        return 0
    cfg, error = startup_error(comm, argv)
    if error:
        if rank == 0:
            print(f"mpirl.run: error: {error}", file=sys.stderr, flush=True)
        return 2
    from .designs import train              # heavy imports (torch) only from here on

    exits = clean_exits()
    try:
        train(cfg, comm)
    except tuple(exits) as err:
        code, prefix = exits[type(err)]
        if code is None:                    # 130 after Ctrl-C, 143 after SIGTERM
            from .resilience.stop import received

            code = 128 + (received() or 15)
        if rank == 0:
            print(f"mpirl.run: {prefix}{err}", file=sys.stderr, flush=True)
        return code
    except Exception as err:                # seen by this rank alone: end the whole job now
        abort_job(comm, f"mpirl.run: error on rank {rank}: {type(err).__name__}: {err}", 1)
    return 0


def main(argv: list[str] | None = None) -> int:
    """:func:`run_main`, and the way out of the process that fits the MPI library."""
    from .resilience.ulfm import unsupported

    if unsupported() is not None:           # MPICH, or Open MPI without fault tolerance
        return run_main(argv)
    # Open MPI with fault tolerance: its MPI_Finalize hangs in the threaded failure
    # detector (5.0.11, measured: forever, with or without a failure, also in a 3-line
    # mpi4py program).  Every file is closed by the time run_main returns or raises, so
    # leave without it, whatever happened; the launcher's exit status is then ours, or a
    # failed rank's.
    try:
        code = run_main(argv)
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
