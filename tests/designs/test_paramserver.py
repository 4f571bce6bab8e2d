"""The parameter-server designs (async, quorum) under mpiexec: every gradient applied or
dropped, staleness, a straggler against the quorum, the book's tricks."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import TRICKS, train, train_many

#: the tests' runs, by name (quorum's by its rank count and --late)
ASYNC = ["--mode", "async", "--topology", "star", "--total-steps", "1500"]


def quorum(nranks: int, late: str) -> list[str]:
    return ["--mode", "quorum", "--topology", "star", "--quorum", "1", "--late", late,
            "--straggler", f"{nranks - 1}:3", "--total-steps", "3000"]


#: the runs at 3 ranks, in one launch (fixture ``three``)
THREE = {"async": ASYNC, "quorum-drop": quorum(3, "drop"),
         "tricks": [*TRICKS, "--mode", "async", "--topology", "star"]}


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """THREE in one 3-rank launch (one after another: a launch costs a torch import per
    rank); their directory and each one's summary."""
    where = tmp_path_factory.mktemp("three")
    return where, train_many(where, 3, THREE, timeout_s=600)


def run(request, tmp_path, nranks: int, name: str, args: list[str]):
    """The run ``name`` of THREE at 3 ranks (from the shared launch), else ``args`` run
    alone at ``nranks``: its directory and summary."""
    if nranks == 3:
        where, summaries = request.getfixturevalue("three")
        assert THREE[name] == args
        return where / name, summaries[name]
    _, s = train(tmp_path, nranks, *args)
    return tmp_path / "r", s


@pytest.mark.parametrize("nranks", [2, 3])
def test_async_applies_or_drops_every_gradient(request, tmp_path, nranks):
    run_dir, s = run(request, tmp_path, nranks, "async", ASYNC)
    assert s["gradients_sent"] == s["gradients_applied"] + s["gradients_dropped"]
    assert s["gradients_applied"] == s["updates"] > 0
    assert s["env_steps"] >= 1500
    # one worker can never be stale; more workers interleave, so some gradients are
    assert (s["mean_staleness"] == 0) if nranks == 2 else (s["mean_staleness"] > 0)
    staleness = np.load(run_dir / "staleness.npy")
    assert len(staleness) == s["gradients_applied"] and staleness.min() >= 0
    assert staleness.mean() == pytest.approx(s["mean_staleness"])


@pytest.mark.parametrize("nranks, late", [(3, "drop"), (4, "apply")])
def test_quorum_accounting_with_a_straggler(request, tmp_path, nranks, late):
    _, s = run(request, tmp_path, nranks, f"quorum-{late}", quorum(nranks, late))
    assert s["gradients_sent"] == s["gradients_applied"] + s["gradients_dropped"]
    assert s["updates"] > 0
    if late == "apply":
        assert s["gradients_dropped"] <= nranks - 1      # only the pushes after the budget
    else:   # with a quorum of 1 and a 3x straggler, the straggler is late and dropped
        assert s["gradients_dropped"] > nranks - 1


def test_the_books_five_tricks_and_ppo_run_in_async(three):
    s = three[1]["tricks"]
    assert s["gradients_sent"] == s["gradients_applied"] + s["gradients_dropped"]
