"""Checkpoints and --resume (sync): a killed run continues to the same parameters, its
log continues in place with no update twice or missing; SIGTERM checkpoints and stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np

from mpirl.launch import mpi_env, mpiexec_command
from mpirun import ROOT, run_mpi

RUN = ["--total-steps", "2560", "--num-envs", "2", "--rollout-steps", "8",
       "--checkpoint-every", "5", "--log-flush-every", "7"]


def summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def test_killed_run_resumes_to_the_same_parameters_and_a_complete_log(tmp_path):
    run_mpi(3, ["-m", "mpirl.run", *RUN, "--run-dir", str(tmp_path), "--run-name", "full"],
            timeout_s=180)
    killed = run_mpi(3, ["-m", "mpirl.run", *RUN, "--run-dir", str(tmp_path), "--run-name",
                         "cut", "--fail", "1@37"], timeout_s=180, check=False)
    assert killed.returncode != 0 and not (tmp_path / "cut" / "summary.json").exists()
    resumed = run_mpi(3, ["-m", "mpirl.run", "--resume", str(tmp_path / "cut")], timeout_s=180)
    assert "injected failure" not in resumed.output       # --fail is not carried over
    full, cut = summary(tmp_path / "full"), summary(tmp_path / "cut")
    assert cut["param_digest"] == full["param_digest"]     # bit-identical continuation
    assert (cut["updates"], cut["env_steps"]) == (full["updates"], full["env_steps"])
    for r in range(3):
        with h5py.File(tmp_path / "cut" / f"rank{r:04d}.h5", "r") as f, \
                h5py.File(tmp_path / "full" / f"rank{r:04d}.h5", "r") as g:
            updates = f["updates"]["update"]
            assert list(updates) == list(range(1, full["updates"] + 1))   # none twice, none lost
            assert np.array_equal(f["episodes"]["return"], g["episodes"]["return"])
            assert np.all(np.diff(f["updates"]["t_s"]) > 0)   # one clock across the resume


def test_sigterm_checkpoints_on_every_rank_and_the_run_resumes(tmp_path):
    args = ["--total-steps", "24000", "--num-envs", "2", "--rollout-steps", "8",
            "--checkpoint-every", "1000", "--log-every", "5"]
    cmd = mpiexec_command(2, [sys.executable, "-m", "mpirl.run", *args, "--run-dir",
                              str(tmp_path), "--run-name", "t"])
    proc = subprocess.Popen(cmd, cwd=ROOT, env=mpi_env({"PYTHONPATH": str(ROOT)}),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    progress = tmp_path / "t" / "progress.csv"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (progress.is_file()
                                               and progress.read_text().count("\n") >= 2):
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)              # what Slurm does at the time limit
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the run did not stop within 60 s of SIGTERM") from None
    assert proc.returncode == 143, out[-2000:]
    assert "stopped by a signal after update" in out and "--resume" in out
    stopped_at = int(out.split("stopped by a signal after update ")[1].split(";")[0])
    assert 0 < stopped_at < 750
    for r in range(2):
        assert (tmp_path / "t" / "checkpoints" / f"rank{r:04d}.pt").is_file()
        with h5py.File(tmp_path / "t" / f"rank{r:04d}.h5", "r") as f:   # closed cleanly
            assert f["updates"]["update"][-1] == stopped_at
    run_mpi(2, ["-m", "mpirl.run", "--resume", str(tmp_path / "t")], timeout_s=240)
    assert summary(tmp_path / "t")["env_steps"] == 24000


def test_resume_is_refused_where_it_cannot_work(tmp_path):
    result = run_mpi(2, ["-m", "mpirl.run", "--resume", str(tmp_path / "nothing")],
                     timeout_s=60, check=False)
    assert result.returncode == 2 and "no " in result.output and "config.yaml" in result.output
    run_mpi(2, ["-m", "mpirl.run", *RUN, "--run-dir", str(tmp_path), "--run-name", "two"],
            timeout_s=180)
    result = run_mpi(3, ["-m", "mpirl.run", "--resume", str(tmp_path / "two")], timeout_s=60,
                     check=False)
    assert result.returncode == 2 and "no checkpoint for ranks [2]" in result.output
