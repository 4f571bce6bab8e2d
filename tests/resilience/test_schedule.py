"""Reproducible asynchronous runs under mpiexec: a run replayed with its recorded order
of events ends with the recorded parameter SHA-256 (async, impala, ga3c at 4 ranks,
gorila (DQN) with 2 shards and a replay rank at 5, apex with 2 replay ranks and gorila
with 2 local shards learning SAC on Pendulum, with a straggler so that the order is not
the trivial one); a replay of another configuration, rank count or design is refused at
start.  For the suite's time, ``experiments/check_digests.py`` alone replays quorum (the
server loop async's replay runs, with its quorum rule), seed (the inference server
ga3c's predictor runs), and apex and local gorila with DQN on CartPole (their learners
and designs are each replayed here in another pairing)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import SMALL, assert_rows_tile_time, train_many
from mpirun import run_mpi

RUNS = {"async": ["--mode", "async", "--topology", "star"],
        "impala": ["--mode", "impala"],
        "ga3c": ["--mode", "ga3c", "--straggler", "3:2"],
        "gorila-service": ["--mode", "gorila", "--gorila-replay", "service", "--servers", "2",
                           "--learning-starts", "64", "--replay-batch", "32",
                           "--straggler", "4:2"],
        # SAC, the replay designs' learner for Box actions
        "apex-sac": ["--mode", "apex", "--env", "Pendulum-v1", "--replay-ranks", "2",
                     "--learning-starts", "64", "--replay-batch", "32", "--straggler", "4:2"],
        "gorila-sac": ["--mode", "gorila", "--env", "Pendulum-v1", "--servers", "2",
                       "--learning-starts", "64", "--replay-batch", "32",
                       "--straggler", "3:2"]}
#: ranks per run (4 unless named) and the deciding ranks' schedule files (1 unless named)
RANKS = {"gorila-service": 5, "apex-sac": 5}
FILES = {"gorila-service": 5, "apex-sac": 3, "gorila-sac": 2}
#: the modes whose rank 0 takes every actor's messages (the straggler's order is seen)
ROUND_ROBIN_BROKEN = ("async", "impala")


#: every run's settings (after SMALL)
COMMON = ["--total-steps", "2000", "--straggler", "1:2"]


def _run(tmp_path, nranks, name, *args, check=True):
    return run_mpi(nranks, ["-m", "mpirl.run", *SMALL, *COMMON, *args, "--run-dir",
                            str(tmp_path), "--run-name", name], timeout_s=180, check=check)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """Every design of RUNS recorded (``MODE/rec``) and replayed (``MODE/rep``), one
    launch per rank count (each run after the one before, in the same processes: a launch
    costs a torch import per rank); the directory holding them."""
    where = tmp_path_factory.mktemp("replayed")
    by_ranks: dict[int, dict[str, list[str]]] = {}
    for mode, args in RUNS.items():
        by_ranks.setdefault(RANKS.get(mode, 4), {}).update({
            f"{mode}-rec": [*COMMON, *args],
            f"{mode}-rep": [*COMMON, *args, "--replay-schedule", str(where / f"{mode}-rec")]})
    for nranks, runs in by_ranks.items():
        train_many(where, nranks, runs, timeout_s=600)
    for mode in RUNS:          # each design's pair in a directory of its own: MODE/rec, rep
        (where / mode).mkdir()
        for run in ("rec", "rep"):
            (where / f"{mode}-{run}").rename(where / mode / run)
    return where


@pytest.fixture(scope="module")
def async_run(replayed):
    """The recorded async run at 4 ranks, for the tests that only read it (or a copy of
    it)."""
    return replayed / "async" / "rec"


def _summary(tmp_path, name):
    return json.loads((tmp_path / name / "summary.json").read_text())


@pytest.mark.parametrize("mode", list(RUNS))
def test_a_replayed_run_ends_bit_identical(replayed, mode):
    tmp_path = replayed / mode
    rec, rep = _summary(tmp_path, "rec"), _summary(tmp_path, "rep")
    assert rep["param_digest"] == rec["param_digest"]
    for run in ("rec", "rep"):       # each design's rows hold only their own time
        assert_rows_tile_time(tmp_path / run)
    # the figures of the design's own ledgers (summary.json has no other design's)
    for key in ("updates", "env_steps", "gradients_applied", "unrolls_used",
                "mean_staleness", "mean_policy_lag", "transitions_sampled",
                "requests_answered"):
        assert (key in rep) == (key in rec) and rep.get(key) == rec.get(key), key
    # every deciding rank's order (gorila: each shard; ga3c: the predictor, rank 1;
    # apex: the learner and each replay rank; gorila over a replay rank: the shards, the
    # replay rank and each worker), recorded again by the replay
    files = sorted(p.name for p in (tmp_path / "rec" / "schedule").glob("rank*.npy"))
    assert files == sorted(p.name for p in (tmp_path / "rep" / "schedule").glob("rank*.npy"))
    assert len(files) == FILES.get(mode, 1)
    for name in files:
        recorded = np.load(tmp_path / "rec" / "schedule" / name)
        assert recorded.shape[1] == 2 and len(recorded) >= 10
        assert np.array_equal(recorded, np.load(tmp_path / "rep" / "schedule" / name)), name
    if mode in ROUND_ROBIN_BROKEN:
        # a straggler at 2x: its pushes/unrolls/requests arrive at half the others' rate,
        # so the recorded order is not a round robin
        recorded = np.load(tmp_path / "rec" / "schedule" / "rank0000.npy")
        who = recorded[recorded[:, 0] >= 0, 0]
        assert (who == 1).sum() < (who == 3).sum()


def test_a_tampered_schedule_is_caught(tmp_path, async_run):
    shutil.copytree(async_run, tmp_path / "rec")
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
def test_a_replay_of_another_run_is_refused(tmp_path, nranks, args, fragment, async_run):
    result = _run(tmp_path, nranks, "rep", *RUNS["async"], *args, "--replay-schedule",
                  str(async_run), check=False)
    assert result.returncode == 2, result.tail()
    assert result.output.count("mpirl.run: error:") == 1 and fragment in result.output, \
        result.tail()
    assert not (tmp_path / "rep").exists()


def test_replay_is_refused_for_a_design_that_records_none(tmp_path):
    # sync is deterministic by itself: it records nothing, there is nothing to replay
    result = run_mpi(3, ["-m", "mpirl.run", "--mode", "sync", "--replay-schedule",
                         str(tmp_path), "--run-dir", str(tmp_path)], timeout_s=60, check=False)
    assert result.returncode == 2
    assert ("replay_schedule with mode='sync' (a synchronous run is deterministic: nothing "
            "to replay); allowed modes: async, quorum, impala, seed, ga3c, apex, gorila"
            ) in result.output
