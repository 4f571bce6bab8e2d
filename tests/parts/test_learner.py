"""The learner: replicas from a seed, targets of a rollout, applying a gradient, digests,
and its checkpoint state."""

from __future__ import annotations

import hashlib
import io

import gymnasium
import numpy as np
import pytest
import torch

from mpirl.config import Config
from mpirl.parts.actor import Rollout
from mpirl.parts.learner import Learner
from mpirl.telemetry.timing import PhaseTimer

OBS = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACT = gymnasium.spaces.Discrete(3)


def learner(**overrides) -> Learner:
    cfg = Config(**{"hidden": [8], "seed": 3, "lr": 0.01, "max_grad_norm": 0.0, **overrides})
    return Learner(cfg, OBS, ACT)


def rollout(steps=5, envs=3, seed=0) -> Rollout:
    rng = np.random.default_rng(seed)
    f = lambda *shape: torch.as_tensor(rng.normal(size=shape), dtype=torch.float32)  # noqa: E731
    dones = torch.zeros(steps, envs)
    boot = torch.zeros(steps, envs)
    dones[1, 0] = dones[3, 2] = dones[steps - 1, 1] = 1.0
    boot[3, 2] = 2.5                      # env 2 was cut by a time limit at step 3
    actions = torch.as_tensor(rng.integers(0, 3, (steps, envs)))
    return Rollout(obs=f(steps, envs, 4), actions=actions,
                   logp=f(steps, envs), values=f(steps, envs), rewards=f(steps, envs) + 1.0,
                   dones=dones, boot=boot, last_value=f(envs))


def advantages_by_sum(rewards, values, dones, last, gamma, lam):
    """A_t = sum_l (gamma lam)^l delta_{t+l} up to the episode's end (numpy, float64)."""
    steps, envs = rewards.shape
    out = np.zeros((steps, envs))
    for e in range(envs):
        for t in range(steps):
            for k in range(t, steps):
                nxt = last[e] if k + 1 == steps else values[k + 1, e]
                delta = rewards[k, e] + (0.0 if dones[k, e] else gamma * nxt) - values[k, e]
                out[t, e] += (gamma * lam) ** (k - t) * delta
                if dones[k, e]:
                    break
    return out


def test_same_seed_gives_identical_replicas():
    a, b = learner(), learner()
    np.testing.assert_array_equal(a.params, b.params)
    assert a.param_digest() == b.param_digest()
    assert not np.array_equal(a.params, learner(seed=4).params)


