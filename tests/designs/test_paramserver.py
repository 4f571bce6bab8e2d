"""The parameter-server designs (async, quorum) under mpiexec: every gradient applied or
dropped, staleness, a straggler against the quorum, the book's tricks."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import TRICKS, train


@pytest.mark.parametrize("nranks", [2, 3])
def test_async_applies_or_drops_every_gradient(tmp_path, nranks):
    _, s = train(tmp_path, nranks, "--mode", "async", "--topology", "star",
                 "--total-steps", "1500")
    assert s["gradients_sent"] == s["gradients_applied"] + s["gradients_dropped"]
    assert s["gradients_applied"] == s["updates"] > 0
    assert s["env_steps"] >= 1500
    # one worker can never be stale; more workers interleave, so some gradients are
    assert (s["mean_staleness"] == 0) if nranks == 2 else (s["mean_staleness"] > 0)
    staleness = np.load(tmp_path / "r" / "staleness.npy")
    assert len(staleness) == s["gradients_applied"] and staleness.min() >= 0
    assert staleness.mean() == pytest.approx(s["mean_staleness"])


@pytest.mark.parametrize("nranks, late", [(3, "drop"), (4, "apply")])
def test_quorum_accounting_with_a_straggler(tmp_path, nranks, late):
    _, s = train(tmp_path, nranks, "--mode", "quorum", "--topology", "star", "--quorum", "1",
                 "--late", late, "--straggler", f"{nranks - 1}:3", "--total-steps", "3000")
    assert s["gradients_sent"] == s["gradients_applied"] + s["gradients_dropped"]
    assert s["updates"] > 0
    if late == "apply":
        assert s["gradients_dropped"] <= nranks - 1      # only the pushes after the budget
    else:   # with a quorum of 1 and a 3x straggler, the straggler is late and dropped
        assert s["gradients_dropped"] > nranks - 1


def test_the_books_five_tricks_and_ppo_run_in_async(tmp_path):
    _, s = train(tmp_path, 3, *TRICKS, "--mode", "async", "--topology", "star", name="async")
    assert s["gradients_sent"] == s["gradients_applied"] + s["gradients_dropped"]
