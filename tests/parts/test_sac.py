"""SAC, the replay designs' learner for Box actions, in one process: the squashed
Gaussian's log-probability against torch's own transformed distribution, each loss's
gradient on its own parameters only, the Polyak target, and a short learning check on
Pendulum."""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import gymnasium
import numpy as np
import pytest
import torch
from torch.distributions import Independent, Normal, TransformedDistribution
from torch.distributions.transforms import AffineTransform, TanhTransform

from mpirl.parts.learner.sac import SacLearner, sac_terms
from mpirl.parts.transitions import initial_priorities

OBS = gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gymnasium.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))


def config(**over):
    base = dict(seed=3, hidden=[16, 16], activation="relu", init_alpha=0.5, lr=1e-3,
                n_step=1, gamma=0.99, tau=0.1, target_entropy=0.0, max_grad_norm=0.0,
                layer_norm=False, sac_reward_scale=1.0)
    return SimpleNamespace(**{**base, **over})


class NoTimer:
    def __call__(self, name):
        return contextlib.nullcontext()


def batch(n=32, seed=0):
    rng = np.random.default_rng(seed)
    f = lambda *shape: torch.as_tensor(rng.uniform(-1, 1, shape), dtype=torch.float32)  # noqa: E731
    action = torch.stack([f(n) * 2.0, (f(n) + 1.0) / 2.0], dim=1)
    return {"obs": f(n, 3), "action": action, "ret": f(n), "disc": torch.full((n,), 0.99),
            "next_obs": f(n, 3)}


def test_initial_priorities_are_the_learners_td_except_at_alpha_zero():
    lrn = SacLearner(config(), OBS, ACT)
    b = batch()
    want = lrn.initial_priorities(b["obs"], b["action"], b["ret"], b["disc"], b["next_obs"])
    assert want.dtype == np.float32 and (want > 0).all() and len(set(want.tolist())) > 1
    np.testing.assert_array_equal(initial_priorities(lrn, b, 0.6), want)
    np.testing.assert_array_equal(initial_priorities(lrn, b, 0.0), np.ones(32, np.float32))
    # no learner is asked at alpha 0: no forward pass at all
    np.testing.assert_array_equal(initial_priorities(None, b, 0.0), np.ones(32, np.float32))


def test_log_probability_is_the_squashed_gaussians():
    model = SacLearner(config(), OBS, ACT).model
    obs, noise = batch()["obs"], torch.randn(32, 2)
    action, logp = model.sample(obs, noise)
    mean, log_std = model.gaussian(obs)
    dist = TransformedDistribution(Normal(mean, log_std.exp()),
                                   [TanhTransform(), AffineTransform(model.bias, model.scale)])
    want = Independent(dist, 1).log_prob(action)
    # SB3's epsilon 1e-6 inside the log makes the two differ by a little
    assert torch.allclose(logp, want, atol=1e-3)
    assert (action[:, 0].abs() <= 2).all() and ((action[:, 1] >= 0) & (action[:, 1] <= 1)).all()


def test_each_loss_moves_only_its_own_parameters():
    learner = SacLearner(config(), OBS, ACT)
    model = learner.model
    groups = {"policy": list(model.policy.parameters()),
              "critics": [*model.q1.parameters(), *model.q2.parameters()],
              "alpha": [model.log_alpha]}
    critic, actor, temperature, _, _ = sac_terms(model, learner.target, batch(), -2.0)
    for loss, own in ((critic, "critics"), (actor, "policy"), (temperature, "alpha")):
        params = [p for g in groups.values() for p in g]
        grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        touched = {name for name, g in groups.items()
                   for p in g for q, d in zip(params, grads, strict=True)
                   if q is p and d is not None and d.abs().sum() > 0}
        assert touched == {own}, (own, touched)


def test_target_moves_by_tau_after_every_update():
    learner = SacLearner(config(tau=0.1), OBS, ACT)
    before = learner.target_params.copy()
    learner.params[:] += 1.0
    learner.update_target(1)
    assert np.allclose(learner.target_params, before + 0.1, atol=1e-6)


def test_reward_scale_multiplies_the_stored_returns_and_layer_norm_reaches_every_net():
    T, E = 5, 2
    rollout = SimpleNamespace(obs=torch.rand(T, E, 3), actions=torch.rand(T, E, 2),
                              rewards=torch.rand(T, E), dones=torch.zeros(T, E),
                              boot=torch.zeros(T, E))
    last = torch.rand(E, 3)
    plain = SacLearner(config(), OBS, ACT).transitions(rollout, last)
    scaled = SacLearner(config(sac_reward_scale=10.0), OBS, ACT).transitions(rollout, last)
    assert torch.allclose(scaled["ret"], 10.0 * plain["ret"])
    assert torch.equal(scaled["next_obs"], plain["next_obs"])
    normed = SacLearner(config(layer_norm=True), OBS, ACT).model
    for net in (normed.policy, normed.q1, normed.q2):
        assert sum(isinstance(m, torch.nn.LayerNorm) for m in net.modules()) == 2


def test_temperature_falls_when_the_policy_is_more_random_than_its_target():
    learner = SacLearner(config(), OBS, ACT)
    _, _, temperature, _, logp = sac_terms(learner.model, learner.target, batch(), -10.0)
    temperature.backward()
    # entropy (-logp) above the target: d loss / d log alpha = -(logp + target) > 0
    assert (-logp.mean() > -10.0) and learner.model.log_alpha.grad.item() > 0


@pytest.mark.timeout(240)
def test_sac_learns_pendulum_in_4400_steps():
    torch.set_num_threads(1)
    env = gymnasium.make("Pendulum-v1")
    learner = SacLearner(config(hidden=[64, 64], tau=0.005, init_alpha=1.0), env.observation_space,
                         env.action_space)
    policy = learner.actor_policy(0, 1, torch.Generator().manual_seed(0))
    rng, size = np.random.default_rng(0), 4400
    store = {k: np.zeros((size, *shape), np.float32)
             for k, shape in (("obs", (3,)), ("action", (1,)), ("ret", ()), ("disc", ()),
                              ("next_obs", (3,)))}
    obs, _ = env.reset(seed=0)
    returns, total = [], 0.0
    for t in range(size):
        action = policy.act(torch.as_tensor(obs[None]))[0][0].numpy()
        nxt, reward, terminated, truncated, _ = env.step(action)
        for key, value in (("obs", obs), ("action", action), ("ret", reward),
                           ("disc", 0.0 if terminated else 0.99), ("next_obs", nxt)):
            store[key][t] = value
        total += reward
        obs = nxt
        if terminated or truncated:
            returns.append(total)
            total, (obs, _) = 0.0, env.reset()
        if t >= 500:
            pick = rng.integers(0, t + 1, 256)
            learner.gradient({k: torch.from_numpy(v[pick]) for k, v in store.items()}, NoTimer())
            learner.apply(NoTimer())
            learner.update_target(t)
    # random play scores about -1200; SB3's SAC is near -150 by 10k steps.  Measured
    # here: the last 5 episodes' mean crosses -500 at 3600 steps and is -89 at 4400
    # (-123 at 6000, the former length)
    assert np.mean(returns[-5:]) > -500, returns[-10:]
    assert math.isfinite(learner.model.log_alpha.item())
