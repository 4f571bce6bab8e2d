"""``python -m mpirl.soak`` under a real mpiexec: long runs of exactly checked exchanges.

The short runs here are part of the default suite (a few hundred exchanges per topology
at 8 ranks and at a non-power of two); the long one (thousands per topology) is marked
``soak`` and deselected by default: ``python -m pytest -m soak``.  The checks themselves
are tested by injecting each kind of fault (``--corrupt``) and expecting it named.
Seeds change every run (printed; MPIRL_TEST_SEED replays one).
"""

from __future__ import annotations

import os
import random
import re
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import topologies
from conftest import SEED
from mpirl.study.soak import Pattern, topology_tags
from mpirun import run_mpi

ALL = [*topologies.names(), "paramserver"]


def summary_rows(output: str) -> dict[str, list[str]]:
    """The per-topology summary rows, by topology name."""
    rows = {}
    for line in output.splitlines():
        cells = line.split()
        if cells and cells[0] in ALL and len(cells) == 9:
            rows[cells[0]] = cells
    return rows


def soak(nranks: int, *args: str, timeout_s: float = 300, check: bool = False):
    return run_mpi(nranks, ["-m", "mpirl.soak", "--seed", str(SEED), *args],
                   timeout_s=timeout_s, check=check)


def assert_clean(result, exchanges: int) -> None:
    assert result.returncode == 0, f"seed {SEED}:\n{result.tail(60)}"
    rows = summary_rows(result.output)
    assert sorted(rows) == sorted(ALL), result.tail(60)
    for name, cells in rows.items():
        assert int(cells[1]) == exchanges, (name, cells)
        assert int(cells[-1]) == 0, (name, cells)
        assert float(cells[3]) > 0, (name, cells)      # bytes really travelled
    assert "# mpirl.soak: ok" in result.output and "FAIL" not in result.output


@pytest.mark.parametrize("nranks, exchanges", [(8, 120), (5, 120)])
def test_short_soak_checks_every_exchange(nranks, exchanges):
    assert_clean(soak(nranks, "--exchanges", str(exchanges)), exchanges)


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_long_soak():
    """Thousands of exchanges per topology at 8 ranks (``MPIRL_SOAK_EXCHANGES``)."""
    exchanges = int(os.environ.get("MPIRL_SOAK_EXCHANGES", 5000))
    started = time.monotonic()
    result = soak(8, "--exchanges", str(exchanges), timeout_s=3500)
    print(result.output[-3000:], f"\nwall time {time.monotonic() - started:.0f} s")
    assert_clean(result, exchanges)


def test_every_injected_fault_is_named():
    """Each check fails when it should: a wrong value, a one-ulp difference between ranks
    (within the average's tolerance, so only the byte-identity check can see it), a
    message sent and never received, a receive left posted, and a leak."""
    result = soak(3, "--exchanges", "30", "--topologies", "ring", "paramserver",
                  "--corrupt", "value:1@2", "--corrupt", "ulp:2@0", "--corrupt", "stray:1@5",
                  "--corrupt", "stale:2@6", "--corrupt", "leak:0@3", timeout_s=120)
    out = result.output
    assert result.returncode == 1, result.tail(60)
    fails = [line for line in out.splitlines() if line.startswith("mpirl.soak: FAIL")]
    ring = [line for line in fails if line.startswith("mpirl.soak: FAIL ring ")]
    server = [line for line in fails if line.startswith("mpirl.soak: FAIL paramserver ")]

    def one(lines, *fragments):
        hits = [line for line in lines if all(f in line for f in fragments)]
        assert len(hits) == 1, f"seed {SEED}: {fragments} in:\n{result.tail(60)}"
        return hits[0]

    wrong = one(ring, "rank 1 exchange ", "of ", "elements wrong")
    assert " n=" in wrong and any(op in wrong for op in ("allreduce-", "bcast"))
    one(ring, "allreduce-avg", "rank 2 exchange ", "not byte-identical to rank 0's")
    for lines in (ring, server):
        one(lines, "rank 2: a stray message from rank 1 (tag 11, 32 bytes)")
        one(lines, "rank 2: a receive from rank 0 was left posted (it took the probe with tag 12)")
        one(lines, "rank 0: resident memory grew by", "(limit 16 MiB)")
    one(server, "rank 1 round ", "reply element")
    assert "# mpirl.soak: FAILED" in out


def test_a_stalled_exchange_ends_the_job():
    started = time.monotonic()
    result = soak(3, "--exchanges", "30", "--topologies", "tree", "--deadline-s", "3",
                  "--corrupt", "hang:1@4", timeout_s=120)
    assert result.returncode != 0, result.tail()
    # the watchdog polls every 0.75 s: 3 s late shows as "3 s" or "4 s"
    assert re.search(r"made no progress for [34] s after exchange", result.output), \
        result.tail()
    assert "in tree exchange" in result.output and "(--deadline-s 3)" in result.output
    assert time.monotonic() - started < 60


def test_bad_arguments_stop_with_one_line():
    result = soak(2, "--corrupt", "value:1", timeout_s=60)
    assert result.returncode == 2
    assert result.output.count("mpirl.soak: error: argument --corrupt: 'value:1'") == 1


@settings(max_examples=50, deadline=None)
@given(size=st.integers(1, 1024), count=st.integers(0, 3000), key=st.integers(0, 2**30))
def test_pattern_sums_are_exact_in_float32(size, count, key):
    """The expected sum is the sum of every rank's values, and any partial sum of them is
    an integer float32 holds exactly (|sum| < 2**24)."""
    pattern = Pattern(size, max(count, 1))
    ranks = range(size) if size <= 64 else random.Random(key).sample(range(size), 64)
    values = np.stack([pattern.own(count, r, key) for r in ranks]) if count else None
    if values is not None:
        assert np.all(np.abs(values) * size < 2**24)
        if size <= 64:
            assert np.array_equal(values.sum(axis=0), pattern.sum(count, key))
            assert np.array_equal(values.astype(np.float32).sum(axis=0, dtype=np.float32),
                                  pattern.sum(count, key))


def test_probe_tags_cover_every_tag_the_topologies_send_on():
    tags = topology_tags()
    # star and tree send their allreduce's broadcast half on the reduce tag + 100
    for expected in (11, 12, 111, 21, 121, 31, 34, 41, 43, 51, 54):
        assert expected in tags
