"""Each actor-learner design learns CartPole-v1 with its documented defaults
(experiments/cartpole_<mode>.yaml): a mean return of at least 400 over every actor's
last 20 episodes (impala and ga3c at 3 ranks, seed at 4), within the file's budget
(500,000 env steps; seed's 1,000,000, its runs' spread being the widest); the
value-based designs (apex, gorila) at 4 ranks, judged on their greediest actor (the
others explore by design), within 300,000 (gorila's 400,000).

In the asynchronous designs the learner stops the run on the windows the actors last
reported; the actors' in-flight unrolls then finish a few more episodes, so the
windows the summary's final mean is taken over end a little after the stop.  That
final mean sits at the threshold the stop crossed, give or take those episodes:
impala at 3 ranks, 16 runs, 399.5-424.4, one under 400.  So the target (the learner's
judgement) is asserted as reached, and the final mean as holding within 10% of it
(no collapse after the stop)."""

from __future__ import annotations

import json

import h5py
import pytest
import yaml

from mpirun import ROOT, run_mpi


#: one rank count each (the accounting tests run several): impala and ga3c at 3, the
#: fewest that hold every role; seed at 4 (its spread is widest with fewer actors)
@pytest.mark.parametrize("mode, nranks", [("impala", 3), ("seed", 4), ("ga3c", 3)])
def test_learns_cartpole(tmp_path, mode, nranks):
    config = ROOT / "experiments" / f"cartpole_{mode}.yaml"
    settings = yaml.safe_load(config.read_text())
    budget, target = settings["total_steps"], settings["target_return"]
    result = run_mpi(nranks, ["-m", "mpirl.run", "--config", str(config), "--log-every",
                              "1000", "--run-dir", str(tmp_path), "--run-name", "r"],
                     timeout_s=400)
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["reached_target"], result.tail()
    assert s["final_mean_return"] >= 0.9 * target, result.tail()
    assert s["env_steps"] <= budget


@pytest.mark.parametrize("mode", ["apex", "gorila"])
def test_value_based_designs_learn_cartpole(tmp_path, mode):
    config = ROOT / "experiments" / f"cartpole_{mode}.yaml"
    budget = yaml.safe_load(config.read_text())["total_steps"]
    result = run_mpi(4, ["-m", "mpirl.run", "--config", str(config), "--log-every", "1000",
                         "--run-dir", str(tmp_path), "--run-name", "r"], timeout_s=400)
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["reached_target"], result.tail()
    assert s["env_steps"] <= budget
    # the greediest actor (the last rank) is the one judged: its last 20 episodes
    with h5py.File(tmp_path / "r" / "rank0003.h5", "r") as f:
        returns = f["episodes"]["return"][-20:]
    assert returns.mean() >= 400, returns
