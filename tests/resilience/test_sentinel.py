"""The sentinel, against ``kill -9`` of one rank as a user (or the OOM killer) does it:
the job ends within seconds with one line naming the rank and its update, every log
opens, and the run resumes to a complete log.  (The sentinel naming a killed parameter
server is checked in tests/resilience/test_ulfm.py; the sentinel does not depend on the
mode or the MPI.)"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import h5py
import numpy as np

from conftest import BATCH
from mpirl.resilience.sentinel import read_status, status_dir
from mpirl.telemetry.read import open_run
from mpirun import MPIJob, run_mpi, start_mpi

#: slow enough to kill mid-run (Delay-v0: 5 ms per env step, 16 steps per update)
SLOW = ["--env", "Delay-v0", "--env-arg", "cost_s=0.005", "--env-arg", "episode_steps=40",
        *BATCH, "--log-flush-every", "3"]


def start(run_dir: Path, nranks: int, args: list[str]) -> MPIJob:
    return start_mpi(nranks, ["-m", "mpirl.run", *SLOW, *args, "--run-dir", str(run_dir.parent),
                              "--run-name", run_dir.name])


def kill_when(job: MPIJob, run_dir: Path, rank: int, nranks: int,
              update: int) -> tuple[dict, float]:
    """SIGKILL ``rank`` once it has reported ``update``; returns its last status and the
    seconds from the kill to the end of mpiexec."""
    status = job.reached(run_dir, rank, update)
    os.kill(status["pid"], signal.SIGKILL)
    killed = time.monotonic()
    job.wait(60, what="the job did not end within 60 s of a rank's SIGKILL")
    return status, time.monotonic() - killed


def test_a_killed_rank_is_named_and_the_run_resumes_to_a_complete_log(tmp_path):
    run_dir = tmp_path / "k"
    with start(run_dir, 3, ["--topology", "butterfly", "--total-steps", "3360",
                            "--checkpoint-every", "5"]) as job:
        status, took = kill_when(job, run_dir, 1, 3, 12)
    out = job.output
    assert job.returncode != 0 and took < 10, (took, out[-2000:])
    assert out.count("died without a word") == 1, out[-2000:]   # the dead rank alone
    line = next(s for s in out.splitlines() if "died without a word" in s)
    assert line.startswith(f"mpirl: rank 1 (pid {status['pid']} on ")
    died_at = int(line.split("at update ")[1].split(",")[0])
    assert died_at >= status["update"]
    assert "rank 0 " in line and "rank 2 " in line and f"--resume {run_dir}" in line
    # every record flushed before the kill can be read back, on every rank
    with open_run(run_dir / "run.h5") as f:         # SWMR read: the writers died
        assert f.attrs["world_size"] == 3 and "end_unix_s" not in f.attrs
        for r in range(3):
            updates = f[f"ranks/{r:04d}/updates"]["update"]
            assert len(updates) >= 9 and np.array_equal(updates, np.arange(1, len(updates) + 1))
    resumed = run_mpi(3, ["-m", "mpirl.run", "--resume", str(run_dir)], timeout_s=240)
    assert "died without a word" not in resumed.output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 3360
    for r in range(3):                         # none twice, none lost across kill and resume
        with h5py.File(run_dir / f"rank{r:04d}.h5", "r") as f:
            assert list(f["updates"]["update"]) == list(range(1, summary["updates"] + 1))
        assert read_status(status_dir(run_dir) / f"rank{r:04d}")["state"] == 1   # clean exit
