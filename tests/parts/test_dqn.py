"""The n-step double-DQN learner (Ape-X, Gorila): n-step transitions of a rollout, the
double-DQN loss, the dueling head, the flat buffers of the online and target networks,
the per-actor epsilon schedule and the epsilon-greedy policy."""

from __future__ import annotations

import io

import gymnasium
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mpirl.config import Config
from mpirl.parts.actor import Actor
from mpirl.parts.envs import make_envs
from mpirl.parts.learner.dqn import (DqnLearner, EpsilonGreedy, QNetwork, apex_epsilon,
                                     double_dqn_loss, nstep_transitions)
from mpirl.telemetry.timing import PhaseTimer

OBS = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACT = gymnasium.spaces.Discrete(3)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny networks: torch's thread pool only costs time."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def config(**overrides) -> Config:
    cfg = Config(**{"hidden": [8], "seed": 3, "lr": 0.01, "max_grad_norm": 0.0,
                    "activation": "relu", **overrides})
    cfg.dueling = False
    cfg.n_step = 3
    return cfg


def learner(dueling=False, n_step=3, **overrides) -> DqnLearner:
    cfg = config(**overrides)
    cfg.dueling, cfg.n_step = dueling, n_step
    return DqnLearner(cfg, OBS, ACT)


# -- n-step transitions ------------------------------------------------------------------------
def reference_nstep(obs, actions, rewards, dones, last_obs, n, gamma):
    """Plain Python, one (t, e) at a time, float64."""
    steps, envs = rewards.shape
    out = {"obs": [], "action": [], "ret": [], "disc": [], "next_obs": []}
    for t in range(steps):
        for e in range(envs):
            ret, m, ended = 0.0, 0, False
            while m < n and t + m < steps and not ended:
                ret += gamma ** m * float(rewards[t + m, e])
                ended = bool(dones[t + m, e])
                m += 1
            out["obs"].append(obs[t, e])
            out["action"].append(int(actions[t, e]))
            out["ret"].append(ret)
            out["disc"].append(0.0 if ended else gamma ** m)
            out["next_obs"].append(last_obs[e] if t + m == steps else obs[t + m, e])
    return {k: np.stack(v) if k.endswith("obs") else np.array(v) for k, v in out.items()}


def random_rollout(rng, steps, envs, obs_shape=(2,), done_p=0.3):
    obs = rng.normal(size=(steps, envs, *obs_shape))
    actions = rng.integers(0, 3, (steps, envs))
    rewards = rng.normal(size=(steps, envs))
    dones = (rng.random((steps, envs)) < done_p).astype(np.float64)
    last_obs = rng.normal(size=(envs, *obs_shape))
    return obs, actions, rewards, dones, last_obs


def compare_with_reference(case, n, gamma):
    obs, actions, rewards, dones, last_obs = case
    got = nstep_transitions(torch.as_tensor(obs, dtype=torch.float32), torch.as_tensor(actions),
                            torch.as_tensor(rewards, dtype=torch.float32),
                            torch.as_tensor(dones, dtype=torch.float32),
                            torch.as_tensor(last_obs, dtype=torch.float32), n, gamma)
    want = reference_nstep(obs, actions, rewards, dones, last_obs, n, gamma)
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key].shape == value.shape, key
        np.testing.assert_allclose(got[key].double().numpy(), value, rtol=1e-5, atol=1e-6,
                                   err_msg=key)
    assert got["action"].dtype == torch.long


@pytest.mark.parametrize("n", [1, 3, 12])
@pytest.mark.parametrize("seed", range(4))
def test_nstep_matches_a_plain_python_reference(n, seed):
    rng = np.random.default_rng(seed)
    case = random_rollout(rng, steps=7, envs=3, done_p=[0.0, 0.2, 0.5, 1.0][seed])
    compare_with_reference(case, n, gamma=0.9)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(1, 4), st.integers(1, 10),
       st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(0, 2 ** 32 - 1))
