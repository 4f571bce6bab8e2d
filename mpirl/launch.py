"""How the project starts ``mpiexec``: the command line and the environment it needs.

Tests, ``make run``, the sweep launcher and the Slurm scripts all build their
``mpiexec`` line here, so the MPICH settings that keep oversubscribed runs fast are set
in one place.  Users launching ``mpirun`` by hand get the same settings from
:func:`apply_mpi_defaults`, which ``python -m mpirl.run`` calls before MPI starts.
"""

from __future__ import annotations

import os
import shutil
import sys

#: MPICH control variables set (unless the user already set them) for every launch.
#: Ranks blocked in MPI otherwise busy-poll and starve ranks that compute when ranks
#: outnumber cores; measurements behind these values are in docs/oversubscription.md.
MPICH_DEFAULTS: dict[str, str] = {}


def apply_mpi_defaults(environ: dict | None = None) -> dict:
    """Set :data:`MPICH_DEFAULTS` in ``environ`` (default ``os.environ``) where unset."""
    env = os.environ if environ is None else environ
    for key, value in MPICH_DEFAULTS.items():
        env.setdefault(key, value)
    return env


def mpiexec_path() -> str:
    """The ``mpiexec`` next to this Python (the venv's MPICH), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError(
            "no mpiexec found: install the project (pip install -e .) to get MPICH's, "
            "or put your MPI's bin directory on PATH")
    return found


def mpiexec_command(nranks: int, argv: list[str]) -> list[str]:
    """``mpiexec -n NRANKS ARGV...`` for this machine's MPI."""
    if nranks < 1:
        raise ValueError(f"nranks={nranks}; allowed: >= 1")
    return [mpiexec_path(), "-n", str(nranks), *argv]


def mpi_env(extra: dict | None = None) -> dict:
    """A copy of the environment with the MPI defaults applied and ``extra`` on top."""
    env = apply_mpi_defaults(dict(os.environ))
    env.update(extra or {})
    return env
