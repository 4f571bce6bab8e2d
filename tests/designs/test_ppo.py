"""PPO as CleanRL defines it, in sync mode under mpiexec: every minibatch's gradient goes
through the topology (DD-PPO), the observation statistics are merged over every rank
and held identically by every replica, and a killed run with every option on resumes to
the same parameters."""

from __future__ import annotations

import json

import h5py
import numpy as np
import torch

from conftest import launch_runs, train
from mpirun import run_mpi

#: CleanRL's options on Pendulum, small: 2 envs x 8 steps per rank and rollout
PPO = ["--env", "Pendulum-v1", "--clip-ratio", "0.2", "--update-repeat", "2",
       "--minibatches", "4", "--norm-adv", "--obs-norm", "--reward-norm", "--anneal-lr",
       "--clip-vloss", "--init-log-std", "0", "--entropy-coef", "0"]


def test_every_minibatch_gradient_goes_through_the_exchange(tmp_path):
    # 10 rollouts of 3 ranks x 16 steps; each: 2 passes x 4 minibatches = 8 updates
    _, s = train(tmp_path, 3, *PPO, "--total-steps", "480", "--checksum-every", "1")
    assert s["updates"] == 80 and s["env_steps"] == 480
    assert s["gradients_sent"] == s["gradients_applied"] == 80 * 3
    for r in range(3):
        with h5py.File(tmp_path / "r" / f"rank{r:04d}.h5", "r") as f:
            u = f["updates"][...]
        assert list(u["update"]) == list(range(1, 81))
        # a rollout's env steps ride on its first update; every update exchanged bytes
        assert list(np.flatnonzero(u["env_steps"])) == list(range(0, 80, 8))
        assert u["env_steps"].sum() == 160 and (u["bytes_sent"] > 0).all()


def test_observation_statistics_are_merged_over_every_rank(tmp_path):
    train(tmp_path, 3, *PPO, "--total-steps", "480", "--checkpoint-every", "1",
          "--checksum-every", "8")
    stats = [torch.load(tmp_path / "r" / "checkpoints" / f"rank{r:04d}.pt",
                        weights_only=False)["obs_stats"].numpy() for r in range(3)]
    assert all(np.array_equal(stats[0], other) for other in stats[1:])   # byte-identical
    count, mean, m2 = stats[0][0], stats[0][1:4], stats[0][4:]
    assert count == 480                     # every observation of every rank, once
    # Pendulum's observation is (cos, sin, angular velocity): cos and sin within [-1, 1]
    assert np.all(np.abs(mean[:2]) <= 1) and np.all(m2 > 0)


def test_killed_ppo_run_resumes_to_the_same_parameters(tmp_path):
    run = [*PPO, "--total-steps", "640", "--num-envs", "2", "--rollout-steps", "8",
           "--checkpoint-every", "3", "--run-dir", str(tmp_path)]
    killed = run_mpi(2, ["-m", "mpirl.run", *run, "--run-name", "cut", "--fail", "1@60"],
                     timeout_s=180, check=False)
    assert killed.returncode != 0
    # the resume and the uninterrupted run in one launch (tests/mpi/runs.py), the resume
    # first: it starts in fresh processes, as a user's resume does
    launch_runs(2, [["--resume", str(tmp_path / "cut")], [*run, "--run-name", "full"]])
    full, cut = (json.loads((tmp_path / name / "summary.json").read_text())
                 for name in ("full", "cut"))
    assert cut["param_digest"] == full["param_digest"] and cut["updates"] == full["updates"]

