"""Reading mpirl's HDF5 run logs into tidy tables, and drawing the figures of a study.

    python -m analysis.plot runs/sweeps/topologies -o figures/     # every figure, PNG + PDF

The loaders (:mod:`analysis.load`) and the figures (:mod:`analysis.figures`) are what
the command line and the notebooks in ``analysis/notebooks/`` share.
"""

from .load import (Run, Sweep, breakdown, find_bench, find_runs, load_bench, load_run,
                   load_sweep, scaling)

__all__ = ["Run", "Sweep", "breakdown", "find_bench", "find_runs", "load_bench", "load_run",
           "load_sweep", "scaling"]
