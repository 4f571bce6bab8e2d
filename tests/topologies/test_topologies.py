"""Every registered topology against MPI_Allreduce (and bcast against the root's data)
under a real mpiexec.

Parametrised over the registry and over rank counts that include non-powers of two;
each launch has a time cap (tests/mpirun.py), so a deadlock fails instead of hanging.
One launch per rank count checks every topology in turn (a launch costs more than the
checks); each topology's test then reads its own line of that job's output.
Data sizes are drawn from a seed that changes every run (printed on failure; set
MPIRL_TEST_SEED to replay one).
"""

from __future__ import annotations

import pytest

import topologies
from conftest import SEED
from mpirun import run_mpi

#: 5 and 7 are MPICH's fold with one and three extra ranks over q = 4; 8 has three levels
RANK_COUNTS = [1, 2, 3, 4, 5, 7, 8]
SCRIPT = "tests/mpi/check_topologies.py"
#: every registered topology, variants that exercise hierarchical's leader level on one
#: machine (emulated nodes of 2 and 3 ranks, so some nodes are short of ranks), and the
#: compression wrappers around a point-to-point topology, MPI's own (a user-defined half
#: sum) and a hierarchical one (MPI_Reduce with it, then butterfly among the leaders)
CHECKED = [*topologies.names(), "hierarchical:butterfly:2", "hierarchical:rabenseifner:3",
           "fp16:ring", "fp16:native", "bf16:hierarchical:butterfly:2"]
#: 16 Mi elements at 3 ranks (a fold and a power-of-two core): every topology with an
#: algorithm of its own (auto runs one of them; the hierarchical variants' leader level is
#: checked at every size up to 300k; native is MPI_Allreduce itself; star's whole-buffer
#: sends and adds are tree's, which is checked here, and star's 16 s went to the suite)
LARGE = [n for n in topologies.names() if n not in ("auto", "native", "star")]

#: (nranks, flags) -> the output of the job that checked every topology, or why it failed
_JOBS: dict[tuple, tuple[str, str | None]] = {}


def _checked(name: str, nranks: int, *flags: str, timeout_s: float) -> None:
    """Fail unless ``name`` passed every case of the job checking all topologies at
    ``nranks`` (run by the first test that asks, then shared)."""
    key = (nranks, flags)
    if key not in _JOBS:
        try:
            listed = LARGE if "--large" in flags else CHECKED
            job = run_mpi(nranks, [SCRIPT, ",".join(listed), str(SEED), *flags],
                          timeout_s=timeout_s, check=False)
            _JOBS[key] = (job.output, None)
        except pytest.fail.Exception as err:      # a deadlock: every topology's test says so
            _JOBS[key] = ("", str(err))
    output, failed = _JOBS[key]
    if failed:
        pytest.fail(failed, pytrace=False)
    lines = output.splitlines()
    fails = [line for line in lines if line.startswith(f"FAIL {name} ")]
    ends = [line for line in lines if line.startswith(f"{name} size={nranks} seed={SEED} cases=")]
    assert len(ends) == 1 and not fails, f"seed {SEED}:\n" + "\n".join(fails or ends) \
        + ("" if ends else output[-4000:])
    cases, failures = (int(field.split("=")[1]) for field in ends[0].split()[-2:])
    assert cases > 0 and failures == 0, f"seed {SEED}: {ends[0]}"


@pytest.mark.parametrize("nranks", RANK_COUNTS)
@pytest.mark.parametrize("name", CHECKED)
def test_matches_mpi_and_identical_on_all_ranks(name, nranks):
    _checked(name, nranks, timeout_s=300)


@pytest.mark.parametrize("nranks", [3])
@pytest.mark.parametrize("name", LARGE)
def test_sixteen_mebi_elements(name, nranks):
    _checked(name, nranks, "--large", timeout_s=400)


@pytest.mark.parametrize("nranks", [2, 5])
@pytest.mark.parametrize("name", [n for n in CHECKED if "native" not in n])
def test_mismatched_lengths_fail_loudly(name, nranks):
    # native is left to MPI's own check (MPICH aborts with "Message truncated"), and so is
    # hierarchical's node level (MPI_Reduce) where a node holds more than one rank
    result = run_mpi(nranks, [SCRIPT, name, str(SEED), "--mismatch"], timeout_s=60, check=False)
    assert result.returncode != 0, result.tail()
    caught = ["BufferMismatchError"] + (["Message truncated"] if "hierarchical" in name
                                        else [])
    assert any(words in result.output for words in caught), result.tail()
    assert "went unnoticed" not in result.output, result.tail()
