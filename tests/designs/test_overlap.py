"""--overlap (mpirl.kit.overlap): the gradient's buckets averaged while backward runs,
under a real mpiexec, in the check script and in sync runs; its refusals."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import train_many
from mpirl.kit.overlap import buckets
from mpirun import ROOT, run_mpi


def test_buckets_are_whole_tensors_from_the_end():
    # tensors of 10, 100, 5, 1000, 3 floats; 64-byte buckets (16 floats)
    plan = buckets([10, 100, 5, 1000, 3], 4, 64)
    assert [(lo, hi) for lo, hi, _ in plan] == [(115, 1118), (10, 115), (0, 10)]
    assert [members for _, _, members in plan] == [[4, 3], [2, 1], [0]]
    assert buckets([10, 20], 4, 10 ** 9) == [(0, 30, [1, 0])]   # one bucket: everything


@pytest.mark.parametrize("nranks", [2, 3, 5])
def test_buckets_leave_during_backward_and_average_exactly(nranks):
    result = run_mpi(nranks, ["tests/mpi/check_overlap.py"], timeout_s=120, check=False)
    lines = result.output.splitlines()
    for case in ("bucketed averages: butterfly and native bytes unchanged, ring within "
                 "rounding",
                 "buckets leave during backward, in order; none outside start/wait"):
        assert f"OK {case}" in lines, result.tail()
    assert result.returncode == 0, result.tail()


def test_an_overlapped_run_ends_where_the_plain_one_does(tmp_path):
    """butterfly at 3 ranks: the same parameter SHA-256 with and without overlap; ring
    with overlap, and its buckets summed in bfloat16, keeps every replica identical
    (checked every update)."""
    run = ["--topology", "butterfly", "--total-steps", "1536"]
    runs = train_many(tmp_path, 3, {
        "plain": run, "over": [*run, "--overlap", "--bucket-mb", "0.005"],
        "ring": ["--topology", "ring", "--total-steps", "1536", "--overlap", "--bucket-mb",
                 "0.005", "--compress", "bf16", "--checksum-every", "1"]})
    plain, over, ring = runs["plain"], runs["over"], runs["ring"]
    assert over["param_digest"] == plain["param_digest"]
    assert over["updates"] == plain["updates"] > 5
    assert ring["updates"] == plain["updates"]


@pytest.mark.parametrize("flags, fragment", [
    (["--overlap", "--bucket-mb", "0"], "bucket_mb=0.0; allowed: a size in MiB > 0"),
    (["--bucket-mb", "4"], "bucket_mb=4.0 sizes --overlap's buckets; this run has no"),
    (["--overlap", "--mode", "async", "--topology", "star"],
     "overlap=True is not taken by mode='async'"),
    (["--overlap", "--compress", "topk"], "overlap with compress='topk' is not supported"),
    (["--overlap", "--on-failure", "shrink"], "overlap with on_failure='shrink'"),
])
def test_overlap_refusals_are_one_line(flags, fragment):
    done = subprocess.run([sys.executable, "-m", "mpirl.run", "--env", "CartPole-v1", *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert fragment in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
