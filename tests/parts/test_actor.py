"""The actor with real gymnasium envs: rollout shapes, episodes, time limits, seeding,
checkpoint state, action clipping and the straggler's idle time."""

from __future__ import annotations

import io
import time

import gymnasium
import numpy as np
import pytest
import torch

from mpirl.parts.actor import Actor, ModelPolicy
from mpirl.parts.envs import make_envs
from mpirl.parts.learner.model import ActorCritic
from mpirl.telemetry.timing import PhaseTimer

SEED = 11


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny per-step forwards: torch's thread pool only costs time (much of it on a busy
    machine), so these tests run on one thread and give the setting back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def policy_for(envs, **kw) -> ModelPolicy:
    torch.manual_seed(0)
    return ModelPolicy(ActorCritic(envs.single_observation_space, envs.single_action_space,
                                   [8], **kw))


def cartpole(num_envs=2, seed=SEED, **kwargs):
    return make_envs("CartPole-v1", num_envs, seed, kwargs=kwargs or None)


def fields(rollout) -> dict:
    return {k: v for k, v in vars(rollout).items()}


def assert_same_rollout(a, b):
    for key, value in fields(a).items():
        torch.testing.assert_close(value, getattr(b, key), rtol=0, atol=0, msg=key)


def test_collect_shapes():
    envs = cartpole(3)
    actor = Actor(envs, SEED)
    ro = actor.collect(policy_for(envs), 7, PhaseTimer())
    assert ro.obs.shape == (7, 3, 4)
    for name in ("actions", "logp", "values", "rewards", "dones", "boot"):
        assert getattr(ro, name).shape == (7, 3), name
    assert ro.last_value.shape == (3,)
    assert actor.rollouts == 1
    assert set(ro.actions.unique().tolist()) <= {0, 1}


def test_rollout_links_observations_and_timer_phases():
    envs = cartpole(2)
    actor = Actor(envs, SEED)
    first_obs = actor.obs.clone()
    timer = PhaseTimer()
    ro = actor.collect(policy_for(envs), 5, timer)
    torch.testing.assert_close(ro.obs[0], first_obs)
    assert set(timer.take()) == {"forward_s", "env_s"}
    policy = policy_for(envs)
    with torch.no_grad():
        torch.testing.assert_close(ro.values, policy.model.value(ro.obs).squeeze(-1))
        torch.testing.assert_close(ro.last_value, policy.value(actor.obs))
        dist, _ = policy.model(ro.obs)
        torch.testing.assert_close(ro.logp, dist.log_prob(ro.actions))


def test_first_reset_is_seeded_per_env():
    envs = cartpole(2)
    actor = Actor(envs, SEED)
    for i in range(2):
        obs, _ = gymnasium.make("CartPole-v1").reset(seed=SEED + i)
        np.testing.assert_array_equal(actor.obs[i].numpy(), obs)


def test_episodes_drained_with_their_returns_and_lengths():
    envs = cartpole(2)
    actor = Actor(envs, SEED)
    ro = actor.collect(policy_for(envs), 120, PhaseTimer())
    episodes = actor.drain_episodes()
    assert len(episodes) == int(ro.dones.sum()) > 0
    assert all(ret == length for ret, length in episodes)     # CartPole pays 1 per step
    expected = []
    for e in range(2):                     # lengths are the gaps between an env's dones
        ends = np.flatnonzero(ro.dones[:, e].numpy())
        expected += np.diff(np.concatenate([[-1], ends])).tolist()
    assert sorted(length for _, length in episodes) == sorted(expected)
    assert actor.drain_episodes() == []


def test_time_limit_gives_dones_and_boot_exactly_where_truncated():
    envs = cartpole(2, max_episode_steps=5)
    actor = Actor(envs, SEED)
    policy = policy_for(envs)
    ro = actor.collect(policy, 12, PhaseTimer())
    cut = torch.zeros(12, 2)
    cut[[4, 9]] = 1.0                  # CartPole cannot fall within 5 steps from its reset
    torch.testing.assert_close(ro.dones, cut)
    assert torch.all(ro.boot[cut == 1] != 0)
    assert torch.all(ro.boot[cut == 0] == 0)
    assert actor.drain_episodes() == [(5.0, 5)] * 4
    # boot is the value of the observation the time limit cut off: replay env e by hand
    for e in range(2):
        env = gymnasium.make("CartPole-v1", max_episode_steps=5)
        env.reset(seed=SEED + e)
        for t in range(5):
            final, _, terminated, truncated, _ = env.step(int(ro.actions[t, e]))
        assert truncated and not terminated
        with torch.no_grad():
            value = policy.value(torch.as_tensor(final[None], dtype=torch.float32))
        assert ro.boot[4, e].item() == pytest.approx(value.item(), rel=1e-6)


def test_same_seed_same_rollouts():
    def two_rollouts(seed):
        envs = cartpole(2, seed)
        policy = policy_for(envs)
        actor = Actor(envs, seed)
        return [actor.collect(policy, 20, PhaseTimer()) for _ in range(2)]

    first = two_rollouts(SEED)
    for a, b in zip(first, two_rollouts(SEED), strict=True):
        assert_same_rollout(a, b)
    assert not torch.equal(first[1].actions, two_rollouts(SEED + 1)[1].actions)


