"""Delay-v0, the synthetic slow environment, and the checks of every own env's arguments."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest

import mpirl.parts.envs  # noqa: F401  (registers the ids)
from mpirl.parts.envs import check_env_args


# -- Delay-v0 ----------------------------------------------------------------------------------
def test_delay_env_costs_what_it_is_told_and_reports_it():
    env = gymnasium.make("Delay-v0", obs_dim=5, act_dim=3, cost_s=0.004, episode_steps=6)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (5,) and env.action_space.shape == (3,)
    times = []
    for t in range(6):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        times.append(info["sim_s"])
        assert -1.0 <= reward <= 0.0 and not terminated
        assert truncated == (t == 5)
    assert min(times) >= 0.004 and np.median(times) < 0.004 * 3


@pytest.mark.parametrize("dist", ["lognormal", "pareto"])
def test_delay_env_heavy_tails_are_seeded_and_heavy(dist):
    def draws(seed):
        env = gymnasium.make("Delay-v0", cost_s=0.001, dist=dist, tail=1.5 if dist == "pareto"
                             else 1.0).unwrapped
        env.reset(seed=seed)
        return np.array([env.draw_cost() for _ in range(4000)])

    a, b = draws(1), draws(1)
    assert np.array_equal(a, b) and not np.array_equal(a, draws(2))
    assert np.quantile(a, 0.99) > 5 * np.median(a)          # a tail, not a constant
    if dist == "pareto":
        assert a.min() >= 0.001
    else:
        assert np.median(a) == pytest.approx(0.001, rel=0.1)


def test_delay_env_spin_burns_cpu_and_sleep_does_not():
    """Spinning holds the CPU for the step's cost, sleeping gives it away.  Compared with
    each other, not with a fixed share of the wall time: on a loaded machine a spinning
    process gets only part of a core (once 47% here, under the whole suite)."""
    import time

    used = {}
    for busy in ("spin", "sleep"):
        env = gymnasium.make("Delay-v0", cost_s=0.02, busy=busy)
        env.reset(seed=0)
        cpu = time.process_time()
        for _ in range(5):
            env.step(env.action_space.sample())
        used[busy] = time.process_time() - cpu
    assert used["sleep"] < 0.01, used                # 0.1 s of steps, asleep
    assert used["spin"] > 10 * used["sleep"] and used["spin"] > 0.02, used


def test_delay_env_can_be_learned_from():
    """The best action (tracking the observation) scores higher than a random one."""
    env = gymnasium.make("Delay-v0", obs_dim=4, act_dim=4, cost_s=0.0).unwrapped
    obs, _ = env.reset(seed=3)
    best = random_ = 0.0
    rng = np.random.default_rng(0)
    for _ in range(200):
        target = 0.5 * (1 + np.tanh(obs))
        state = (env._obs.copy(), env.np_random.bit_generator.state)
        _, r_rand, *_ = env.step(rng.random(4))
        env._obs, env.np_random.bit_generator.state = state
        obs, r_best, *_ = env.step(target)
        best, random_ = best + r_best, random_ + r_rand
    assert best == pytest.approx(0.0, abs=1e-9) and random_ < -5


@pytest.mark.parametrize("env_id, kwargs, message", [
    ("Delay-v0", {"cost": 1}, "has no argument 'cost'"),
    ("Delay-v0", {"dist": "cauchy"}, "dist='cauchy'"),
    ("Delay-v0", {"cost_s": -1.0}, "cost_s=-1.0"),
    ("Delay-v0", {"obs_dim": 2.5}, "obs_dim=2.5"),
    ("L2Run-v0", {"difficulty": 3}, "difficulty=3; allowed: 0, 1 or 2"),
    ("CartPole-v1", {"difficulty": 1}, "takes none"),
])
def test_env_arguments_are_checked_before_any_env_is_built(env_id, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        check_env_args(env_id, kwargs)


def test_delay_env_under_async_training_logs_worker_step_times(tmp_path):
    from analysis import load_run
    from conftest import BATCH
    from mpirun import run_mpi

    run_mpi(3, ["-m", "mpirl.run", "--env", "Delay-v0", "--env-arg", "cost_s=0.001",
                "--env-arg", "dist=pareto", "--env-arg", "tail=2", "--env-arg", "act_dim=3",
                "--mode", "async", "--topology", "star", "--total-steps", "640", *BATCH,
                "--run-dir", str(tmp_path), "--run-name", "d"], timeout_s=180)
    run = load_run(tmp_path / "d")
    sims = run.sim_steps
    assert set(sims["rank"]) == {1, 2}                  # workers step envs; the server not
    assert (sims["sim_s"] >= 0.001).all()
    assert len(sims) == run.updates[run.updates["role"] == "worker"]["env_steps"].sum()


# -- an env's dynamic state, as a checkpoint keeps it -----------------------------------------
@pytest.mark.parametrize("env_id", ["Pendulum-v1", "Hopper-v5"])
def test_an_env_continued_from_its_saved_state_steps_as_the_original(env_id):
    """env_state() of a vector env mid-episode into envs seeded otherwise: the same
    observations, rewards and episode ends (Hopper falls and resets: its reset noise
    comes from the saved RNG), bit for bit."""
    from mpirl.parts.envs.snapshot import env_state, restore_env_state
    from mpirl.parts.envs.vector import make_envs

    original = make_envs(env_id, 2, 0)
    original.reset(seed=3)
    actions = np.random.default_rng(0).uniform(-1, 1, (500, *original.action_space.shape))
    for action in actions[:200]:
        original.step(action.astype(np.float32))
    saved = env_state(original)
    other = make_envs(env_id, 2, 1)
    other.reset(seed=4)
    assert restore_env_state(other, saved)
    ends = 0
    for action in actions[200:]:
        a, b = original.step(action.astype(np.float32)), other.step(action.astype(np.float32))
        assert all(np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in
                   zip(a[:4], b[:4], strict=True))
        ends += int(a[2].sum() + a[3].sum())
    assert ends > 0                        # episodes ended and reset in the compared steps


def test_an_env_whose_state_cannot_be_captured_says_so():
    from mpirl.parts.envs.snapshot import env_state, restore_env_state
    from mpirl.parts.envs.vector import make_envs

    envs = make_envs("Delay-v0", 1, 0)
    envs.reset(seed=0)
    assert env_state(envs) is None and not restore_env_state(envs, None)
