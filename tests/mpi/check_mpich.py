"""Run under mpiexec by tests/study/test_bench.py: MPICH algorithms forced through MPI_T.

Started with MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=ring in the environment, so MPICH's own
reading of it tells whether our name -> value mapping (the description's order) is right.
"""

import mpi4py

mpi4py.rc.thread_level = "multiple"
from mpi4py import MPI  # noqa: E402

import numpy as np  # noqa: E402

from mpirl.study.mpich import CVAR, DEVICE, FALLBACK, MpichTuning  # noqa: E402

comm = MPI.COMM_WORLD
comm.Set_errhandler(MPI.ERRORS_RETURN)
tuning = MpichTuning()
name = CVAR["allreduce"]
assert tuning.read(name) == "ring", tuning.read(name)            # from the environment
assert {"recursive_doubling", "ring", "reduce_scatter_allgather"} <= set(
    tuning.algorithms("allreduce"))
assert "binomial" in tuning.algorithms("bcast")
before = (tuning.read(DEVICE), tuning.read(FALLBACK))

# every forced algorithm gives MPI_Allreduce's answer
for algorithm in ("recursive_doubling", "ring", "tree", "reduce_scatter_allgather"):
    buf = np.arange(1000, dtype=np.float32) * (comm.rank + 1)
    with tuning.forced("allreduce", algorithm):
        assert tuning.read(name) == algorithm and tuning.read(FALLBACK) == "error"
        comm.Allreduce(MPI.IN_PLACE, buf)
    expected = np.arange(1000, dtype=np.float32) * sum(range(1, comm.size + 1))
    assert np.allclose(buf, expected), algorithm

# a forced algorithm that cannot take the arguments fails instead of falling back:
# reduce_scatter_allgather needs at least as many elements as ranks (one here)
refused = False
with tuning.forced("allreduce", "reduce_scatter_allgather"):
    try:
        comm.Allreduce(MPI.IN_PLACE, np.ones(1, dtype=np.float32))
    except MPI.Exception:
        refused = True
assert refused, "MPICH fell back silently"
assert tuning.read(name) == "ring" and (tuning.read(DEVICE), tuning.read(FALLBACK)) == before
if comm.rank == 0:
    print("mpich forced algorithms: ok")
