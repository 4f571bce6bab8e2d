"""Reproducible asynchronous runs under mpiexec: a run replayed with its recorded order
of events ends with the recorded parameter SHA-256 (async, quorum, impala, gorila with 2
shards at 4 ranks, with a straggler so that the order is not the trivial one); a replay of another
configuration, rank count or design is refused at start."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import SMALL
from mpirun import run_mpi

RUNS = {"async": ["--mode", "async", "--topology", "star"],
        "quorum": ["--mode", "quorum", "--topology", "star"],
        "impala": ["--mode", "impala"],
        "gorila": ["--mode", "gorila", "--servers", "2", "--learning-starts", "64",
                   "--replay-batch", "32", "--straggler", "3:2"]}


def _run(tmp_path, nranks, name, *args, check=True):
    return run_mpi(nranks, ["-m", "mpirl.run", *SMALL, "--total-steps", "6000",
                            "--straggler", "1:2", *args, "--run-dir",
                            str(tmp_path), "--run-name", name], timeout_s=180, check=check)


def _summary(tmp_path, name):
    return json.loads((tmp_path / name / "summary.json").read_text())


@pytest.mark.parametrize("mode", list(RUNS))
def test_a_replayed_run_ends_bit_identical(tmp_path, mode):
    _run(tmp_path, 4, "rec", *RUNS[mode])
    _run(tmp_path, 4, "rep", *RUNS[mode], "--replay-schedule", str(tmp_path / "rec"))
    rec, rep = _summary(tmp_path, "rec"), _summary(tmp_path, "rep")
    assert rep["param_digest"] == rec["param_digest"]
    for key in ("updates", "env_steps", "gradients_applied", "unrolls_used",
                "mean_staleness", "mean_policy_lag"):
        assert rep[key] == rec[key] or (rep[key] != rep[key] and rec[key] != rec[key]), key
    recorded = np.load(tmp_path / "rec" / "schedule" / "rank0000.npy")
    replayed = np.load(tmp_path / "rep" / "schedule" / "rank0000.npy")
    assert recorded.shape[1] == 2 and len(recorded) >= rec["updates"]
    assert np.array_equal(recorded, replayed)
    if mode == "gorila":        # every shard's order, and the shards' final parameters
        assert np.array_equal(np.load(tmp_path / "rec" / "schedule" / "rank0001.npy"),
                              np.load(tmp_path / "rep" / "schedule" / "rank0001.npy"))
        return                  # (its 2 workers are numbered 1, 2 within each shard)
    # a straggler at 2x: its pushes/unrolls arrive at half the others' rate, so the
    # recorded order is not a round robin
    who = recorded[recorded[:, 0] >= 0, 0]
    assert (who == 1).sum() < (who == 3).sum()


def test_a_tampered_schedule_is_caught(tmp_path):
    _run(tmp_path, 4, "rec", *RUNS["async"])
    path = tmp_path / "rec" / "schedule" / "rank0000.npy"
    events = np.load(path)
    # move the straggler's first push later: the versions its later pushes were
    # computed on no longer match the recording
    k = int(np.flatnonzero(events[:, 0] == 1)[0])
    events[[k, k + 1]] = events[[k + 1, k]]
    np.save(path, events)
    result = _run(tmp_path, 4, "rep", *RUNS["async"], "--replay-schedule",
                  str(tmp_path / "rec"), check=False)
    assert result.returncode != 0
    assert "ScheduleDiverged" in result.output and "recorded" in result.output, result.tail()


@pytest.mark.parametrize("nranks, args, fragment", [
    (4, ["--lr", "0.002"], "is a run of another configuration: lr=0.002 vs 0.001"),
    (3, [], "was recorded with 4 ranks; launch this one with mpirun -np 4, not 3"),
])
def test_a_replay_of_another_run_is_refused(tmp_path, nranks, args, fragment):
    _run(tmp_path, 4, "rec", *RUNS["async"])
    result = _run(tmp_path, nranks, "rep", *RUNS["async"], *args, "--replay-schedule",
                  str(tmp_path / "rec"), check=False)
    assert result.returncode == 2, result.tail()
    assert result.output.count("mpirl.run: error:") == 1 and fragment in result.output, \
        result.tail()
    assert not (tmp_path / "rep").exists()


def test_replay_is_refused_for_a_design_that_records_none(tmp_path):
    result = run_mpi(3, ["-m", "mpirl.run", "--mode", "apex", "--replay-schedule",
                         str(tmp_path), "--run-dir", str(tmp_path)], timeout_s=60, check=False)
    assert result.returncode == 2
    assert "replay_schedule with mode='apex'; allowed modes: async, quorum, impala, gorila" in \
        result.output
