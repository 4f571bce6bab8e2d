"""Every registered topology against MPI_Allreduce / MPI_Bcast under a real mpiexec.

Parametrised over the registry and over rank counts that include non-powers of two;
each launch has a time cap (tests/mpirun.py), so a deadlock fails instead of hanging.
Data sizes are drawn from a seed that changes every run (printed on failure; set
MPIRL_TEST_SEED to replay one).
"""

from __future__ import annotations

import pytest

import topologies
from conftest import SEED
from mpirun import run_mpi

RANK_COUNTS = [1, 2, 3, 4, 5, 8]
SCRIPT = "tests/mpi/check_topologies.py"


@pytest.mark.parametrize("nranks", RANK_COUNTS)
@pytest.mark.parametrize("name", topologies.names())
def test_matches_mpi_and_identical_on_all_ranks(name, nranks):
    result = run_mpi(nranks, [SCRIPT, name, str(SEED)], timeout_s=120, check=False)
    assert result.returncode == 0, f"seed {SEED}:\n{result.tail()}"
    assert "cases=" in result.output and "failures=0" in result.output, result.tail()


@pytest.mark.parametrize("nranks", [3, 4])
@pytest.mark.parametrize("name", topologies.names())
def test_sixteen_mebi_elements(name, nranks):
    result = run_mpi(nranks, [SCRIPT, name, str(SEED), "--large"], timeout_s=180, check=False)
    assert result.returncode == 0, result.tail()
    assert "failures=0" in result.output, result.tail()


@pytest.mark.parametrize("nranks", [2, 5])
@pytest.mark.parametrize("name", [n for n in topologies.names() if n != "native"])
def test_mismatched_lengths_fail_loudly(name, nranks):
    # native is left to MPI's own check (MPICH aborts with "Message truncated").
    result = run_mpi(nranks, [SCRIPT, name, str(SEED), "--mismatch"], timeout_s=60, check=False)
    assert result.returncode != 0, result.tail()
    assert "BufferMismatchError" in result.output, result.tail()
    assert "went unnoticed" not in result.output, result.tail()
