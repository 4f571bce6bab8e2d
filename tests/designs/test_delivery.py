"""--param-delivery broadcast (mpirl.kit.delivery): parameters to impala's and apex's
actors by one broadcast through the topology, under a real mpiexec; in the check script,
in impala runs against the per-actor push, in apex past its replay ranks, and the
refusals."""

from __future__ import annotations

import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import train_many
from mpirun import ROOT, run_mpi


@pytest.mark.parametrize("nranks", [2, 3, 5])
def test_every_actor_takes_each_broadcast_bit_exact(nranks):
    result = run_mpi(nranks, ["tests/mpi/check_delivery.py"], timeout_s=180, check=False)
    lines = result.output.splitlines()
    for spec in ("ring", "tree", "native", "star", "hierarchical:ring:2"):
        assert (f"OK {spec}: every actor takes versions in order, bit-exact, and ends with "
                "the last one") in lines, result.tail()
    assert "OK no STOP from the publisher: the subscriber's close is deadline-bound" in lines
    assert result.returncode == 0, result.tail()


def learner_bytes(run_dir) -> int:
    with h5py.File(run_dir / "rank0000.h5", "r") as f:
        return int(f["updates"]["bytes_sent"].sum())


#: the training runs of the tests below, all at 5 ranks
IMPALA = ["--mode", "impala", "--total-steps", "2500", "--topology", "ring"]
RUNS = {
    # one learner, 4 actors, a refresh every update, pushed and broadcast
    "push": IMPALA, "cast": [*IMPALA, "--param-delivery", "broadcast"],
    # learners 0 and 1 (actors 2, 4 and 3), a tree every 2 updates
    "two": ["--mode", "impala", "--learners", "2", "--topology", "tree",
            "--param-delivery", "broadcast", "--param-refresh", "updates",
            "--refresh-every", "2", "--total-steps", "4000"],
    # learner 0, replay 1, actors 2-4; a tree every 3 learner updates
    "apex": ["--mode", "apex", "--param-delivery", "broadcast", "--topology", "tree",
             "--refresh-every", "3", "--total-steps", "4000"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """RUNS in one 5-rank launch (one after another: a launch costs a torch import per
    rank); (their directory, each one's summary)."""
    where = tmp_path_factory.mktemp("delivery")
    return where, train_many(where, 5, RUNS, timeout_s=600)


def test_a_broadcast_leaves_the_learner_once_not_once_per_actor(runs):
    """5 ranks, one learner, 4 actors, a parameter refresh every update: ring's chain
    sends the learner's copy once (to the next actor), the push four times."""
    tmp_path, summaries = runs
    push, cast = summaries["push"], summaries["cast"]
    assert push["broadcasts_sent"] == push["broadcasts_received"] == 0
    assert (push["reply_progress"], cast["reply_progress"]) == ("calls", "")
    assert 0 < cast["broadcasts_sent"] <= cast["updates"]
    assert cast["broadcasts_received"] == 4 * cast["broadcasts_sent"]      # the ledger's
    assert cast["unrolls_sent"] == cast["unrolls_used"] + cast["unrolls_dropped"]
    per_update = {name: learner_bytes(tmp_path / name) / s["updates"]
                  for name, s in (("push", push), ("cast", cast))}
    assert per_update["cast"] < 0.4 * per_update["push"], per_update
    for r in range(1, 5):
        with h5py.File(tmp_path / "cast" / f"rank{r:04d}.h5", "r") as f:
            versions = f["updates"]["param_version"][:]
            assert (np.diff(versions) >= 0).all() and versions[-1] > 1
            assert f["updates"]["bytes_recv"].sum() > 0          # the broadcasts' bytes


def test_two_learners_each_broadcast_to_their_actors(runs):
    """5 ranks, learners 0 and 1 (actors 2, 4 and 3), a tree every 2 updates."""
    s = runs[1]["two"]
    assert 0 < s["broadcasts_sent"] <= s["updates"]              # both learners' together
    assert s["broadcasts_received"] > s["broadcasts_sent"]


def test_apex_broadcasts_to_its_actors_past_the_replay_ranks(runs):
    """5 ranks: learner 0, replay 1, actors 2-4; a tree every 3 learner updates; the
    actors take the newest at their refresh points."""
    tmp_path, summaries = runs
    s = summaries["apex"]
    assert 0 < s["broadcasts_sent"] <= s["updates"] // 3
    assert s["reply_progress"] == ""             # no reply carries parameters: no thread
    assert s["broadcasts_received"] == 3 * s["broadcasts_sent"]
    assert s["transitions_sent"] == s["transitions_inserted"]
    with h5py.File(tmp_path / "apex" / "rank0004.h5", "r") as f:
        versions = f["updates"]["param_version"][:]
        assert (np.diff(versions) >= 0).all() and versions[-1] >= 3


@pytest.mark.parametrize("flags, fragment", [
    (["--param-delivery", "bcast"], "param_delivery='bcast'"),
    (["--param-delivery", "broadcast", "--param-refresh", "episode"],
     "param_refresh='episode' is one actor's; allowed with broadcast"),
    (["--mode", "sync", "--param-delivery", "broadcast"],
     "param_delivery='broadcast' is not taken by mode='sync'"),
    (["--param-delivery", "broadcast", "--compress", "fp16"],
     "compress='fp16' compresses a topology's allreduce, and this run has none"),
    (["--mode", "apex", "--refresh-every", "3"],
     "refresh_every=3 times apex's broadcasts, and this run pushes"),
    (["--mode", "apex", "--reply-progress", "spin"],
     "reply_progress='spin' is not allowed; choose one of: auto, thread, calls"),
    (["--mode", "apex", "--reply-progress", "calls", "--param-delivery", "broadcast"],
     "reply_progress='calls' moves the push's parameter replies, and this run broadcasts"),
    (["--mode", "apex", "--reply-progress", "thread", "--param-delivery", "broadcast"],
     "allowed with broadcast: reply_progress auto (the default)"),
    (["--reply-progress", "calls"], "reply_progress='calls' is not taken by mode='impala'"),
])
def test_delivery_refusals_are_one_line(flags, fragment):
    done = subprocess.run([sys.executable, "-m", "mpirl.run", "--mode", "impala", *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], done.stderr
