"""--obs-norm in the learner and server designs: the learner (impala, seed, ga3c) or the
parameter server (async, quorum) owns the statistics, and they travel with its
parameters (tests/mpi/check_learner_owned.py, under mpiexec)."""

from __future__ import annotations

import pytest

from mpirun import run_mpi


@pytest.mark.parametrize("nranks", [3, 4])
def test_actors_act_with_the_learners_statistics_of_their_version(nranks, tmp_path):
    result = run_mpi(nranks, ["tests/mpi/check_learner_owned.py", str(tmp_path)],
                     timeout_s=240, check=False)
    lines = result.output.splitlines()
    cases = ["impala push", "impala broadcast", "ga3c", "seed", "async", "quorum"]
    for case in cases + (["impala 2 learners"] if nranks >= 4 else []):
        assert f"OK {case}" in lines, result.tail()
    assert result.returncode == 0, result.tail()
