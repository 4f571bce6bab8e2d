"""Several ``mpirl.run`` runs, one after another, in one mpiexec launch: a launch costs
a torch import per rank, which tests comparing runs need not pay for each.

Usage: mpiexec -n N python tests/mpi/runs.py ARGS_JSON
ARGS_JSON: a list of argument lists, each one run's ``python -m mpirl.run`` arguments.
Every run must exit 0; the first that does not ends the launch with its exit status.
"""

from __future__ import annotations

import json
import sys

from mpirl import run


def main() -> int:
    for argv in json.loads(sys.argv[1]):
        code = run.run_main(argv)
        if code:
            print(f"runs.py: {argv} exited {code}", flush=True)
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
