"""Several ``mpirl.run`` runs, one after another, in one mpiexec launch: a launch costs
a torch import per rank, which tests comparing runs need not pay for each.

Usage: mpiexec -n N python tests/mpi/runs.py ARGS_JSON
ARGS_JSON: a list of argument lists, each one run's ``python -m mpirl.run`` arguments.
Every run must exit 0, and leave no thread of its own running behind it (the next run
would share the process with it); the first that does not ends the launch.
"""

from __future__ import annotations

import json
import sys
import threading

from mpi4py import MPI

from mpirl import run


def main() -> int:
    before = set(threading.enumerate())
    for argv in json.loads(sys.argv[1]):
        code = run.run_main(argv)
        if code:
            print(f"runs.py: {argv} exited {code}", flush=True)
            return code
        left = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
        if left:
            print(f"runs.py: {argv} left threads running: {left}", flush=True)
            return 1
        # every rank done with this run before any starts the next: a run's writer may
        # still be finishing its files (run.h5's end attributes) after the others return,
        # and the next run may read them (--replay-schedule reads the recording's run.h5)
        MPI.COMM_WORLD.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
