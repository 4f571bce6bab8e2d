"""impala under mpiexec: every unroll used or dropped, the policy-lag bound, several
learners averaging by a topology, the refresh policies, a killed actor, and the log."""

from __future__ import annotations


import h5py
import numpy as np
import pytest

from conftest import kill_an_actor, train, train_many


@pytest.mark.parametrize("nranks", [2, 5])
def test_every_unroll_is_used_or_dropped_with_a_straggler(tmp_path, nranks):
    _, s = train(tmp_path, nranks, "--mode", "impala", "--total-steps", "1200",
                 "--straggler", f"{nranks - 1}:3")
    actors = nranks - 1
    assert s["unrolls_sent"] == s["unrolls_used"] + s["unrolls_dropped"]
    # at the end each actor's last unroll is in flight: taken, answered STOP, dropped
    assert s["unrolls_dropped"] >= actors
    assert s["env_steps"] >= 1200 and s["updates"] > 0
    assert s["unrolls_used"] == s["updates"] * actors           # batch: one per actor
    lag = np.load(tmp_path / "r" / "policy_lag.npy")
    assert len(lag) == s["unrolls_used"] and lag.min() >= 0
    assert lag.mean() == pytest.approx(s["mean_policy_lag"])
    assert s["bytes_per_env_step"] > 0
    with h5py.File(tmp_path / "r" / "rank0000.h5", "r") as f:
        assert f.attrs["role"] == "learner"
        u = f["updates"][:]
        assert list(u["update"]) == list(range(1, s["updates"] + 1))
        assert np.isfinite(u["policy_loss"]).all() and (u["policy_lag_max"] >= 0).all()
        assert (u["data_wait_s"] >= 0).all() and u["backward_s"].sum() > 0
    with h5py.File(tmp_path / "r" / f"rank{nranks - 1:04d}.h5", "r") as f:
        assert f.attrs["role"] == "actor"
        u = f["updates"][:]
        assert u["straggle_s"].sum() > u["env_s"].sum()            # the 3x straggler
        assert (u["param_version"] >= 0).all() and u["send_s"].sum() > 0


def test_the_lag_bound_drops_a_stragglers_old_unrolls(tmp_path):
    _, s = train(tmp_path, 4, "--mode", "impala", "--total-steps", "4000",
                 "--straggler", "3:6", "--max-policy-lag", "1", "--unroll-batch", "1")
    assert s["unrolls_sent"] == s["unrolls_used"] + s["unrolls_dropped"]
    assert s["unrolls_dropped"] > 3                 # more than the three last ones
    assert np.load(tmp_path / "r" / "policy_lag.npy").max() <= 1


@pytest.mark.parametrize("nranks, learners, topology", [(4, 2, "ring"), (5, 2, "butterfly"),
                                                        (6, 3, "tree")])
def test_several_learners_average_with_the_topology_and_stay_identical(
        tmp_path, nranks, learners, topology):
    _, s = train(tmp_path, nranks, "--mode", "impala", "--learners", str(learners),
                 "--topology", topology, "--total-steps", "1500")
    assert s["unrolls_sent"] == s["unrolls_used"] + s["unrolls_dropped"]
    assert s["env_steps"] >= 1500
    # (the learners compare their parameters' SHA-256 at the end: a difference fails the run)
    for r in range(learners):
        with h5py.File(tmp_path / "r" / f"rank{r:04d}.h5", "r") as f:
            u = f["updates"][:]
            assert len(u) == s["updates"] and u["exchange_s"].sum() > 0
            assert u["bytes_sent"].sum() > u["env_steps"].sum()


def test_refresh_policies_send_fewer_parameters(tmp_path):
    run = ["--mode", "impala", "--total-steps", "3000"]
    runs = train_many(tmp_path, 3, {
        "every": run, "updates": [*run, "--param-refresh", "updates", "--refresh-every", "4"],
        "episode": [*run, "--param-refresh", "episode"]})
    every = runs["every"]
    for refresh in ("updates", "episode"):
        fewer = runs[refresh]
        assert fewer["bytes_per_env_step"] < every["bytes_per_env_step"], refresh
        assert fewer["mean_policy_lag"] > every["mean_policy_lag"], refresh


def test_a_killed_actor_ends_the_job_naming_it(tmp_path):
    kill_an_actor(tmp_path, "impala", 3)
