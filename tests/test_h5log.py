"""The HDF5 run log, read back the way analysis and users read it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import yaml

from mpirl.telemetry.read import open_run
from mpirl.telemetry.schema import PHASES, UPDATE_DTYPE
from mpirl.launch import mpi_env, mpiexec_command
from mpirun import ROOT, run_mpi

SMALL = ["--num-envs", "2", "--rollout-steps", "8", "--log-flush-every", "7"]


def run(tmp_path, nranks, *args, name="r"):
    run_mpi(nranks, ["-m", "mpirl.run", *SMALL, *args, "--run-dir", str(tmp_path),
                     "--run-name", name], timeout_s=180)
    run_dir = tmp_path / name
    return run_dir, json.loads((run_dir / "summary.json").read_text())


def test_sync_run_log_has_metadata_every_rank_and_every_update(tmp_path):
    run_dir, s = run(tmp_path, 3, "--total-steps", "2400")
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


def test_async_server_log_accounts_for_every_gradient(tmp_path):
    run_dir, s = run(tmp_path, 3, "--mode", "async", "--topology", "star",
                     "--total-steps", "2400")
    with open_run(run_dir / "run.h5") as f:
        server = f["ranks/0000/updates"][...]
        assert f["ranks/0000"].attrs["role"] == "server"
        assert len(server) == s["gradients_sent"]
        assert server["dropped"].sum() == s["gradients_dropped"]
        applied = server[server["dropped"] == 0]
        assert applied["staleness"].mean() == pytest.approx(s["mean_staleness"])
        pushes = sum(len(f[f"ranks/{r:04d}/updates"]) for r in (1, 2))
        assert pushes == s["gradients_sent"]


def test_logs_survive_sigkill_and_stay_readable(tmp_path):
    """Kill the whole job mid-run: every log opens, and holds all but the unflushed rows."""
    cmd = mpiexec_command(3, [sys.executable, "-m", "mpirl.run", *SMALL, "--total-steps",
                              "10000000", "--run-dir", str(tmp_path), "--run-name", "k"])
    proc = subprocess.Popen(cmd, cwd=ROOT, env=mpi_env({"PYTHONPATH": str(ROOT)}),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    run_h5 = tmp_path / "k" / "run.h5"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(1)
            try:
                with open_run(run_h5) as f:
                    if all(len(f[f"ranks/{r:04d}/updates"]) >= 14 for r in range(3)):
                        break
            except (OSError, KeyError):
                continue
        else:
            pytest.fail("the run never flushed two batches of rows")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    with open_run(run_h5) as f:
        assert "end_unix_s" not in f.attrs
        for r in range(3):
            u = f[f"ranks/{r:04d}/updates"][...]
            assert len(u) >= 14 and len(u) % 7 == 0        # whole flushes only
            assert list(u["update"]) == list(range(1, len(u) + 1))


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
