"""The sync design under mpiexec: every gradient applied on every rank, replicas identical
(checksums), byte-identical across topologies at 2 ranks, the book's tricks, continuous
actions."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

import topologies
from conftest import TRICKS, train, train_many


#: the tests' runs at 2 ranks, in one launch (fixture ``two``): every topology (for the
#: byte-identical check), the gradient accounting and continuous actions
APPLIED = ["--total-steps", "2048", "--checksum-every", "2"]
TOPOLOGIES = {f"{topo}-{i}": ["--topology", topo, "--total-steps", "1024"]
              for i, topo in enumerate(topologies.names())}
TWO = {**TOPOLOGIES, "applied": APPLIED,
       "pendulum": ["--env", "Pendulum-v1", "--total-steps", "1024", "--checksum-every", "4"]}


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> dict[str, dict]:
    """TWO in one 2-rank launch (one after another in the same processes: a launch costs a
    torch import per rank); each run's summary."""
    return train_many(tmp_path_factory.mktemp("two"), 2, TWO, timeout_s=600)


@pytest.mark.parametrize("nranks", [2, 4])
def test_sync_gradients_all_applied(request, tmp_path, nranks):
    if nranks == 2:
        s = request.getfixturevalue("two")["applied"]
    else:
        _, s = train(tmp_path, nranks, *APPLIED)
    assert s["gradients_sent"] == s["gradients_applied"] == s["updates"] * nranks
    assert s["gradients_dropped"] == 0


def test_sync_is_reproducible_and_topology_independent_at_two_ranks(tmp_path, two):
    """At 2 ranks every topology computes the same a + b, so all of them must end
    byte-identical (run-to-run reproducibility of one topology:
    tests/resilience/test_resume.py compares two runs' final parameters).  The runs share
    one launch, so this also checks that a run leaves nothing behind that changes the
    next."""
    digests = {name: two[name]["param_digest"] for name in TOPOLOGIES}
    # the small-message path off (each exchange the topology's blocking calls): the same
    _, s = train(tmp_path, 2, "--topology", "butterfly", "--total-steps", "1024",
                 name="butterfly-blocking", env={"MPIRL_SMALL_PATH_BYTES": "0"})
    digests["butterfly-blocking"] = s["param_digest"]
    assert len(set(digests.values())) == 1, digests


def test_the_books_five_tricks_and_ppo_run_in_sync(tmp_path):
    _, s = train(tmp_path, 3, *TRICKS, name="sync")
    assert s["updates"] == 3 * s["env_steps"] // (3 * 2 * 8 * 3)
    # the clipped objective logs its approximate KL, one row per update repeat; it is
    # zero on a batch's first repeat (the policy that collected it) and not after
    with h5py.File(tmp_path / "sync" / "rank0001.h5", "r") as f:
        u = f["updates"][...]
    assert len(u) == s["updates"] and np.isfinite(u["approx_kl"]).all()
    first = u["env_steps"] > 0
    assert np.allclose(u["approx_kl"][first], 0.0, atol=1e-6)
    assert (u["approx_kl"][~first] > 0).all()


def test_continuous_action_space_trains(two):
    s = two["pendulum"]
    assert s["updates"] == 1024 // (2 * 2 * 8) and s["gradients_dropped"] == 0
