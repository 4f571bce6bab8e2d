"""``python -m mpirl.bench`` as a user runs it: a table with every topology's ratio to native."""

import topologies
from mpirun import run_mpi


def test_bench_prints_a_row_per_size_and_a_ratio_per_topology():
    result = run_mpi(3, ["-m", "mpirl.bench", "--sizes", "4", "64K", "--rounds", "1",
                         "--iters", "20"], timeout_s=120)
    lines = result.output.splitlines()
    header = next(line for line in lines if line.split()[:1] == ["size"])
    assert header.split()[1:] == topologies.names()
    rows = [line for line in lines if line.strip().startswith(("4 B", "64 KiB"))]
    assert len(rows) == 2
    for row in rows:
        assert row.count("x") == len(topologies.names()) and "x 1.00" in row


def test_bench_rejects_an_unknown_topology():
    result = run_mpi(2, ["-m", "mpirl.bench", "--topologies", "hypercube"], timeout_s=60,
                     check=False)
    assert result.returncode == 2 and "valid names" in result.output
