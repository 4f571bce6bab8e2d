"""The Python API: ``import mpirl`` registers mpirl's envs; ``mpirl.train`` runs a design
under mpiexec from a script; your own env (``--env MODULE:ENV_ID``) and network
(``--model MODULE:FUNCTION``) train end to end, the network's parameters in the one
flat buffer, and a wrong one is refused at start in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import mpirl
from conftest import ROOT
from mpirl.telemetry.read import load_run
from mpirun import run_mpi

EXPERIMENTS = ROOT / "experiments"


def test_import_mpirl_registers_its_envs_without_torch_or_mpi():
    code = ("import sys, gymnasium, mpirl; gymnasium.make('Delay-v0'); "
            "print(sorted(m for m in ('torch', 'mpi4py') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_custom_env_and_network_train_from_a_script(tmp_path):
    """experiments/train_custom.py as users run it: mpirl.train at 3 ranks, ring."""
    result = subprocess.run(
        [sys.executable, str(EXPERIMENTS / "train_custom.py"), "--ranks", "3",
         "--total-steps", "7680", "--runs", str(tmp_path), "--name", "corridor"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "final mean return" in result.stdout           # the run's output, streamed
    run = load_run(tmp_path / "corridor")
    assert run.config["env"] == "custom_env:Corridor-v0"
    assert run.config["model"] == "custom_env:make_net"
    assert run.meta["world_size"] == 3
    assert run.summary["env_steps"] == 7680        # 40 updates of 3 ranks x 4 envs x 16
    e = run.episodes
    # the seeded sync run is deterministic: 0.35 over the first 20 episodes, 0.93 at the end
    assert e.head(20)["return"].mean() < 0.6 < 0.85 < e.tail(20)["return"].mean()
    # the shared-trunk network (2x32+32, 32x2+2, 32+1 = 195 floats) in one flat buffer:
    # a ring allreduce sends 2 (R - 1) chunks of N / R floats from each of R ranks
    u = run.updates[run.updates["update"] > 1]
    per_update = u.groupby("update")["bytes_sent"].sum()
    assert np.median(per_update) == 2 * (3 - 1) * 195 * 4


def test_a_network_of_the_wrong_shape_is_refused_at_start():
    job = run_mpi(2, ["-m", "mpirl.run", "--env", "custom_env:Corridor-v0", "--model",
                      "custom_env:bad_shapes", "--total-steps", "100"],
                  cwd=EXPERIMENTS, check=False, timeout_s=120,
                  env={"PYTHONPATH": str(ROOT)})
    assert job.returncode == 2
    lines = [line for line in job.output.splitlines() if line.strip()]
    assert lines == ["mpirl.run: error: model='custom_env:bad_shapes': forward(obs of shape "
                     "(2, obs_dim)) must return logits of shape (2, 2) first; it returned "
                     "shape (2, 3)"]


@pytest.mark.parametrize("fields, message", [
    ({"model": "no_such_module:make"},
     "model='no_such_module:make': cannot import 'no_such_module' (No module named "
     "'no_such_module'); it must be importable where the ranks start (the working "
     "directory or PYTHONPATH)"),
    ({"model": "custom_env"}, "model='custom_env'; allowed: MODULE:FUNCTION, e.g. "
                              "mynets:make_net"),
    ({"model": "custom_env:nothing"}, "model='custom_env:nothing': custom_env has no "
                                      "function 'nothing'"),
    ({"model": "custom_env:make_net", "mode": "apex"},
     "model='custom_env:make_net' is not taken by mode='apex' (its replay learner builds "
     "its own networks); allowed with mode sync, async, quorum, impala, seed, ga3c"),
    ({"env": "no_such_module:Corridor-v0", "model": ""},
     "env='no_such_module:Corridor-v0': cannot import 'no_such_module' (No module named "
     "'no_such_module'); it must be importable where the ranks start (the working "
     "directory or PYTHONPATH)"),
    ({"env": "custom_env:Hallway-v0", "model": ""},
     "env='custom_env:Hallway-v0' is not a registered gymnasium id after importing "
     "custom_env; allowed: a registered id, or MODULE:ENV_ID for your own")])
def test_train_checks_the_configuration_before_launching(fields, message, monkeypatch,
                                                         tmp_path):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    config = {"env": "custom_env:Corridor-v0", "run_dir": str(tmp_path), **fields}
    with pytest.raises(mpirl.ConfigError) as err:
        mpirl.train(config, ranks=4)
    assert str(err.value) == message
    assert not any(tmp_path.iterdir())             # nothing launched, nothing written


def test_train_refuses_bad_arguments_of_its_own():
    with pytest.raises(mpirl.ConfigError, match=r"ranks=0; allowed: an int >= 1"):
        mpirl.train({}, ranks=0)
    with pytest.raises(mpirl.ConfigError, match=r"config='nope.yaml': no such file"):
        mpirl.train("nope.yaml")
