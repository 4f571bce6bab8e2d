"""Property-based tests (hypothesis) of topology inputs under a real mpiexec.

Hypothesis draws batches of cases (sizes from 0, dtypes, roots, unaligned and 2-D
buffers, ring segment sizes, infinities and NaNs) on the pytest side and passes them to
tests/mpi/fuzz_topologies.py at rank counts the other tests do not use.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import topologies
from conftest import SEED
from mpirun import run_mpi


def case_strategy(name: str | None = None) -> st.SearchStrategy:
    return st.fixed_dictionaries({
        "topology": st.sampled_from(topologies.names()) if name is None else st.just(name),
        "op": st.sampled_from(["sum", "avg", "bcast"]),
        "n": st.one_of(st.integers(0, 12), st.integers(13, 5000), st.integers(5000, 300_000)),
        "dtype": st.sampled_from(["float32", "float64"]),
        "root": st.integers(0, 63),
        "topo_root": st.integers(0, 63),
        "offset": st.sampled_from([0, 0, 4, 8, 1, 3]),
        "rows": st.sampled_from([0, 0, 2, 3, 7]),
        "segment_bytes": st.sampled_from([0, 8, 12, 64, 1000, 4096]),
        "special": st.sampled_from([0, 0, 0, 1, 3, 10]),
    })


@pytest.mark.parametrize("nranks", [2, 6, 7])
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(cases=st.lists(case_strategy(), min_size=40, max_size=60))
def test_topologies_take_any_buffer_at_other_rank_counts(nranks, cases):
    """Non-powers of two with 2 and 3 folded pairs (6, 7), sizes 0 to 300 000, float32
    and float64, roots beyond the rank count (taken mod N), unaligned and 2-D buffers,
    ring bcasts cut into segments of 1 element up, infinities and NaNs."""
    result = run_mpi(nranks, ["tests/mpi/fuzz_topologies.py", str(SEED), json.dumps(cases)],
                     timeout_s=180, check=False)
    assert result.returncode == 0 and "failures=0" in result.output, \
        f"seed {SEED}:\n{result.tail(30)}"
