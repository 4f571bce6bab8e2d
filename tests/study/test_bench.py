"""``python -m mpirl.bench`` as a user runs it, and MPICH's forced algorithms beside it."""

import h5py
import numpy as np

import topologies
from mpirun import ROOT, run_mpi


def test_bench_prints_osu_blocks_and_ratios_and_writes_hdf5(tmp_path):
    out = tmp_path / "b.h5"
    result = run_mpi(3, ["-m", "mpirl.bench", "--sizes", "4", "64K", "--rounds", "1",
                         "--iters", "20", "--out", str(out)], timeout_s=180)
    text = result.output
    for op, forced in (("allreduce", ["recursive_doubling", "ring", "tree",
                                      "reduce_scatter_allgather"]),
                       ("bcast", ["binomial", "scatter_ring_allgather"])):
        for label in [*topologies.names(), *(f"native:{a}" for a in forced)]:
            assert f"# mpirl.bench {op}: {label}, 3 ranks" in text, (op, label)
        summary = text.split(f"# {op} summary")[1].split("\n\n")[0].splitlines()
        rows = [line for line in summary if line.strip().startswith(("4 B", "64 KiB"))]
        assert len(rows) == 2 and all("x 1.00" in row for row in rows)
        assert all(row.count("=") >= (3 if op == "allreduce" else 2) for row in rows)
    assert "# Size" in text and "Avg Latency(us)" in text
    with h5py.File(out) as f:
        rows = f["results"][...]
        assert set(rows["op"]) == {b"allreduce", b"bcast"} and f.attrs["world_size"] == 3
        assert len(rows) == 2 * 2 * (len(topologies.names())) + 2 * (4 + 2)
        home = rows[np.char.find(rows["topology"], b":") < 0]
        assert np.all(home["avg_s"] > 0)


def test_mpich_algorithms_are_forced_for_real():
    result = run_mpi(4, [str(ROOT / "tests" / "mpi" / "check_mpich.py")], timeout_s=120,
                     env={"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "ring"})
    assert "mpich forced algorithms: ok" in result.output


def test_bench_writes_hdf5_by_default(tmp_path):
    result = run_mpi(2, ["-m", "mpirl.bench", "--sizes", "1K", "--rounds", "1", "--iters", "5",
                         "--op", "bcast", "--mpich"], timeout_s=120, cwd=tmp_path)
    files = list((tmp_path / "runs" / "bench").glob("bench-2r-*.h5"))
    assert len(files) == 1 and f"# results: runs/bench/{files[0].name}" in result.output
    with h5py.File(files[0]) as f:
        assert set(f["results"]["op"]) == {b"bcast"}


def test_bench_rejects_an_unknown_topology_or_algorithm():
    result = run_mpi(2, ["-m", "mpirl.bench", "--topologies", "hypercube"], timeout_s=60,
                     check=False)
    assert result.returncode == 2 and "valid names" in result.output
    result = run_mpi(2, ["-m", "mpirl.bench", "--op", "bcast", "--mpich", "ring"],
                     timeout_s=60, check=False)
    assert result.returncode == 2 and "MPICH has no bcast algorithm ring" in result.output


def test_bench_times_the_blocking_path_beside_the_small_message_path(tmp_path):
    result = run_mpi(2, ["-m", "mpirl.bench", "--sizes", "1K", "--rounds", "1", "--iters", "20",
                         "--op", "allreduce", "--topologies", "butterfly", "ring", "star",
                         "--blocking", "--out", str(tmp_path / "b.h5")], timeout_s=120)
    text = result.output
    labels = [f"{name}/{path}" for name in ("butterfly", "ring")
              for path in ("blocking", "python")]       # the C replay is built (make install)
    for label in labels:
        assert f"# mpirl.bench allreduce: {label}, 2 ranks" in text
    assert "star/blocking" not in text           # star has no small-message path
    row = next(line for line in text.split("# allreduce summary")[1].splitlines()
               if line.strip().startswith("1 KiB"))
    assert row.count("=") == 6                   # each beside MPICH's same algorithm
    with h5py.File(tmp_path / "b.h5") as f:
        written = set(f["results"]["topology"])
    assert {label.encode() for label in labels} <= written