def test_nstep_matches_the_reference_on_any_rollout(steps, envs, n, gamma, done_p, seed):
    case = random_rollout(np.random.default_rng(seed), steps, envs, obs_shape=(2, 3),
                          done_p=done_p)
    compare_with_reference(case, n, gamma)


def one_env(rewards, dones, n, gamma=0.5):
    steps = len(rewards)
    obs = torch.arange(steps, dtype=torch.float32).reshape(steps, 1, 1)   # obs[t] = t
    return nstep_transitions(obs, torch.zeros(steps, 1, dtype=torch.long),
                             torch.tensor(rewards, dtype=torch.float32).reshape(steps, 1),
                             torch.tensor(dones, dtype=torch.float32).reshape(steps, 1),
                             torch.tensor([[100.0]]), n, gamma)


def test_nstep_truncates_at_the_rollouts_end_and_bootstraps_from_last_obs():
    tr = one_env([1.0, 2.0, 4.0, 8.0], [0, 0, 0, 0], n=3)
    # t=0,1: full 3-step returns; t=2: two steps left, t=3: one
    np.testing.assert_allclose(tr["ret"].numpy(), [1 + 1 + 1, 2 + 2 + 2, 4 + 4, 8])
    np.testing.assert_allclose(tr["disc"].numpy(), [0.125, 0.125, 0.25, 0.5])
    np.testing.assert_allclose(tr["next_obs"].flatten().numpy(), [3.0, 100.0, 100.0, 100.0])


def test_nstep_stops_at_a_done_and_does_not_bootstrap():
    tr = one_env([1.0, 2.0, 4.0, 8.0, 16.0], [0, 1, 0, 0, 0], n=3)
    # t=0 ends after two steps (the episode's last at t=1), t=1 after one
    np.testing.assert_allclose(tr["ret"].numpy(), [1 + 1, 2, 4 + 4 + 4, 8 + 8, 16])
    np.testing.assert_allclose(tr["disc"].numpy(), [0.0, 0.0, 0.125, 0.25, 0.5])
    np.testing.assert_allclose(tr["next_obs"].flatten().numpy(),
                               [2.0, 2.0, 100.0, 100.0, 100.0])


def test_nstep_is_flattened_time_major():
    rng = np.random.default_rng(5)
    obs, actions, rewards, dones, last_obs = (torch.as_tensor(x) for x in
                                              random_rollout(rng, 4, 3))
    tr = nstep_transitions(obs, actions, rewards, dones, last_obs, 2, 0.9)
    torch.testing.assert_close(tr["obs"][2 * 3 + 1], obs[2, 1])
    assert tr["action"][3 * 3 + 2] == actions[3, 2]


def test_nstep_refuses_n_below_one():
    with pytest.raises(ValueError, match="n >= 1"):
        one_env([1.0], [0], n=0)


# -- the double-DQN loss -----------------------------------------------------------------------
def linear(weight) -> torch.nn.Linear:
    layer = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight))
    return layer


def test_double_dqn_loss_by_hand():
    online = linear([[1.0, 0.0], [0.0, 1.0]])      # Q_online(s) = s
    target = linear([[0.0, 1.0], [1.0, 0.0]])      # Q_target(s) = s reversed
    obs = torch.tensor([[1.0, 3.0], [2.0, 0.5]])
    next_obs = torch.tensor([[4.0, 1.0], [0.0, 2.0]])
    action, ret = torch.tensor([1, 0]), torch.tensor([1.0, -1.0])
    disc, weights = torch.tensor([0.5, 0.25]), torch.tensor([2.0, 1.0])
    loss, td = double_dqn_loss(online, target, obs, action, ret, disc, next_obs, weights)
    # online argmax at s': 0 and 1; the target's values there: 1 and 0 (its own max: 4 and 2)
    y = np.array([1.0 + 0.5 * 1.0, -1.0 + 0.25 * 0.0])
    q = np.array([3.0, 2.0])
    np.testing.assert_allclose(td.numpy(), q - y)                    # [1.5, 3.0]
    huber = np.where(np.abs(q - y) < 1, 0.5 * (q - y) ** 2, np.abs(q - y) - 0.5)
    assert loss.item() == pytest.approx(np.mean([2.0, 1.0] * huber))
    assert not td.requires_grad
    loss_unweighted, _ = double_dqn_loss(online, target, obs, action, ret, disc, next_obs)
    assert loss_unweighted.item() == pytest.approx(np.mean(huber))