@pytest.mark.parametrize("reward_scale", [False, True])
def test_batch_matches_a_direct_computation(reward_scale):
    lrn = learner(reward_scale=reward_scale, gamma=0.9, gae_lambda=0.8)
    ro = rollout()
    rewards = ro.rewards.double().numpy()
    if reward_scale:
        rewards = rewards / (np.std(rewards, ddof=1) + 1e-8)
    # the truncated step: its reward plus the discounted value of the cut-off observation
    rewards = rewards + 0.9 * ro.boot.double().numpy()
    values = ro.values.double().numpy()
    adv = advantages_by_sum(rewards, values, ro.dones.numpy(), ro.last_value.double().numpy(),
                            0.9, 0.8)
    batch = lrn.batch(ro)
    np.testing.assert_allclose(batch.advantages.numpy(), adv.reshape(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(batch.returns.numpy(), (adv + values).reshape(-1),
                               rtol=1e-5, atol=1e-5)
    # flattened time-major: row t * E + e
    assert batch.obs.shape == (15, 4)
    torch.testing.assert_close(batch.obs[2 * 3 + 1], ro.obs[2, 1])
    assert batch.actions[4 * 3 + 2] == ro.actions[4, 2]
    assert batch.logp_old[1 * 3 + 0] == ro.logp[1, 0]


def test_batch_bootstraps_a_truncated_step():
    lrn = learner(gamma=0.9, gae_lambda=0.0)
    ro = rollout()
    batch = lrn.batch(ro)
    # one-step TD at the truncated step (t=3, env 2): r + gamma * boot - V
    expected = ro.rewards[3, 2] + 0.9 * 2.5 - ro.values[3, 2]
    assert batch.advantages[3 * 3 + 2].item() == pytest.approx(expected.item(), rel=1e-6)


def test_gradient_lands_in_grad_and_is_not_accumulated():
    lrn = learner()
    batch = lrn.batch(rollout())
    lrn.gradient(batch, PhaseTimer())
    first = lrn.grad.copy()
    assert np.any(first != 0)
    lrn.gradient(batch, PhaseTimer())
    np.testing.assert_array_equal(lrn.grad, first)


def test_apply_with_an_external_buffer_equals_applying_own_grad():
    a, b = learner(max_grad_norm=0.5), learner(max_grad_norm=0.5)
    rng = np.random.default_rng(7)
    a.grad[:] = 123.0                                 # a's own gradient: not to be used
    for _ in range(3):
        push = rng.normal(size=a.grad.size).astype(np.float32)
        b.grad[:] = push
        a.apply(PhaseTimer(), grad=push.copy())
        b.apply(PhaseTimer())
        np.testing.assert_array_equal(a.params, b.params)
    assert np.all(a.grad == 123.0)
    assert a.digest() == b.digest()
    assert a.flat.flat.grad.data_ptr() == a.flat.grad_np.ctypes.data   # still its own buffer
    a.flat.check_views()


def test_first_adam_step_is_lr_times_sign():
    lrn = learner(lr=0.01)
    before = lrn.params.copy()
    grad = np.random.default_rng(0).normal(size=lrn.grad.size).astype(np.float32)
    lrn.grad[:] = grad
    lrn.apply(PhaseTimer())
    # bias-corrected moments after one step are g and g^2: the step is lr g / (|g| + eps)
    np.testing.assert_allclose(lrn.params, before - 0.01 * grad / (np.abs(grad) + 1e-8),
                               rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("max_norm", [0.0, 0.5, 1e6])
def test_max_grad_norm_clips_what_adam_sees(max_norm):
    lrn = learner(max_grad_norm=max_norm)
    grad = np.random.default_rng(1).normal(size=lrn.grad.size)
    lrn.grad[:] = grad
    lrn.apply(PhaseTimer())
    norm = np.linalg.norm(grad)
    scale = min(1.0, max_norm / (norm + 1e-6)) if max_norm > 0 else 1.0
    exp_avg = lrn.opt.state[lrn.flat.flat]["exp_avg"].numpy()
    np.testing.assert_allclose(exp_avg, 0.1 * scale * grad, rtol=1e-5, atol=1e-9)
    if max_norm == 0.5:
        assert np.linalg.norm(exp_avg / 0.1) == pytest.approx(0.5, rel=1e-5)


def test_digests_change_with_a_step_and_agree_between_replicas():
    a, b = learner(), learner()
    assert a.param_digest() == hashlib.sha256(a.params.tobytes()).hexdigest()
    before = a.digest(), a.param_digest()
    assert a.digest() == b.digest()
    for lrn in (a, b):
        lrn.grad[:] = 0.25
        lrn.apply(PhaseTimer())
    assert a.digest() != before[0] and a.param_digest() != before[1]
    assert a.digest() == b.digest() and a.param_digest() == b.param_digest()


def test_digest_covers_the_optimizer_state():
    a, b = learner(), learner()
    a.grad[:] = 0.0                          # Adam with g = 0: parameters stay, step count moves
    a.apply(PhaseTimer())
    assert a.param_digest() == b.param_digest()
    assert a.digest() != b.digest()


def stepped(seed=2, steps=2) -> Learner:
    lrn = learner()
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        lrn.grad[:] = rng.normal(size=lrn.grad.size)
        lrn.apply(PhaseTimer())
    return lrn


def continue_both(a: Learner, b: Learner) -> None:
    push = np.random.default_rng(5).normal(size=a.grad.size).astype(np.float32)
    for lrn in (a, b):
        lrn.grad[:] = push
        lrn.apply(PhaseTimer())


def test_state_round_trip_through_a_file_continues_identically():
    a = stepped()
    buf = io.BytesIO()
    torch.save(a.state(), buf)
    buf.seek(0)
    b = learner(seed=99)
    b.load_state(torch.load(buf, weights_only=True))
    assert b.digest() == a.digest()
    continue_both(a, b)
    np.testing.assert_array_equal(a.params, b.params)
    assert a.digest() == b.digest()
    b.flat.check_views()


def test_state_round_trip_in_memory_continues_identically():
    a = stepped()
    b = learner(seed=99)
    b.load_state(a.state())
    assert b.digest() == a.digest()
    continue_both(a, b)
    np.testing.assert_array_equal(a.params, b.params)


def test_state_is_not_changed_by_later_steps():
    a = stepped()
    saved = a.state()
    kept = {k: v.clone() for k, v in saved["adam"]["state"][0].items()}
    continue_both(a, learner())
    for key, value in kept.items():
        torch.testing.assert_close(saved["adam"]["state"][0][key], value, msg=key)


def test_state_is_a_copy():
    a = learner()
    saved = a.state()
    kept = saved["params"].clone()
    a.params[:] = 0.0
    torch.testing.assert_close(saved["params"], kept)


def test_load_state_without_adam_keeps_the_optimizer():
    a = learner()
    a.grad[:] = 1.0
    a.apply(PhaseTimer())
    steps = a.opt.state[a.flat.flat]["step"].item()
    a.load_state({"params": torch.zeros(a.params.size)})
    assert not np.any(a.params)
    assert a.opt.state[a.flat.flat]["step"].item() == steps


def test_apply_is_timed_as_optimizer_s():
    lrn = learner()
    timer = PhaseTimer()
    lrn.apply(timer)
    assert set(timer.take()) == {"optimizer_s"}
