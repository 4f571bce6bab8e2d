"""Failures end the job fast and say where; a hanging rank is caught by the watchdog;
NaNs stop or are skipped everywhere alike.  (Ranks launched with different
configurations are refused at start: tests/test_run.py.)"""

from __future__ import annotations

import json
import time

import pytest

from conftest import SHORT, train_many
from mpirl.config import FaultSpecError, parse_faults
from mpirun import run_mpi


def run(tmp_path, nranks, *args, check=False, timeout_s=120):
    started = time.monotonic()
    result = run_mpi(nranks, ["-m", "mpirl.run", *SHORT, "--run-dir", str(tmp_path),
                              "--run-name", "r", *args], timeout_s=timeout_s, check=check)
    return result, time.monotonic() - started


def test_fault_specs_are_checked():
    assert parse_faults(["2@5", "1@3:nan"]) == {2: (5, "exit"), 1: (3, "nan")}
    for bad, message in (("2-5", "expected RANK@UPDATE"), ("1@0", "UPDATE >= 1"),
                         ("1@2:melt", "kind 'melt'"), ("4@1", "rank 4 does not exist")):
        with pytest.raises(FaultSpecError, match=message):
            parse_faults([bad], world_size=3)


# The launcher reports the dead rank's own status (17 for the injected exit, 1 after
# MPI_Abort) or that of a rank it killed to end the job (9, SIGKILL): which one varies.
@pytest.mark.parametrize("kind, codes, says", [
    ("exit", (17, 9), "injected failure (exit) on rank 1 at update 3"),
    ("raise", (1, 9), "error on rank 1: InjectedFault: injected failure on rank 1 at update 3"),
    ("nan", (1, 9), "rank 1: non-finite loss or gradient at update 3 (--nan-policy stop"),
])
def test_a_failing_rank_ends_the_whole_job_naming_rank_and_update(tmp_path, kind, codes, says):
    result, took = run(tmp_path, 3, "--fail", f"1@3:{kind}")
    assert result.returncode in codes and says in result.output, result.tail()
    assert "done:" not in result.output and took < 60
    # a rank that vanishes is named by its sentinel; one that reported its error is not
    named = "mpirl: rank 1 (pid " in result.output and "died without a word at update 2" \
        in result.output
    assert named == (kind == "exit") and result.output.count("died without a word") <= 1


def test_a_hanging_rank_is_caught_by_the_watchdog(tmp_path):
    result, took = run(tmp_path, 3, "--fail", "1@3:hang", "--watchdog-s", "3")
    assert result.returncode in (4, 9), result.tail()      # 9: a rank the launcher killed
    assert "rank 1 made no progress" in result.output and "computing update 3" in result.output
    assert "in the exchange of update 3, waiting for other ranks" in result.output
    assert took < 60


def test_a_warm_up_longer_than_the_watchdog_is_progress(tmp_path):
    """A replay's warm-up has no update, and on a slow env it can outlast the watchdog
    (L2Run's outlasted the default 600 s on a loaded machine, and the job was ended).
    Both runs in one launch of 3 ranks:

    * sync-replay's ranks beat rollout by rollout (8 env steps of 3 ms; 188 of them, 4.5 s
      at least, before the first update; a 2 s watchdog);
    * apex's learner beats at each parameter request of its actor it answers (one actor
      at 2 ms a step, 1600 transitions: 3.2 s at least; a 2.5 s watchdog, which ended
      the job before: "rank 0 made no progress")."""
    runs = train_many(tmp_path, 3, {
        "sync-replay": ["--mode", "sync-replay", "--env", "Delay-v0", "--env-arg",
                        "cost_s=0.003", "--num-envs", "1", "--rollout-steps", "8",
                        "--learning-starts", "4500", "--total-steps", "4800",
                        "--update-repeat", "1", "--watchdog-s", "2"],
        "apex": ["--mode", "apex", "--env", "Delay-v0", "--env-arg", "cost_s=0.002",
                 "--learning-starts", "1600", "--replay-batch", "32", "--actor-refresh-steps",
                 "64", "--total-steps", "2000", "--watchdog-s", "2.5"]})
    # sync-replay: each rank warm from its 188th rollout (1504 of its 1500 stored) to its
    # 200th, an update a rollout
    assert runs["sync-replay"]["updates"] == 13
    assert runs["apex"]["updates"] > 0 and runs["apex"]["env_steps"] >= 2000


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_nan_skip_drops_that_update_everywhere_and_goes_on(tmp_path, mode):
    extra = ["--topology", "star", "--mode", "async"] if mode == "async" else []
    result, _ = run(tmp_path, 3, "--fail", "2@4:nan", "--nan-policy", "skip",
                    "--checksum-every", "2", *extra, check=True)
    assert "rank 2: non-finite loss or gradient at update 4; skipped" in result.output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    # sync: the NaN reached every rank, all skipped that step together (the checksum every
    # 2 updates proves the replicas stayed identical); async: the worker did not push it
    assert summary["updates_skipped"] == 1
    assert summary["gradients_sent"] == summary["gradients_applied"] + \
        summary["gradients_dropped"]
