"""The Slurm path against a real single-node Slurm (``.ci/slurm-up`` starts one; CI runs
it before the suite and sets MPIRL_CI=1, so there a missing Slurm fails)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

import pytest

from conftest import BATCH, TINY, require, run_sweep
from mpirl.telemetry.read import open_run


def slurm_ready() -> str | None:
    """None when a Slurm controller answers and a node is usable, else why not."""
    if shutil.which("sinfo") is None:
        return "no sinfo on PATH (run .ci/slurm-up as root to start a local Slurm)"
    out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                         timeout=30)
    states = out.stdout.split()
    if out.returncode != 0 or not any(s.rstrip("*") in ("idle", "mixed", "allocated")
                                      and not s.endswith("*") for s in states):
        return f"Slurm not usable: sinfo says {out.stdout.strip() or out.stderr.strip()!r}"
    return None


@pytest.fixture(scope="module")
def slurm():
    require(slurm_ready())


#: the states a job (or an array's task) ends in
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "PREEMPTED", "SPECIAL_EXIT", "REVOKED"}


def sbatch_and_wait(args: list[str], run_dir, timeout_s: float = 300) -> str:
    """``sbatch --parsable ARGS``, then the job (every task of an array) polled every
    0.2 s until it has ended; fails unless every task COMPLETED, and returns the job id.
    (``sbatch --wait`` polls at growing intervals up to 10 s: a 4 s job took 10 s.)
    Slurm keeps an ended job's record ``MinJobAge`` (300 s, .ci/slurm-up) to read."""
    from conftest import ROOT

    out = subprocess.run(["sbatch", "--parsable", *args], cwd=ROOT,
                         env={**os.environ, "MPIRL_RUN_DIR": str(run_dir)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    job = out.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout_s
    while True:
        show = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True,
                              text=True, timeout=30)
        assert show.returncode == 0, f"scontrol show job {job}: {show.stderr.strip()}"
        states = re.findall(r"\bJobState=(\S+)", show.stdout)
        if states and ENDED.issuperset(states):
            break
        assert time.monotonic() < deadline, f"job {job} not ended in {timeout_s} s: {states}"
        time.sleep(0.2)
    assert set(states) == {"COMPLETED"}, show.stdout
    return job


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_sweep_submitted_to_slurm_leaves_run_directories_and_logs(slurm, tmp_path, launcher):
    definition = {"name": f"slurm-{launcher}", "config": {**TINY, "total_steps": 640},
                  "grid": {"ranks": [1, 2], "topology": ["butterfly"]},
                  "slurm": {"time": "00:05:00", "nodes": 1, "launcher": launcher}}
    result = run_sweep(definition, tmp_path, "--launcher", "slurm", "--submit", "--wait", "300")
    assert result.returncode == 0, result.stdout + result.stderr
    sweep_dir = tmp_path / definition["name"]
    jobs = dict(line.split()[::-1] for line in
                (sweep_dir / "slurm" / "jobs.txt").read_text().splitlines())
    for ranks in (1, 2):
        name = f"butterfly-sync-{ranks}r-s1"
        summary = json.loads((sweep_dir / name / "summary.json").read_text())
        assert summary["ranks"] == ranks and summary["env_steps"] >= 640 - 16 * ranks
        with open_run(sweep_dir / name / "run.h5") as f:
            assert f.attrs["world_size"] == ranks
            scheduler = json.loads(f.attrs["scheduler_json"])
            assert scheduler["SLURM_JOB_ID"] == jobs[name]
            assert scheduler["SLURM_JOB_NAME"] == f"mpirl-{definition['name']}-{name}"
            for r in range(ranks):
                assert len(f[f"ranks/{r:04d}/updates"]) == summary["updates"]
        log = sweep_dir / "logs" / f"{name}.slurm-{jobs[name]}.out"
        assert "run files:" in log.read_text()
    # submitted again, nothing is left to do
    again = run_sweep(definition, tmp_path, "--launcher", "slurm", "--submit")
    assert again.returncode == 0 and "2 done, 0 to run" in again.stdout


def test_a_failed_point_resubmitted_resumes_from_its_checkpoints(slurm, tmp_path):
    """A point's job ends early (a rank dies after update 37, checkpoints every 5);
    submitting the sweep again, its batch script resumes the run from update 35."""
    definition = {"name": "slurm-resume",
                  "config": {**TINY, "total_steps": 2560, "checkpoint_every": 5,
                             "fail": ["1@37"]},
                  "grid": {"ranks": [2], "topology": ["butterfly"]},
                  "slurm": {"time": "00:05:00", "nodes": 1}}
    name = "butterfly-sync-2r-s1"
    first = run_sweep(definition, tmp_path, "--launcher", "slurm", "--submit", "--wait", "150")
    assert first.returncode == 1 and f"1 point(s) failed: {name}" in first.stderr, first.stdout
    again = run_sweep(definition, tmp_path, "--launcher", "slurm", "--submit", "--wait", "150")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"{name}: resume from update 35" in again.stdout
    sweep_dir = tmp_path / definition["name"]
    assert "args=(--resume " in (sweep_dir / "slurm" / f"{name}.sbatch").read_text()
    job = (sweep_dir / "slurm" / "jobs.txt").read_text().splitlines()[-1].split()[0]
    log = (sweep_dir / "logs" / f"{name}.slurm-{job}.out").read_text()
    assert f"sweep: {name}: resume from update 35" in log and "injected failure" not in log
    summary = json.loads((sweep_dir / name / "summary.json").read_text())
    assert summary["env_steps"] == 2560 and not (sweep_dir / "incomplete").exists()
    with open_run(sweep_dir / name / "run.h5") as f:
        for r in range(2):           # rows after the checkpoint were cut: none twice, none lost
            assert list(f[f"ranks/{r:04d}/updates"]["update"]) == list(range(1, 81))


def test_hand_written_array_template_runs_one_topology_per_task(slurm, tmp_path):
    array_id = sbatch_and_wait(
        ["--ntasks=2", "--array=0-1", f"--output={tmp_path}/slurm-%A_%a.out",
         "experiments/slurm/topologies_array.sbatch", "--total-steps", "640", *BATCH], tmp_path)
    for topology in ("native", "star"):         # TOPOLOGIES[0], TOPOLOGIES[1]
        run_dir = tmp_path / f"array-{array_id}" / f"{topology}-2r"
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["topology"] == topology and summary["ranks"] == 2
        with open_run(run_dir / "run.h5") as f:
            assert json.loads(f.attrs["scheduler_json"])["SLURM_ARRAY_JOB_ID"] == array_id


def test_hand_written_single_run_template(slurm, tmp_path):
    job = sbatch_and_wait(
        ["--ntasks=3", "--job-name=one", f"--output={tmp_path}/slurm-%j.out",
         "experiments/slurm/run.sbatch", "--topology", "ring", "--total-steps", "640", *BATCH],
        tmp_path)
    summary = json.loads((tmp_path / f"one-{job}" / "summary.json").read_text())
    assert summary["topology"] == "ring" and summary["ranks"] == 3
