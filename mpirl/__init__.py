"""mpirl: MPI collective communication for distributed reinforcement learning.

    mpirun -np 4 python -m mpirl.run --mode sync --topology ring     # the command line
    import mpirl; mpirl.train({"mode": "sync"}, ranks=4)               # the same from Python

Importing the package registers mpirl's own envs (``Delay-v0``, ``L2Run-v0``) with
gymnasium, so ``gymnasium.make("Delay-v0")`` works after ``import mpirl``; neither torch
nor MPI is imported by it.  docs/api.md: the Python API, your own env and network.
"""

__version__ = "0.1.0"

from .parts import envs as _envs  # noqa: E402,F401  (registers L2Run-v0 and Delay-v0)
from .api import TrainError, TrainResult, train  # noqa: E402
from .errors import ConfigError  # noqa: E402

__all__ = ["ConfigError", "TrainError", "TrainResult", "train"]
