"""GAE and the actor-critic loss against direct evaluations of their formulas.

GAE is compared with the sum ``A_t = sum_l (gamma lam)^l delta_{t+l}`` cut at the end
of the episode (the recursion in the code is checked against the paper's sum, as
TorchBeast's vtrace_test does); the loss with log-probabilities, entropies and values
computed by hand from the model's raw outputs.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import gymnasium
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mpirl.parts.learner.losses import actor_critic_loss, gae
from mpirl.parts.learner.model import ActorCritic


def gae_by_sum(rewards, values, dones, last_value, gamma, lam):
    """A_t = sum_{l>=0} (gamma lam)^l delta_{t+l}, stopped after the step that ends the
    episode; delta_k = r_k + gamma V_{k+1} [k not done] - V_k, V_T = last_value."""
    r, v, d = (np.asarray(x, dtype=np.float64) for x in (rewards, values, dones))
    last = np.asarray(last_value, dtype=np.float64)
    steps, envs = r.shape
    out = np.zeros((steps, envs))
    for e in range(envs):
        for t in range(steps):
            total = 0.0
            for k in range(t, steps):
                next_v = last[e] if k + 1 == steps else v[k + 1, e]
                bootstrap = 0.0 if d[k, e] else gamma * next_v
                delta = r[k, e] + bootstrap - v[k, e]
                total += (gamma * lam) ** (k - t) * delta
                if d[k, e]:
                    break
            out[t, e] = total
    return out


def as_tensors(*arrays):
    return [torch.as_tensor(np.asarray(a, dtype=np.float64)) for a in arrays]


@st.composite
def rollouts(draw):
    steps = draw(st.integers(1, 7))
    envs = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(steps, envs))
    values = rng.normal(size=(steps, envs))
    dones = (rng.random((steps, envs)) < draw(st.sampled_from([0.0, 0.3, 1.0]))).astype(float)
    last = rng.normal(size=envs)
    gamma = draw(st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]))
    lam = draw(st.sampled_from([0.0, 0.5, 0.95, 1.0]))
    return rewards, values, dones, last, gamma, lam


@settings(max_examples=60, deadline=None)
@given(rollouts())
def test_gae_equals_the_truncated_sum_of_deltas(case):
    rewards, values, dones, last, gamma, lam = case
    got = gae(*as_tensors(rewards, values, dones, last), gamma, lam)
    assert got.shape == rewards.shape
    np.testing.assert_allclose(got.numpy(), gae_by_sum(*case), rtol=1e-10, atol=1e-10)


def test_gae_single_step_is_one_td_error():
    r, v, d, last = as_tensors([[1.0, 2.0]], [[0.5, -1.0]], [[0.0, 1.0]], [3.0, 7.0])
    got = gae(r, v, d, last, 0.9, 0.95)
    # env 0 bootstraps from last_value; env 1 ended, last_value is of a new episode
    np.testing.assert_allclose(got.numpy(), [[1.0 + 0.9 * 3.0 - 0.5, 2.0 - (-1.0)]])


def test_gae_lambda_zero_is_one_step_td():
    rng = np.random.default_rng(1)
    r, v = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    d = np.zeros((5, 3))
    d[2, 1] = d[4, 2] = 1.0
    last = rng.normal(size=3)
    next_v = np.vstack([v[1:], last[None]])
    expected = r + 0.9 * next_v * (1 - d) - v
    got = gae(*as_tensors(r, v, d, last), 0.9, 0.0)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)


def test_gae_lambda_one_is_monte_carlo_return_minus_value():
    gamma = 0.9
    rewards = np.array([[1.0], [2.0], [3.0], [4.0], [5.0]])
    values = np.array([[0.1], [0.2], [0.3], [0.4], [0.5]])
    dones = np.array([[0.0], [1.0], [0.0], [0.0], [1.0]])   # mid-rollout and last step
    got = gae(*as_tensors(rewards, values, dones, [100.0]), gamma, 1.0).numpy()[:, 0]
    returns = [1 + gamma * 2, 2, 3 + gamma * 4 + gamma**2 * 5, 4 + gamma * 5, 5]
    np.testing.assert_allclose(got, np.array(returns) - values[:, 0], rtol=1e-12)


def test_gae_lambda_one_bootstraps_an_unfinished_episode_from_last_value():
    gamma = 0.5
    got = gae(*as_tensors([[1.0], [1.0]], [[0.0], [0.0]], [[0.0], [0.0]], [8.0]), gamma, 1.0)
    np.testing.assert_allclose(got.numpy()[:, 0], [1 + 0.5 + 0.25 * 8, 1 + 0.5 * 8])


def test_gae_does_not_carry_across_an_episode_end():
    # a huge reward after the end of env 0's episode must not reach steps before it
    r, v, d, last = as_tensors([[0.0], [0.0], [1e6]], [[0.0], [0.0], [0.0]],
                               [[0.0], [1.0], [0.0]], [0.0])
    got = gae(r, v, d, last, 0.99, 0.95).numpy()[:, 0]
    np.testing.assert_allclose(got[:2], [0.0, 0.0])
    assert got[2] == 1e6


# -- the loss -------------------------------------------------------------------------------

OBS_SPACE = gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32)


def discrete_model():
    torch.manual_seed(0)
    model = ActorCritic(OBS_SPACE, gymnasium.spaces.Discrete(4), [5]).double()
    with torch.no_grad():                    # logits far from uniform, so the test can tell
        model.policy[-1].weight.normal_(0.0, 1.0)
    return model


def box_model():
    torch.manual_seed(1)
    model = ActorCritic(OBS_SPACE, gymnasium.spaces.Box(-2.0, 2.0, (2,)), [5]).double()
    with torch.no_grad():
        model.policy[-1].weight.normal_(0.0, 1.0)
        model.log_std.copy_(torch.tensor([-0.3, 0.4]))
    return model


def categorical_parts(model, obs, actions):
    """Log-probability of ``actions``, entropy and value, from the raw MLP outputs."""
    logits = model.policy(obs)
    logsm = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    logp = logsm.gather(1, actions.long()[:, None])[:, 0]
    entropy = -(logsm.exp() * logsm).sum(-1)
    return logp, entropy, model.value(obs)[:, 0]


def gaussian_parts(model, obs, actions):
    mean, log_std = model.policy(obs), model.log_std
    z = (actions - mean) / log_std.exp()
    logp = (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    entropy = (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum().expand(len(obs))
    return logp, entropy, model.value(obs)[:, 0]


def clipped_surrogate(ratio, adv, eps):
    """-min(r A, clip(r) A), written case by case: for A > 0 the ratio's gain stops at
    1 + eps, for A < 0 at 1 - eps."""
    upper = torch.where(ratio > 1 + eps, (1 + eps) * adv, ratio * adv)
    lower = torch.where(ratio < 1 - eps, (1 - eps) * adv, ratio * adv)
    return -torch.where(adv > 0, upper, lower)


def make_batch(model, parts, ratios=None, seed=0):
    rng = np.random.default_rng(seed)
    n = 8
    obs = torch.as_tensor(rng.uniform(-1, 1, (n, 3)))
    if model.discrete:
        actions = torch.as_tensor(rng.integers(0, 4, n))
    else:
        actions = torch.as_tensor(rng.normal(size=(n, 2)))
    with torch.no_grad():
        logp_now = parts(model, obs, actions)[0]
    ratios = torch.as_tensor(np.ones(n) if ratios is None else ratios, dtype=torch.float64)
    return SimpleNamespace(
        obs=obs, actions=actions,
        returns=torch.as_tensor(rng.normal(size=n)),
        advantages=torch.tensor([1.5, -2.0, 0.7, -0.4, 2.2, -1.1, 0.3, -0.9],
                                dtype=torch.float64),
        logp_old=logp_now - torch.log(ratios))


def own_loss(model, parts, batch, value_coef, entropy_coef, clip):
    logp, entropy, value = parts(model, batch.obs, batch.actions)
    if clip > 0:
        ratio = torch.exp(logp - batch.logp_old)
        policy = clipped_surrogate(ratio, batch.advantages, clip).mean()
    else:
        policy = -(logp * batch.advantages).mean()
    value_loss = 0.5 * ((batch.returns - value) ** 2).mean()
    entropy = entropy.mean()
    total = policy + value_coef * value_loss - entropy_coef * entropy
    return total, policy, value_loss, entropy


def grads(model, loss):
    return [g.clone() for g in torch.autograd.grad(loss, list(model.parameters()),
                                                   allow_unused=True)]


#: ratios on both sides of a clip of 0.2 (and inside it), each with either sign of A
RATIOS = [1.5, 1.5, 0.5, 0.5, 1.1, 0.9, 1.25, 0.7]


@pytest.mark.parametrize("make_model,parts", [(discrete_model, categorical_parts),
                                              (box_model, gaussian_parts)],
                         ids=["categorical", "gaussian"])
@pytest.mark.parametrize("clip", [0.0, 0.2], ids=["a2c", "ppo"])
def test_loss_parts_and_gradient_match_a_hand_computation(make_model, parts, clip):
    model = make_model()
    batch = make_batch(model, parts, RATIOS if clip else None)
    loss, info = actor_critic_loss(model, batch, 0.7, 0.03, clip)
    total, policy, value_loss, entropy = own_loss(model, parts, batch, 0.7, 0.03, clip)
    assert info["policy_loss"] == pytest.approx(policy.item(), rel=1e-9, abs=1e-12)
    assert info["value_loss"] == pytest.approx(value_loss.item(), rel=1e-9)
    assert info["entropy"] == pytest.approx(entropy.item(), rel=1e-9)
    assert loss.item() == pytest.approx(total.item(), rel=1e-9)
    for mine, theirs in zip(grads(model, total), grads(model, loss), strict=True):
        if mine is None:
            assert theirs is None
        else:
            torch.testing.assert_close(theirs, mine, rtol=1e-9, atol=1e-12)


def test_ppo_surrogate_takes_the_pessimistic_side_per_sample():
    model = discrete_model()
    batch = make_batch(model, categorical_parts, RATIOS)
    _, info = actor_critic_loss(model, batch, 0.0, 0.0, 0.2)
    adv = batch.advantages.numpy()
    # per sample, by hand: A>0 & r=1.5 -> 1.2A; A<0 & r=1.5 -> 1.5A; A>0 & r=0.5 -> 0.5A;
    # A<0 & r=0.5 -> 0.8A; inside the clip r A
    effective = np.array([1.2, 1.5, 0.5, 0.8, 1.1, 0.9, 1.2, 0.8])
    assert info["policy_loss"] == pytest.approx(-(effective * adv).mean(), rel=1e-9)


def test_ppo_clipped_samples_give_no_policy_gradient():
    model = discrete_model()
    batch = make_batch(model, categorical_parts, [1.5, 0.5, 1.5, 0.5, 1.5, 0.5, 1.5, 0.5])
    batch.advantages = torch.tensor([1.0, -1.0] * 4, dtype=torch.float64)  # all clipped
    loss, _ = actor_critic_loss(model, batch, 0.0, 0.0, 0.2)
    for g in grads(model, loss)[: len(list(model.policy.parameters()))]:
        assert g is None or torch.count_nonzero(g) == 0


def test_ppo_at_ratio_one_has_the_a2c_gradient():
    model = discrete_model()
    batch = make_batch(model, categorical_parts)            # logp_old = logp: r = 1
    ppo, _ = actor_critic_loss(model, batch, 0.5, 0.01, 0.2)
    a2c, _ = actor_critic_loss(model, batch, 0.5, 0.01, 0.0)
    for x, y in zip(grads(model, ppo), grads(model, a2c), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-12)


def test_approx_kl_is_mean_of_r_minus_one_minus_log_r():
    model = discrete_model()
    batch = make_batch(model, categorical_parts, RATIOS)
    _, info = actor_critic_loss(model, batch, 0.5, 0.01, 0.2)
    r = np.array(RATIOS)
    assert info["approx_kl"] == pytest.approx(np.mean((r - 1) - np.log(r)), rel=1e-9)
    assert info["approx_kl"] > 0


def test_approx_kl_is_nan_without_clipping():
    model = discrete_model()
    _, info = actor_critic_loss(model, make_batch(model, categorical_parts, RATIOS),
                                0.5, 0.01, 0.0)
    assert math.isnan(info["approx_kl"])


def test_a2c_policy_loss_ignores_logp_old():
    model = discrete_model()
    a = make_batch(model, categorical_parts, RATIOS)
    b = make_batch(model, categorical_parts)
    assert actor_critic_loss(model, a, 0.5, 0.01)[0].item() == \
        actor_critic_loss(model, b, 0.5, 0.01)[0].item()


def test_normalized_advantages_are_the_hand_computed_ones():
    model = box_model()
    batch = make_batch(model, gaussian_parts, RATIOS)
    _, info = actor_critic_loss(model, batch, 0.0, 0.0, 0.2, norm_adv=True)
    adv = batch.advantages.numpy()
    norm = (adv - adv.mean()) / (adv.std(ddof=1) + 1e-8)
    batch.advantages = torch.as_tensor(norm)
    _, plain = actor_critic_loss(model, batch, 0.0, 0.0, 0.2)
    assert info["policy_loss"] == pytest.approx(plain["policy_loss"], rel=1e-9)
    assert info["policy_loss"] != pytest.approx(              # and it changed something
        actor_critic_loss(model, make_batch(model, gaussian_parts, RATIOS), 0.0, 0.0,
                          0.2)[1]["policy_loss"], rel=1e-3)


def test_clipped_value_loss_takes_the_larger_of_the_two_errors_per_sample():
    model = box_model()
    batch = make_batch(model, gaussian_parts)
    with torch.no_grad():
        value = model.value(batch.obs)[:, 0]
    # old values: far below (clip binds), close above, and equal to the value
    batch.values = value + torch.tensor([-1.0, 0.05, 0.0, 2.0, -0.1, 0.5, -3.0, 0.0],
                                        dtype=torch.float64)
    _, info = actor_critic_loss(model, batch, 1.0, 0.0, 0.2, clip_vloss=True)
    v, old, ret = value.numpy(), batch.values.numpy(), batch.returns.numpy()
    kept = old + np.clip(v - old, -0.2, 0.2)
    want = 0.5 * np.maximum((v - ret) ** 2, (kept - ret) ** 2).mean()
    assert info["value_loss"] == pytest.approx(want, rel=1e-9)
