"""The HDF5 run log, read back the way analysis and users read it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import yaml

from conftest import BATCH, launch_runs
from mpirl.telemetry.h5log import note_attempt, write_run_file
from mpirl.telemetry.read import open_run, read_h5
from mpirl.telemetry.schema import PHASES, UPDATE_DTYPE
from mpirun import start_mpi

#: BATCH, the log flushed every 7 updates (whole flushes are what a killed run keeps)
LOGGED = [*BATCH, "--log-flush-every", "7"]


#: the runs the first tests read back, all at 3 ranks, in one launch (fixture ``three``)
THREE = {"sync": ["--total-steps", "2400"],
         "async": ["--mode", "async", "--topology", "star", "--total-steps", "2400"]}


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """THREE with LOGGED in one 3-rank launch (one after another in the same processes,
    tests/mpi/runs.py: a launch costs a torch import per rank); each run's directory and
    summary, by name."""
    where = tmp_path_factory.mktemp("three")
    argvs = [[*LOGGED, *args, "--run-dir", str(where), "--run-name", name]
             for name, args in THREE.items()]
    launch_runs(3, argvs, timeout_s=600)
    return {name: (where / name, json.loads((where / name / "summary.json").read_text()))
            for name in THREE}


def test_sync_run_log_has_metadata_every_rank_and_every_update(three):
    run_dir, s = three["sync"]
    with h5py.File(run_dir / "run.h5", "r") as f:       # plain h5py after a clean end
        attrs = dict(f.attrs)
        assert json.loads(attrs["config_json"]) == yaml.safe_load(
            (run_dir / "config.yaml").read_text())
        assert attrs["world_size"] == 3 and attrs["mode"] == "sync"
        assert len(json.loads(attrs["hostnames_json"])) == 3
        assert attrs["oversubscribed"] == (3 > len(os.sched_getaffinity(0)))
        assert "MPICH" in attrs["mpi_library"] and attrs["end_unix_s"] > attrs["start_unix_s"]
        assert attrs["gradients_sent"] == s["gradients_sent"] == 3 * s["updates"]
        steps = 0
        for r in range(3):
            u = f[f"ranks/{r:04d}/updates"][...]
            assert u.dtype == UPDATE_DTYPE
            assert list(u["update"]) == list(range(1, s["updates"] + 1))
            assert np.all(np.diff(u["t_s"]) > 0)
            assert all(np.all(u[p] >= 0) for p in PHASES) and np.all(u["exchange_s"] > 0)
            assert np.all(u["bytes_sent"] > 0) and np.all(u["staleness"] == 0)
            steps += u["env_steps"].sum()
            assert f[f"ranks/{r:04d}"].attrs["rank"] == r
            assert len(f[f"ranks/{r:04d}/episodes"]) > 0
        assert steps == s["env_steps"]


def test_async_server_log_accounts_for_every_gradient(three):
    run_dir, s = three["async"]
    with open_run(run_dir / "run.h5") as f:
        server = f["ranks/0000/updates"][...]
        assert f["ranks/0000"].attrs["role"] == "server"
        assert len(server) == s["gradients_sent"]
        assert server["dropped"].sum() == s["gradients_dropped"]
        applied = server[server["dropped"] == 0]
        assert applied["staleness"].mean() == pytest.approx(s["mean_staleness"])
        pushes = sum(len(f[f"ranks/{r:04d}/updates"]) for r in (1, 2))
        assert pushes == s["gradients_sent"]


def wait_for_rows(job, run_dir, nranks: int, rows: int) -> None:
    """Until every rank's file holds ``rows`` update rows (read with plain h5py)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.5)
        try:
            if all(len(h5py.File(run_dir / f"rank{r:04d}.h5", "r")["updates"]) >= rows
                   for r in range(nranks)):
                return
        except (OSError, KeyError):       # not created yet, or caught mid-flush: again
            continue
        if job.poll() is not None:
            pytest.fail(f"the run ended before {rows} rows were flushed:\n{job.tail()}")
    pytest.fail(f"the run never flushed {rows} rows:\n{job.tail()}")


