"""seed and ga3c under mpiexec: every request answered or dropped, every action
received, every unroll used or dropped; the two batching policies; the roles' logs; a
killed actor."""

from __future__ import annotations


import h5py
import numpy as np
import pytest

from conftest import kill_an_actor, train


def check_accounts(s: dict, actors: int) -> None:
    assert s["requests_sent"] == s["requests_answered"] + s["requests_dropped"]
    assert s["actions_received"] == s["requests_answered"] > 0
    # at the end every actor has one request in flight: answered with STOP
    assert s["requests_dropped"] == actors
    assert s["unrolls_sent"] == s["unrolls_used"] + s["unrolls_dropped"]


@pytest.mark.parametrize("mode, nranks", [("seed", 2), ("seed", 5), ("ga3c", 3), ("ga3c", 4)])
def test_every_request_and_unroll_is_accounted_for_with_a_straggler(tmp_path, mode, nranks):
    _, s = train(tmp_path, nranks, "--mode", mode, "--total-steps", "1200",
                 "--straggler", f"{nranks - 1}:3")
    servers = 1 if mode == "seed" else 2
    check_accounts(s, nranks - servers)
    assert s["env_steps"] >= 1200 and s["updates"] > 0
    # every env step is one answered request's envs (2 each, SMALL)
    assert s["env_steps"] == 2 * s["requests_answered"]
    lag = np.load(tmp_path / "r" / "policy_lag.npy")
    assert len(lag) == s["unrolls_used"] and lag.min() >= 0
    roles = []
    for r in range(nranks):
        with h5py.File(tmp_path / "r" / f"rank{r:04d}.h5", "r") as f:
            roles.append(f.attrs["role"])
            u = f["updates"][:]
            if f.attrs["role"] == "actor":
                assert u["infer_wait_s"].sum() > 0 and u["forward_s"].sum() == 0
                assert (u["rtt_s"] > 0).all()
            else:
                assert u["forward_s"].sum() > 0 or f.attrs["role"] == "learner"
    assert roles == (["learner"] if mode == "seed" else ["learner", "predictor"]) \
        + ["actor"] * (nranks - servers)
    with h5py.File(tmp_path / "r" / f"rank{servers - 1:04d}.h5", "r") as f:
        u = f["updates"][:]
        assert u["batch_wait_s"].sum() > 0 and np.nanmax(u["batch_size"]) <= 2 * (nranks - servers)


def test_fixed_batches_are_exactly_the_size_asked(tmp_path):
    """4 actors x 2 envs, batches of 6 observations: 3 whole actors every time."""
    _, s = train(tmp_path, 5, "--mode", "seed", "--inference-policy", "fixed",
                 "--inference-batch", "6", "--total-steps", "1500")
    check_accounts(s, 4)
    assert s["mean_inference_batch"] == 6.0


def test_drain_batches_take_what_arrived(tmp_path):
    _, s = train(tmp_path, 5, "--mode", "seed", "--inference-policy", "drain",
                 "--inference-wait-s", "0.0005", "--total-steps", "1500")
    check_accounts(s, 4)
    assert 2.0 <= s["mean_inference_batch"] <= 8.0


@pytest.mark.parametrize("mode", ["seed", "ga3c"])
def test_a_killed_actor_ends_the_job_naming_it(tmp_path, mode):
    kill_an_actor(tmp_path, mode, 4)