def test_double_dqn_loss_has_no_gradient_through_the_target():
    online = linear([[1.0, 0.0], [0.0, 1.0]])
    target = linear([[0.0, 1.0], [1.0, 0.0]])
    obs = torch.tensor([[0.2, 0.1]])
    loss, td = double_dqn_loss(online, target, obs, torch.tensor([0]), torch.tensor([0.0]),
                               torch.tensor([0.9]), obs)
    loss.backward()
    assert target.weight.grad is None
    # d/dW of 0.5 td^2 with y held fixed: td * s in the taken action's row only
    expected = torch.zeros(2, 2)
    expected[0] = td[0] * obs[0]
    torch.testing.assert_close(online.weight.grad, expected)


# -- the network -------------------------------------------------------------------------------
def test_dueling_q_is_value_plus_advantage_minus_its_mean():
    torch.manual_seed(0)
    net = QNetwork(OBS, ACT, [8, 8], dueling=True)
    obs = torch.randn(5, 4)
    h = net.torso(obs)
    value, adv = net.value_head(h), net.advantage_head(h)
    q = net(obs)
    assert q.shape == (5, 3)
    torch.testing.assert_close(q, value + adv - adv.mean(dim=1, keepdim=True))
    torch.testing.assert_close(q.mean(dim=1), value.squeeze(1))


def test_plain_q_network_shape_and_hidden_layers():
    net = QNetwork(OBS, ACT, [8, 6], activation="tanh", layer_norm=True)
    assert net(torch.randn(2, 4)).shape == (2, 3)
    assert sum(isinstance(m, torch.nn.Linear) for m in net.modules()) == 3
    assert sum(isinstance(m, torch.nn.LayerNorm) for m in net.modules()) == 2


def test_refuses_a_box_action_space():
    box = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
    with pytest.raises(ValueError, match="allowed: Discrete"):
        QNetwork(OBS, box, [8])
    cfg = config()
    with pytest.raises(ValueError, match="allowed: Discrete"):
        DqnLearner(cfg, OBS, box)


# -- the learner -------------------------------------------------------------------------------
def random_batch(size=16, seed=0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"obs": torch.randn(size, 4, generator=g),
            "action": torch.randint(0, 3, (size,), generator=g),
            "ret": torch.randn(size, generator=g),
            "disc": torch.full((size,), 0.9),
            "next_obs": torch.randn(size, 4, generator=g),
            "weights": torch.rand(size, generator=g) + 0.5}


@pytest.mark.parametrize("dueling", [False, True])
def test_same_seed_gives_identical_replicas_and_a_synced_target(dueling):
    a, b = learner(dueling), learner(dueling)
    np.testing.assert_array_equal(a.params, b.params)
    np.testing.assert_array_equal(a.target_params, a.params)
    assert a.digest() == b.digest()
    assert not np.array_equal(a.params, learner(dueling, seed=4).params)


