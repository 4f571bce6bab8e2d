"""PPO's options (CleanRL's ppo_continuous_action) are checked at start, each with one
line naming the flag, its value and what is allowed; the reference configuration loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpirl.config import Config, ConfigError, parse_args

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("fields,message", [
    ({"minibatches": 0}, r"minibatches=0"),
    ({"minibatches": 7, "rollout_steps": 16, "num_envs": 4},
     r"minibatches=7 does not divide a rank's batch of 64 steps .* a divisor of 64"),
    ({"clip_vloss": True}, r"clip_vloss=True clips by --clip-ratio, which is 0"),
    ({"reward_norm": True, "reward_scale": True}, r"allowed: one of them"),
    ({"init_log_std": 9.0}, r"init_log_std=9.0"),
    ({"mode": "gorila", "obs_norm": True},
     r"obs_norm=True is not taken by mode='gorila'; allowed with mode sync, async, quorum, "
     r"impala, seed, ga3c$"),
    ({"mode": "async", "topology": "star", "servers": 2, "obs_norm": True},
     r"obs_norm=True with servers=2: sharded servers hold no whole statistics"),
    ({"mode": "async", "topology": "star", "minibatches": 2},
     r"minibatches=2 is not taken by mode='async'; allowed with mode sync$"),
    ({"mode": "apex", "reward_scale": True},
     r"reward_scale=True is not taken by mode='apex'; allowed with mode sync, async, quorum$"),
    ({"mode": "sync-replay", "env": "Pendulum-v1", "sac_reward_scale": 0.0},
     r"sac_reward_scale=0.0"),
    ({"mode": "gorila", "sac_reward_scale": 5.0},
     r"sac_reward_scale=5.0 is an option of SAC; env='CartPole-v1' has a Discrete action"),
    ({"mode": "seed", "norm_adv": True},
     r"norm_adv=True is not taken by mode='seed'; allowed with mode sync, async, quorum$"),
])
def test_bad_ppo_options_are_named(fields, message):
    with pytest.raises(ConfigError, match=message):
        Config(**fields).validate(world_size=3)


def test_loss_options_are_taken_by_the_parameter_server_designs():
    Config(mode="async", topology="star", norm_adv=True, clip_vloss=True,
           clip_ratio=0.2).validate(world_size=3)


def test_the_reference_configuration_is_cleanrls():
    cfg = parse_args(["--config", str(ROOT / "experiments" / "hopper_ppo.yaml")])
    cfg.validate(world_size=2)
    # per averaged update: 2 ranks x 1024 / 32 = 64 samples; 10 epochs; CleanRL's flags
    assert 2 * cfg.rollout_steps * cfg.num_envs // cfg.minibatches == 64
    assert (cfg.update_repeat, cfg.lr, cfg.clip_ratio, cfg.entropy_coef) == (10, 3e-4, 0.2, 0)
    assert cfg.norm_adv and cfg.obs_norm and cfg.reward_norm and cfg.anneal_lr
    assert cfg.clip_vloss and cfg.init_log_std == 0.0 and cfg.max_grad_norm == 0.5
    assert cfg.adam_eps == 1e-5