def through_file(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def resumed_pair(steps=30, keep=lambda state: state):
    """Actor A: a rollout, its state (through ``keep``), two more rollouts.  Actor B:
    fresh (other seed), loads A's state, the same two rollouts.  Returns both sides'
    rollouts and episodes."""
    envs = cartpole(2)
    policy = policy_for(envs)
    a = Actor(envs, SEED)
    a.collect(policy, steps, PhaseTimer())
    a.drain_episodes()
    saved = keep(a.state())
    ours = [a.collect(policy, steps, PhaseTimer()) for _ in range(2)]
    ours_episodes = a.drain_episodes()
    b = Actor(cartpole(2, SEED + 5), SEED + 5)
    b.load_state(saved)
    theirs = [b.collect(policy, steps, PhaseTimer()) for _ in range(2)]
    return ours, theirs, ours_episodes, b.drain_episodes(), b


def test_state_taken_mid_run_continues_with_identical_rollouts():
    ours, theirs, _, _, b = resumed_pair()
    for x, y in zip(ours, theirs, strict=True):
        assert_same_rollout(x, y)
    assert b.rollouts == 3


def test_state_taken_mid_run_continues_episode_returns():
    _, _, ours, theirs, _ = resumed_pair()
    assert ours and ours == theirs


def test_state_saved_to_a_file_mid_run_continues_episode_returns():
    _, _, ours, theirs, _ = resumed_pair(keep=through_file)
    assert ours and ours == theirs


def test_state_is_not_changed_by_later_steps():
    envs = cartpole(2)
    policy = policy_for(envs)
    actor = Actor(envs, SEED)
    actor.collect(policy, 13, PhaseTimer())
    saved = actor.state()
    kept = {k: v.clone() if torch.is_tensor(v) else v for k, v in saved["roller"].items()}
    actor.collect(policy, 13, PhaseTimer())
    for key, value in kept.items():
        if torch.is_tensor(value):
            torch.testing.assert_close(saved["roller"][key], value, msg=key)
        else:
            assert saved["roller"][key] == value, key


def test_env_without_state_is_reset_with_seed_plus_rollouts():
    kwargs = {"cost_s": 0.0, "obs_dim": 3, "act_dim": 2, "episode_steps": 50}
    envs = make_envs("Delay-v0", 2, SEED, kwargs=kwargs)
    policy = policy_for(envs)
    a = Actor(envs, SEED)
    for _ in range(2):
        a.collect(policy, 4, PhaseTimer())
    saved = a.state()
    assert saved["envs"] is None
    b = Actor(make_envs("Delay-v0", 2, SEED, kwargs=kwargs), SEED)
    b.load_state(saved)
    assert b.rollouts == 2
    for i in range(2):
        obs, _ = gymnasium.make("Delay-v0", **kwargs).reset(seed=SEED + 2 + i)
        np.testing.assert_array_equal(b.obs[i].numpy(), obs)
    assert not torch.equal(b.obs, a.obs)


class RecordActions(gymnasium.Wrapper):
    def __init__(self, env, sink):
        super().__init__(env)
        self.sink = sink

    def step(self, action):
        self.sink.append(np.array(action, copy=True))
        return self.env.step(action)


def test_box_actions_are_clipped_to_the_space():
    seen: list[np.ndarray] = []
    envs = gymnasium.vector.SyncVectorEnv(
        [lambda: RecordActions(gymnasium.make("Pendulum-v1"), seen) for _ in range(2)],
        autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)
    policy = policy_for(envs)
    with torch.no_grad():
        policy.model.log_std.fill_(2.0)          # std 7.4 around a mean near 0: many over 2
    actor = Actor(envs, SEED)
    ro = actor.collect(policy, 20, PhaseTimer())
    assert ro.actions.shape == (20, 2, 1)
    raw = ro.actions.numpy()
    assert np.any(np.abs(raw) > 2.0)                  # the rollout keeps the sampled action
    sent = np.stack(seen).reshape(20, 2, 1)           # steps in env order within each step
    np.testing.assert_allclose(sent, np.clip(raw, -2.0, 2.0))


def test_pendulum_rollout_through_make_envs():
    envs = make_envs("Pendulum-v1", 2, SEED)
    actor = Actor(envs, SEED)
    ro = actor.collect(policy_for(envs), 10, PhaseTimer())
    assert ro.obs.shape == (10, 2, 3) and ro.actions.shape == (10, 2, 1)
    assert torch.all(ro.rewards <= 0) and not torch.any(ro.dones)


def test_slowdown_adds_a_straggle_phase():
    envs = cartpole(2)
    policy = policy_for(envs)
    plain = Actor(envs, SEED)
    timer = PhaseTimer()
    plain.collect(policy, 50, timer)
    assert "straggle_s" not in timer.take()
    slow = Actor(cartpole(2), SEED, slowdown=3.0)
    started = time.perf_counter()
    slow.collect(policy, 50, timer)
    wall = time.perf_counter() - started
    straggle = timer.take()["straggle_s"]
    # it idles twice the rollout's time: about 2/3 of the call, never all of it
    assert 0.4 * wall < straggle < wall