@pytest.mark.parametrize("dueling", [False, True])
def test_gradient_lands_in_the_flat_grad_and_is_not_accumulated(dueling):
    lrn = learner(dueling)
    batch = random_batch()
    timer = PhaseTimer()
    parts, td_abs = lrn.gradient(batch, timer)
    first = lrn.grad.copy()
    assert np.any(first != 0)
    assert set(timer.take()) == {"backward_s"}
    assert set(parts) == {"value_loss", "td_abs_mean", "q_mean"}
    assert td_abs.shape == (16,) and np.all(td_abs >= 0)
    assert parts["td_abs_mean"] == pytest.approx(float(td_abs.mean()), rel=1e-6)
    loss, td = double_dqn_loss(lrn.model, lrn.target, **batch)
    assert parts["value_loss"] == pytest.approx(loss.item(), rel=1e-6)
    np.testing.assert_allclose(td_abs, td.abs().numpy(), rtol=1e-6)
    lrn.gradient(batch, PhaseTimer())
    np.testing.assert_array_equal(lrn.grad, first)
    assert not np.any(lrn.target_flat.grad_np)          # nothing flows into the target
    lrn.flat.check_views()


def test_apply_changes_only_the_online_params_and_sync_target_copies_them():
    lrn = learner()
    target_before = lrn.target_params.copy()
    lrn.gradient(random_batch(), PhaseTimer())
    timer = PhaseTimer()
    lrn.apply(timer)
    assert set(timer.take()) == {"optimizer_s"}
    assert not np.array_equal(lrn.params, target_before)
    np.testing.assert_array_equal(lrn.target_params, target_before)
    lrn.sync_target()
    np.testing.assert_array_equal(lrn.target_params, lrn.params)
    obs = torch.randn(3, 4)
    torch.testing.assert_close(lrn.target(obs), lrn.model(obs))
    lrn.params[:] += 1.0                                 # a copy, not shared memory
    assert not np.array_equal(lrn.target_params, lrn.params)


def test_apply_with_an_external_buffer_equals_applying_own_grad():
    a, b = learner(max_grad_norm=0.5), learner(max_grad_norm=0.5)
    rng = np.random.default_rng(7)
    a.grad[:] = 123.0
    for _ in range(3):
        push = rng.normal(size=a.grad.size).astype(np.float32)
        b.grad[:] = push
        a.apply(PhaseTimer(), grad=push.copy())
        b.apply(PhaseTimer())
        np.testing.assert_array_equal(a.params, b.params)
    assert np.all(a.grad == 123.0)
    assert a.digest() == b.digest()


def test_digests_cover_the_optimizer_and_the_target():
    a, b = learner(), learner()
    a.grad[:] = 0.0                          # Adam with g = 0: parameters stay, step count moves
    a.apply(PhaseTimer())
    assert a.param_digest() == b.param_digest() and a.digest() != b.digest()
    c = learner()
    c.target_params[:] = 0.0
    assert c.param_digest() == b.param_digest() and c.digest() != b.digest()


def test_state_round_trip_through_a_file_continues_identically():
    a = learner()
    for seed in range(2):
        a.gradient(random_batch(seed=seed), PhaseTimer())
        a.apply(PhaseTimer())
    a.sync_target()
    a.gradient(random_batch(seed=2), PhaseTimer())
    a.apply(PhaseTimer())                    # the target now lags the online network
    buf = io.BytesIO()
    torch.save(a.state(), buf)
    buf.seek(0)
    b = learner(seed=99)
    b.load_state(torch.load(buf, weights_only=True))
    assert b.digest() == a.digest()
    np.testing.assert_array_equal(b.target_params, a.target_params)
    for lrn in (a, b):
        lrn.gradient(random_batch(seed=3), PhaseTimer())
        lrn.apply(PhaseTimer())
    assert a.digest() == b.digest()
    b.flat.check_views()


def test_initial_priorities_use_the_online_network_and_its_max():
    lrn = learner()
    lrn.target_params[:] = 0.0               # must not matter
    batch = random_batch()
    got = lrn.initial_priorities(batch["obs"], batch["action"], batch["ret"], batch["disc"],
                                 batch["next_obs"])
    with torch.no_grad():
        q = lrn.model(batch["obs"])[torch.arange(16), batch["action"]]
        y = batch["ret"] + batch["disc"] * lrn.model(batch["next_obs"]).max(dim=1).values
    np.testing.assert_allclose(got, (q - y).abs().numpy(), rtol=1e-6)


