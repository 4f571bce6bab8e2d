"""SAC in the replay designs under mpiexec: gorila learns Pendulum (one server, one
worker: one update per env step, a deterministic order); sync-replay keeps its replicas
identical with SAC and with DQN at 3 ranks; apex runs it over replay ranks
(two actors) with every transition accounted for."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from conftest import train, train_many

SAC = ["--env", "Pendulum-v1", "--num-envs", "1", "--rollout-steps", "1", "--hidden", "64",
       "64", "--activation", "relu", "--lr", "0.001", "--max-grad-norm", "0", "--n-step",
       "1", "--replay-batch", "128", "--learning-starts", "500", "--replay-capacity",
       "50000", "--seed", "1"]


def test_gorila_learns_pendulum_with_sac(tmp_path):
    _, s = train(tmp_path, 2, "--mode", "gorila", *SAC, "--total-steps", "4000",
                 "--update-repeat", "1",   # one push per rollout: not gorila's default 2
                 "--checkpoint-every", "0", timeout_s=400)
    assert s["gradients_sent"] == s["gradients_applied"] == 4000 - 500 + 1
    with h5py.File(tmp_path / "r" / "rank0001.h5", "r") as f:
        returns = f["episodes"]["return"][...]
    # 20 episodes of 200 steps; random play scores about -1200 and does not improve
    assert len(returns) == 20
    assert returns[-5:].mean() > -700 and returns[-5:].mean() > returns[:5].mean() + 300


def test_apex_runs_sac_over_replay_ranks(tmp_path):
    _, s = train(tmp_path, 4, "--mode", "apex", *SAC, "--replay-ranks", "1",
                 "--rollout-steps", "16", "--total-steps", "3000", "--actor-refresh-steps",
                 "32")
    assert s["transitions_sent"] == s["transitions_inserted"] == s["env_steps"] >= 3000
    # every batch trained on, and at most the one prefetched batch left at the end
    assert s["updates"] > 0
    assert s["transitions_sampled"] in (128 * s["updates"], 128 * (s["updates"] + 1))
    with h5py.File(tmp_path / "r" / "rank0000.h5", "r") as f:
        rows = f["updates"][...]
    # the learner logs SAC's losses: critic (value), actor (policy) and the entropy
    assert np.isfinite(rows["value_loss"]).all() and np.isfinite(rows["policy_loss"]).all()
    assert np.isfinite(rows["entropy"]).all()


def sync_replay(env: str, extra: list[str]) -> list[str]:
    """3 ranks, each its own replay, learning SAC (Pendulum) or DQN (CartPole)."""
    args = [a if a != "Pendulum-v1" else env for a in SAC]
    return ["--mode", "sync-replay", *args, *extra, "--total-steps", "1500",
            "--learning-starts", "600", "--update-repeat", "2", "--checksum-every", "10"]


#: the runs at 3 ranks, by the sync-replay test's case, in one launch (fixture ``three``)
THREE = {"sac": sync_replay("Pendulum-v1", []), "dqn": sync_replay("CartPole-v1", ["--dueling"]),
         # rank 1's gradient of update 20 made NaN: every rank skips that step
         "skip": sync_replay("Pendulum-v1", ["--fail", "1@20:nan", "--nan-policy", "skip"])}


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """THREE in one 3-rank launch (one after another: a launch costs a torch import per
    rank); their directory and each one's summary."""
    where = tmp_path_factory.mktemp("three")
    return where, train_many(where, 3, THREE, timeout_s=600)


@pytest.mark.parametrize("learner", ["sac", "dqn"])
def test_sync_replay_keeps_replicas_identical_with_their_own_replays(three, learner):
    # 3 ranks, each its own replay: the averaged gradients and targets keep the replicas
    # byte-identical (checked every 10 updates), every transition stays where it was made
    where, summaries = three
    s = summaries[learner]
    assert s["env_steps"] == 1500 and s["transitions_inserted"] == 1500
    # warm once each replay holds 600 / 3: from the 200th rollout on, 2 updates each
    assert s["updates"] == 2 * (500 - 200 + 1)
    assert s["gradients_sent"] == s["gradients_applied"] == 3 * s["updates"]
    assert s["transitions_sampled"] == 3 * 128 * s["updates"]
    # every rank's log: one row per update (and per warm-up rollout), the inserts summed
    inserted = 0
    for rank in range(3):
        with h5py.File(where / learner / f"rank{rank:04d}.h5", "r") as f:
            rows = f["updates"][...]
        inserted += int(rows["inserted"].sum())
        assert np.isfinite(rows["value_loss"][rows["sampled"] > 0]).all()
    assert inserted == s["transitions_inserted"]


def test_sync_replay_skips_a_nan_update_on_every_rank(three):
    """--fail 1@20:nan --nan-policy skip: the NaN travels in the average, every rank skips
    that step, its target update and its batch's priorities; the replicas stay identical
    (checked every 10 updates), and the run differs from the plain one."""
    where, summaries = three
    s, plain = summaries["skip"], summaries["sac"]
    assert s["updates_skipped"] == 1 and s["updates"] == plain["updates"]
    assert s["priority_updates"] == plain["priority_updates"] - 3 * 128
    assert s["param_digest"] != plain["param_digest"]
    with h5py.File(where / "skip" / "rank0000.h5", "r") as f:
        rows = f["updates"][...]
    assert rows["prio_updates"][rows["update"] == 20].tolist() == [0]


def test_sync_replay_counts_transitions_not_repeated_env_steps(tmp_path):
    # --action-repeat 3: each transition is 3 env steps; the replays hold transitions
    _, s = train(tmp_path, 2, "--mode", "sync-replay", *SAC, "--action-repeat", "3",
                 "--total-steps", "1200", "--learning-starts", "300", "--checksum-every", "5",
                 "--update-repeat", "1")
    assert s["env_steps"] == 1200 and s["transitions_inserted"] == 400
    assert s["updates"] == 200 - 150 + 1          # warm from the 150th rollout of 2 ranks
    with h5py.File(tmp_path / "r" / "rank0001.h5", "r") as f:
        rows = f["updates"][...]
    assert rows["inserted"].sum() == 200 and rows["env_steps"].sum() == 600
