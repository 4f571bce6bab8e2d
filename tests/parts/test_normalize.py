"""PPO's running statistics in one process: moments merged exactly, rewards scaled by the
discounted return's running std as gymnasium's NormalizeReward (the version CleanRL's
benchmark ran) defines it, observations normalized and clipped."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mpirl.parts.learner.normalize import CLIP, EPSILON, Moments, ObsNormalizer, RewardNormalizer


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=6), st.integers(0, 2**31 - 1))
def test_merged_moments_are_those_of_all_samples(sizes, seed):
    rng = np.random.default_rng(seed)
    parts = [rng.normal(3.0, 2.0, size=(n, 3)) for n in sizes]
    merged = Moments((3,))
    for part in parts:
        merged.merge(Moments.of(part))
    every = np.concatenate(parts)
    assert merged.count == len(every)
    if len(every):
        assert np.allclose(merged.mean, every.mean(axis=0), rtol=1e-12, atol=1e-12)
        assert np.allclose(merged.var, every.var(axis=0), rtol=1e-10, atol=1e-12)
    else:
        assert np.array_equal(merged.var, np.ones(3))       # no sample: the identity


def test_moments_travel_as_one_flat_record():
    m = Moments.of(np.arange(12.0).reshape(4, 3))
    back = Moments.unpack(m.pack(), (3,))
    assert m.pack().dtype == np.float64 and m.pack().shape == (7,)
    assert np.array_equal(back.pack(), m.pack())


def reference_rewards(rewards, dones, gamma):
    """gymnasium 0.2x's NormalizeReward, step by step: returns = returns * gamma + r;
    r / sqrt(var(returns so far) + eps); returns zeroed where the episode ended."""
    returns, seen, out = np.zeros(rewards.shape[1]), [], []
    for r, d in zip(rewards, dones, strict=True):
        returns = returns * gamma + r
        seen.append(returns.copy())
        out.append(r / np.sqrt(np.concatenate(seen).var() + EPSILON))
        returns[d > 0] = 0.0
    return np.clip(np.array(out), -CLIP, CLIP)


def test_rewards_are_scaled_by_the_running_return_std_across_batches():
    rng = np.random.default_rng(1)
    rewards = rng.normal(0.5, 3.0, size=(30, 2))
    dones = (rng.random((30, 2)) < 0.15).astype(np.float64)
    norm = RewardNormalizer(2, gamma=0.9)
    got = [norm(torch.from_numpy(rewards[a:b]).float(), torch.from_numpy(dones[a:b]).float())
           for a, b in ((0, 11), (11, 30))]                 # state carried between batches
    want = reference_rewards(rewards, dones, 0.9)
    assert np.allclose(torch.cat(got).numpy(), want, rtol=1e-5, atol=1e-6)


def test_reward_statistics_survive_a_checkpoint():
    rng = np.random.default_rng(2)
    a, b = RewardNormalizer(3, 0.99), RewardNormalizer(3, 0.99)
    batch = torch.from_numpy(rng.normal(size=(8, 3))).float()
    done = torch.zeros(8, 3)
    done[7, 1] = 1
    a(batch, done)
    b.load_state(a.state())
    assert torch.equal(a(batch, done), b(batch, done))


def test_observations_are_normalized_then_clipped():
    norm = ObsNormalizer((2,))
    norm.load(Moments.of(np.array([[0.0, 10.0], [2.0, 10.0]])))   # std 1 and 0
    out = norm(torch.tensor([[3.0, 10.0], [-100.0, 11.0]]))
    assert torch.allclose(out[0], torch.tensor([2.0, 0.0]))
    assert torch.allclose(out[1], torch.tensor([-CLIP, CLIP]))    # clipped, no inf
