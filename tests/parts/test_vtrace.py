"""V-trace against a direct transcription of the paper's formula.

Espeholt et al. 2018, eq. 1: ``v_s = V(x_s) + sum_{t=s}^{s+n-1} gamma^{t-s}
(prod_{i=s}^{t-1} c_i) delta_t V``, ``delta_t V = rho_t (r_t + gamma V(x_{t+1}) - V(x_t))``,
with per-step discounts (0 where an episode ended) in place of the powers of gamma, and
the unroll's end ``s + n = T``.  The code computes the same by a backward recursion;
here every term of the sum is written out in float64.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mpirl.parts.learner.losses import vtrace


def _bar(x, bar):
    return x if bar is None else min(bar, x)


def vtrace_by_sum(mu_logp, pi_logp, rewards, discounts, values, bootstrap, rho_bar, c_bar,
                  pg_rho_bar, lam):
    mu, pi, r, d, v = (np.asarray(x, dtype=np.float64) for x in
                       (mu_logp, pi_logp, rewards, discounts, values))
    boot = np.asarray(bootstrap, dtype=np.float64)
    steps, cols = r.shape
    vs = np.zeros((steps + 1, cols))
    adv = np.zeros((steps, cols))
    for b in range(cols):
        vals = list(v[:, b]) + [boot[b]]
        rho = [math.exp(pi[t, b] - mu[t, b]) for t in range(steps)]
        for s in range(steps):
            total = 0.0
            for t in range(s, steps):
                weight = 1.0                       # gamma^{t-s} prod_{i=s}^{t-1} c_i
                for i in range(s, t):
                    weight *= d[i, b] * lam * _bar(rho[i], c_bar)
                delta = _bar(rho[t], rho_bar) * (r[t, b] + d[t, b] * vals[t + 1] - vals[t])
                total += weight * delta
            vs[s, b] = vals[s] + total
        vs[steps, b] = boot[b]
        for s in range(steps):
            adv[s, b] = _bar(rho[s], pg_rho_bar) * (r[s, b] + d[s, b] * vs[s + 1, b]
                                                    - vals[s])
    return vs[:steps], adv


def random_case(seed, steps, cols, spread):
    g = np.random.default_rng(seed)
    mu = g.normal(-1.0, 0.5, (steps, cols))
    pi = mu + g.normal(0.0, spread, (steps, cols))   # log rho: both sides of 1
    rewards = g.normal(0.0, 1.0, (steps, cols))
    dones = g.random((steps, cols)) < 0.2
    dones[steps // 2, 0] = spread > 0          # at least one episode end inside
    discounts = np.where(dones, 0.0, 0.97)
    values = g.normal(0.0, 1.0, (steps, cols))
    boot = g.normal(0.0, 1.0, cols)
    return mu, pi, rewards, discounts, values, boot


@pytest.mark.parametrize("cols", [1, 5])
@pytest.mark.parametrize("bars", [(1.0, 1.0, 1.0), (None, None, None), (2.0, 0.5, 1.5),
                                  (1.0, None, 1.0)])
@pytest.mark.parametrize("lam", [1.0, 0.9])
def test_vtrace_matches_the_papers_sum(cols, bars, lam):
    rho_bar, c_bar, pg_rho_bar = bars
    case = random_case(cols * 7 + int(lam * 10), steps=9, cols=cols, spread=1.0)
    mu, pi, _r, d, _v, _b = case
    rho = np.exp(pi - mu)
    assert (rho > 1.2).any() and (rho < 0.8).any()        # ratios on both sides of the clips
    assert (d == 0).any()                                 # and episode ends inside the unroll
    want_vs, want_adv = vtrace_by_sum(*case, rho_bar, c_bar, pg_rho_bar, lam)
    got_vs, got_adv = vtrace(*(torch.as_tensor(x) for x in case), rho_bar=rho_bar,
                             c_bar=c_bar, pg_rho_bar=pg_rho_bar, lam=lam)
    np.testing.assert_allclose(got_vs.numpy(), want_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got_adv.numpy(), want_adv, rtol=1e-10, atol=1e-10)


def test_on_policy_vtrace_is_the_n_step_return():
    """rho = 1 everywhere (pi = mu), lambda 1: vs_s is the discounted n-step return
    bootstrapped from V(x_T), cut at episode ends."""
    mu, _pi, r, d, v, boot = random_case(3, steps=6, cols=4, spread=0.0)
    vs, _ = vtrace(*(torch.as_tensor(x) for x in (mu, mu, r, d, v, boot)))
    want = np.zeros_like(r)
    acc = boot.copy()
    for t in reversed(range(r.shape[0])):
        acc = r[t] + d[t] * acc
        want[t] = acc
    np.testing.assert_allclose(vs.numpy(), want, rtol=1e-12)


def test_the_clip_bounds_how_far_a_stale_action_moves_the_target():
    """A target policy far more likely than the behaviour one (rho 20): with rho-bar 1
    the correction is the on-policy one; without a bar it is 20 times larger."""
    mu = torch.full((1, 1), math.log(0.05))
    pi = torch.zeros((1, 1))
    r, d, v, boot = torch.ones(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1)
    clipped, _ = vtrace(mu, pi, r, d, v, boot, rho_bar=1.0)
    free, _ = vtrace(mu, pi, r, d, v, boot, rho_bar=None)
    assert clipped.item() == pytest.approx(1.0) and free.item() == pytest.approx(20.0)