def test_learner_fits_a_fixed_regression_target():
    lrn = learner(hidden=[16], lr=0.01, max_grad_norm=10.0)
    batch = random_batch(32)
    batch["disc"] = torch.zeros(32)          # y = ret: a plain regression
    losses = []
    for _ in range(150):
        parts, _ = lrn.gradient(batch, PhaseTimer())
        lrn.apply(PhaseTimer())
        losses.append(parts["value_loss"])
    assert losses[-1] < 0.2 * losses[0]


def test_transitions_of_an_actors_rollout_can_be_learned_from():
    envs = make_envs("CartPole-v1", 2, 11, kwargs={"max_episode_steps": 6})
    lrn = DqnLearner(config(), envs.single_observation_space, envs.single_action_space)
    actor = Actor(envs, 11)
    policy = EpsilonGreedy(lrn.model, 0.5, torch.Generator().manual_seed(0))
    ro = actor.collect(policy, 9, PhaseTimer())
    tr = lrn.transitions(ro, actor.obs)
    assert tr["obs"].shape == tr["next_obs"].shape == (18, 4)
    done = ro.dones.flatten().bool()
    assert done.any() and torch.all(tr["disc"][done] == 0)
    # the time limit's bootstrap value is in the return of the step it cut
    cut = ro.boot.flatten() != 0
    assert cut.any()
    torch.testing.assert_close(tr["ret"][cut], (ro.rewards + 0.99 * ro.boot).flatten()[cut])
    tr["weights"] = torch.ones(18)
    parts, td_abs = lrn.gradient(tr, PhaseTimer())
    assert np.isfinite(parts["value_loss"]) and td_abs.shape == (18,)
    envs.close()


# -- exploration -------------------------------------------------------------------------------
def test_apex_epsilon():
    assert apex_epsilon(0, 8) == pytest.approx(0.4)
    assert apex_epsilon(7, 8) == pytest.approx(0.4 ** 8)
    assert apex_epsilon(3, 7) == pytest.approx(0.4 ** (1 + 7 * 3 / 6))
    assert apex_epsilon(0, 1) == pytest.approx(0.4)
    assert apex_epsilon(0, 1, eps=0.1) == pytest.approx(0.1)
    values = [apex_epsilon(i, 16) for i in range(16)]
    assert values == sorted(values, reverse=True)
    with pytest.raises(ValueError):
        apex_epsilon(8, 8)


def test_epsilon_zero_is_greedy():
    lrn = learner()
    obs = torch.randn(64, 4)
    action, logp, value = EpsilonGreedy(lrn.model, 0.0, torch.Generator()).act(obs)
    with torch.no_grad():
        q = lrn.model(obs)
    assert action.dtype == torch.long and action.shape == (64,)
    torch.testing.assert_close(action, q.argmax(dim=1))
    torch.testing.assert_close(value, q.max(dim=1).values)
    torch.testing.assert_close(logp, torch.zeros(64))
    assert not value.requires_grad
    policy = EpsilonGreedy(lrn.model, 0.0, torch.Generator())
    torch.testing.assert_close(policy.value(obs), q.max(dim=1).values)


def test_epsilon_one_is_uniform_and_reproducible():
    lrn = learner()
    obs = torch.zeros(3000, 4)                # one greedy action everywhere
    draw = lambda seed: EpsilonGreedy(lrn.model, 1.0,  # noqa: E731
                                      torch.Generator().manual_seed(seed)).act(obs)[0]
    action = draw(1)
    counts = np.bincount(action.numpy(), minlength=3)
    assert np.all(np.abs(counts - 1000) < 150)
    torch.testing.assert_close(draw(1), action)
    assert not torch.equal(draw(2), action)