def read_everywhere(path):
    """Every table of an HDF5 file through plain h5py, h5dump and pandas (PyTables, its
    own HDF5 library): the readers a user opens a crashed run's log with."""
    import shutil

    import pandas as pd

    from conftest import require

    require(None if shutil.which("h5dump") else "no h5dump on PATH (Debian's hdf5-tools)")
    with h5py.File(path, "r") as f:                    # no swmr=True, no h5clear
        tables = {name: f[name][...] for name in f if isinstance(f[name], h5py.Dataset)}
        attrs = dict(f.attrs)
    out = subprocess.run(["h5dump", "-H", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "error" not in out.stderr.lower(), (path, out.stderr)
    for name, rows in tables.items():
        out = subprocess.run(["h5dump", "-d", f"/{name}", "-c", "1", str(path)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "error" not in out.stderr.lower(), (path, out.stderr)
        if len(rows):
            assert len(pd.read_hdf(path, name)) == len(rows), (path, name)
    return attrs, tables


#: opens a log with plain h5py (again while a flush is under way), says how many update
#: rows it holds, and keeps the file open
HOLDER = """
import sys, time
import h5py
for attempt in range(200):
    try:
        f = h5py.File(sys.argv[1], "r")
        rows = len(f["updates"])
        break
    except (OSError, KeyError):
        time.sleep(0.01)
print(rows, flush=True)
time.sleep(600)
"""


# kill -9 of one rank (the launcher then kills the others): a sync worker; rank 0, which
# also wrote run.h5; an async parameter server; and the whole job at once
@pytest.mark.parametrize("mode, victim", [("sync", 1), ("sync", 0), ("async", 0),
                                          ("sync", "job")])
@pytest.mark.filterwarnings("ignore:object name is a Python keyword")   # 'return': PyTables
def test_after_kill_9_every_file_opens_in_any_reader(tmp_path, mode, victim):
    from mpirl.resilience.sentinel import read_status, status_dir

    args = ["-m", "mpirl.run", *LOGGED, "--total-steps", "10000000", "--run-dir",
            str(tmp_path), "--run-name", "k", "--checkpoint-every", "0"]
    if mode == "async":
        args += ["--mode", "async", "--topology", "star"]
    run_dir = tmp_path / "k"
    with start_mpi(3, args) as job:
        wait_for_rows(job, run_dir, 3, 14)
        # a reader holding a log open (another process: a notebook) does not stop the
        # writer: rows keep coming.  It opens the way docs/log-schema.md tells a plain
        # h5py user to: again if it caught the file in the middle of a flush.
        seen = read_h5(run_dir / "rank0001.h5", lambda f: len(f["updates"]))
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir / "rank0001.h5")],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert int(holder.stdout.readline()) >= seen
            wait_for_rows(job, run_dir, 3, seen + 14)
        finally:
            holder.kill()
            holder.wait()
        if victim == "job":
            job.kill()
        else:
            os.kill(read_status(status_dir(run_dir) / f"rank{victim:04d}")["pid"], 9)
        job.wait(60)
    assert job.returncode != 0
    time.sleep(1.0)                       # the sentinels woke at the deaths: done by now
    attrs, _ = read_everywhere(run_dir / "run.h5")
    assert attrs["world_size"] == 3 and "end_unix_s" not in attrs
    for r in range(3):
        _, tables = read_everywhere(run_dir / f"rank{r:04d}.h5")
        u = tables["updates"]
        assert len(u) >= 14 and len(u) % 7 == 0                   # whole flushes only
        if mode == "sync" or r > 0:        # a server's rows are per push, not per update
            assert list(u["update"]) == list(range(1, len(u) + 1))
            # at most --log-flush-every rows lost: the rank had reported update N
            reached = read_status(status_dir(run_dir) / f"rank{r:04d}")["update"]
            assert 0 <= reached - len(u) <= 7, (r, reached, len(u))
            assert np.isfinite(u["policy_loss"]).all()


def test_h5dump_reads_run_and_rank_files(tiny_sweep):
    import shutil

    from conftest import require

    require(None if shutil.which("h5dump") else "no h5dump on PATH (Debian's hdf5-tools)")
    run_dir = tiny_sweep / "butterfly-sync-2r-s1"

    def dump(*args):
        out = subprocess.run(["h5dump", *args], cwd=run_dir, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0 and "error" not in out.stderr, out.stderr
        return out.stdout

    meta = dump("-A", "run.h5")
    assert 'ATTRIBUTE "world_size"' in meta and 'EXTERNAL_LINK "0001"' in meta
    header = dump("-H", "rank0001.h5")
    for column in ("exchange_t_s", "wait_s", "other_s", "log_s"):
        assert f'"{column}"' in header
    assert "(0): {" in dump("-d", "/updates", "-c", "1", "rank0001.h5")


def test_each_start_of_a_run_is_listed_also_in_a_file_from_before_the_list(tmp_path, capsys):
    """run.h5 lists the first start in ``attempts_json``; a resume adds its own (other
    hosts here), the top-level attrs staying the first start's; a file written before
    ``attempts_json`` existed gets its first start rebuilt from those attrs; without
    run.h5 a resume is warned of and goes on."""
    for old in (False, True):
        run = tmp_path / f"old{old}"
        run.mkdir()
        write_run_file(run, config={"mode": "sync", "topology": "ring", "env": "CartPole-v1"},
                       world_size=2, hostnames=["a", "a"], cores=[2, 2], mpi_library="MPICH",
                       version="0")
        if old:     # from before attempts_json, and before cluster_json too
            with h5py.File(run / "run.h5", "a") as f:
                del f.attrs["attempts_json"], f.attrs["cluster_json"]
        note_attempt(run, ["b", "c"], [4, 4], from_update=35)
        with h5py.File(run / "run.h5", "r") as f:
            starts = json.loads(f.attrs["attempts_json"])
            assert json.loads(f.attrs["hostnames_json"]) == ["a", "a"]
            first = starts[0]
            assert first["start_unix_s"] == f.attrs["start_unix_s"]
            assert first["cluster"] == ({} if old else json.loads(f.attrs["cluster_json"]))
        assert [s["from_update"] for s in starts] == [None, 35]
        assert [s["hostnames"] for s in starts] == [["a", "a"], ["b", "c"]]
        assert starts[1]["cores_per_node"] == {"b": 4, "c": 4}
        assert starts[1]["cluster"]["ranks_on"] == {"b": 1, "c": 1}
        assert starts[1]["start_unix_s"] >= first["start_unix_s"]
    gone = tmp_path / "gone"            # no run.h5: said, nothing created, no error
    gone.mkdir()
    note_attempt(gone, ["b"], [4], from_update=5)
    assert "is missing; this start is not recorded" in capsys.readouterr().out
    assert not (gone / "run.h5").exists()
