"""Unroll records: one contiguous record per unroll, packed from a rollout and batched
for V-trace; SEED's assembler builds the same records from one request per step."""

from __future__ import annotations

import gymnasium
import numpy as np
import torch

from mpirl.parts.actor import Rollout
from mpirl.parts.unroll import UNROLL_META, UnrollAssembler, UnrollLayout, batch_unrolls

OBS = gymnasium.spaces.Box(-1.0, 1.0, (3,))
ACT = gymnasium.spaces.Discrete(2)


def make_rollout(steps, envs, seed):
    g = torch.Generator().manual_seed(seed)
    return Rollout(obs=torch.randn(steps, envs, 3, generator=g),
                   actions=torch.randint(0, 2, (steps, envs), generator=g),
                   logp=torch.randn(steps, envs, generator=g),
                   values=torch.zeros(steps, envs),
                   rewards=torch.randn(steps, envs, generator=g),
                   dones=(torch.rand(steps, envs, generator=g) < 0.3).float(),
                   boot=torch.randn(steps, envs, generator=g), last_value=torch.zeros(envs))


def test_a_record_is_one_contiguous_buffer_of_the_stated_size():
    layout = UnrollLayout(5, 2, OBS, ACT)
    record = layout.empty()
    assert record.flags.c_contiguous and record.nbytes == layout.nbytes
    # meta (11 f8, the last the actor's waiting share) + obs 6x2x3 f4 + actions 5x2 i8 +
    # 4 arrays of 5x2 f4
    assert layout.nbytes == 11 * 8 + 36 * 4 + 10 * 8 + 4 * 10 * 4
    continuous = UnrollLayout(5, 2, OBS, gymnasium.spaces.Box(-1, 1, (4,)))
    assert continuous.empty()[0]["actions"].shape == (5, 2, 4)


def test_pack_then_bytes_then_batch_gives_back_the_rollout():
    layout = UnrollLayout(4, 2, OBS, ACT)
    rollouts = [make_rollout(4, 2, s) for s in (1, 2)]
    records = []
    for i, rollout in enumerate(rollouts):
        record = layout.empty()
        layout.pack(record, rollout, last_obs=torch.full((2, 3), float(i)))
        record[0]["meta"][UNROLL_META["version"]] = 7 + i
        raw = record.view(np.uint8).copy()          # what travels
        records.append(layout.view(raw))
    gamma = 0.9
    u = batch_unrolls(records, gamma)
    assert u.obs.shape == (5, 4, 3) and u.actions.shape == (4, 4)
    torch.testing.assert_close(u.obs[:4, 2:], rollouts[1].obs)
    assert (u.obs[4, :2] == 0.0).all() and (u.obs[4, 2:] == 1.0).all()   # bootstrap obs
    torch.testing.assert_close(u.actions[:, :2], rollouts[0].actions)
    torch.testing.assert_close(u.rewards[:, 2:], rollouts[1].rewards + gamma * rollouts[1].boot)
    torch.testing.assert_close(u.discounts[:, :2], gamma * (1 - rollouts[0].dones))
    assert list(u.versions) == [7, 8]


def test_the_assembler_makes_the_unroll_the_actor_saw():
    """Requests carry obs_k and (r_{k-1}, d_{k-1}); unrolls of T=3 steps overlap by one
    observation, and the episode tracked from the rewards is the actor's."""
    layout = UnrollLayout(3, 2, OBS, ACT)
    asm = UnrollAssembler(layout, [5], env_steps_per_step=2)
    g = np.random.default_rng(0)
    obs = [g.normal(size=(2, 3)).astype(np.float32) for _ in range(8)]
    rewards = [np.full(2, float(k), dtype=np.float32) for k in range(8)]
    dones = [np.array([k == 4, 0], dtype=np.float32) for k in range(8)]
    out = []
    for k in range(7):
        done = asm.step(5, obs[k], rewards[k - 1] if k else None, dones[k - 1] if k else None,
                        first=k == 0, action=np.array([k % 2, 1]),
                        logp=np.full(2, -k, dtype=np.float32), version=10 + k)
        if done is not None:
            out.append(done[0])
    assert len(out) == 2                       # requests 3 and 6 completed one each
    first, second = out
    np.testing.assert_array_equal(first["obs"], np.stack(obs[0:4]))
    np.testing.assert_array_equal(second["obs"], np.stack(obs[3:7]))
    np.testing.assert_array_equal(first["rewards"][:, 0], [0, 1, 2])
    np.testing.assert_array_equal(second["dones"][:, 0], [0, 1, 0])   # step 4 ended it
    m = UNROLL_META
    assert first["meta"][m["version"]] == 10 and second["meta"][m["version"]] == 13
    assert first["meta"][m["index"]] == 1 and second["meta"][m["env_steps"]] == 6
    # env 0's episode: steps 0..4, rewards 0+1+2+3+4
    assert asm.drain_episodes(5) == [(10.0, 5)]
