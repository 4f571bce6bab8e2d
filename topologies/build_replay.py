"""Build the small-message path's C replay (``topologies/_replay.c``) into this venv.

    python -m topologies.build_replay          # `make install` runs it

It is compiled with the venv's ``mpicc`` (the ``mpich`` wheel's) against the MPI library
that mpi4py loads, and written into the venv's site-packages as ``_mpirl_replay``, not
into the source tree: a second venv on the same checkout with another MPI (``make
ulfm-env``'s Open MPI) does not see it and keeps the Python replay.  Without a compiler
or ``mpicc`` it prints one line and exits 0: the path then replays in Python, the same
messages and the same sums, only slower (``topologies.persistent``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

SOURCE = Path(__file__).with_name("_replay.c")
NAME = "_mpirl_replay"


def main() -> int:
    bindir = Path(sys.executable).parent
    mpicc = bindir / "mpicc"
    if not mpicc.exists():
        mpicc = shutil.which("mpicc")
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    target = Path(sysconfig.get_paths()["platlib"]) / (NAME + suffix)
    if mpicc is None:
        print("topologies.build_replay: no mpicc; the small-message path replays in Python")
        return 0
    # mpicc adds the venv's include and lib directories and an rpath to its libmpi
    command = [str(mpicc), "-O3", "-shared", "-fPIC", "-fno-fast-math",
               "-I" + sysconfig.get_paths()["include"], str(SOURCE), "-o", str(target)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as err:
        print(f"topologies.build_replay: {err}; the small-message path replays in Python")
        return 0
    if done.returncode != 0:
        print("topologies.build_replay: compiling failed; the small-message path replays "
              f"in Python:\n{done.stderr.strip()}")
        target.unlink(missing_ok=True)
        return 0
    print(f"topologies.build_replay: built {target.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
