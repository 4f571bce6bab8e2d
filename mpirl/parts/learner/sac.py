"""The replay designs' learner for Box action spaces: soft actor-critic (Haarnoja et al.
2018, "Soft Actor-Critic Algorithms and Applications") with automatic temperature, on
n-step transitions.

The reference is stable-baselines3's SAC as rl-baselines3-zoo runs it on MuJoCo: a
tanh-squashed Gaussian policy (log std clamped to [-20, 2]), two Q-networks and their
Polyak-averaged targets (``--tau``), the temperature ``alpha`` learnt towards the target
entropy ``-dim(A)`` (``--target-entropy`` 0) from ``--init-alpha``, one learning rate.
Actions are in the env's scale (``tanh(u) * scale + bias``), as CleanRL's
``sac_continuous_action`` has them, so transitions need no conversion.  The book's tricks
for Learning to Run: ``--sac-reward-scale`` multiplies the rewards (SAC v1's reward scale:
with rewards of a few hundredths per step, as L2Run's, the entropy term would otherwise
drown them) and ``--layer-norm`` normalizes every hidden layer of all three networks.

:class:`SacLearner` has :class:`~mpirl.parts.learner.dqn.DqnLearner`'s interface (one
flat parameter and gradient buffer over actor, critics and ``log alpha``; a target flat
buffer; ``gradient`` returning each sample's ``|td|`` as its priority), so apex and
gorila run it unchanged.  Its one gradient holds the three losses at once, each on its
own parameters: the critics' on the Q-networks (targets without gradient), the actor's
on the policy (the critics frozen while it is built), the temperature's on ``log alpha``;
one Adam step applies them, so the gradient is one buffer that a topology or a server
moves whole.  (SB3 steps the critics first and the actor on the stepped critics; here
both see the same parameters, as every gradient a design exchanges must.)
"""

from __future__ import annotations

import copy
import math
from contextlib import contextmanager

import gymnasium
import numpy as np
import torch
from torch import nn

from . import FlatLearner
from .flat import FlatParams
from .model import mlp
from .optim import FlatAdam

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


class SacNet(nn.Module):
    """Policy, two critics and the log temperature, in that parameter order."""

    def __init__(self, obs_space: gymnasium.Space, act_space: gymnasium.Space,
                 hidden: list[int], activation: str = "relu", init_alpha: float = 1.0,
                 layer_norm: bool = False) -> None:
        super().__init__()
        if not isinstance(act_space, gymnasium.spaces.Box):
            raise ValueError(f"action space {act_space} is not supported by SAC; allowed: Box")
        obs_dim = int(np.prod(obs_space.shape))
        self.act_dim = int(np.prod(act_space.shape))
        self.policy = mlp(obs_dim, hidden, 2 * self.act_dim, activation, layer_norm,
                          out_gain=0.01)
        self.q1 = mlp(obs_dim + self.act_dim, hidden, 1, activation, layer_norm, out_gain=1.0)
        self.q2 = mlp(obs_dim + self.act_dim, hidden, 1, activation, layer_norm, out_gain=1.0)
        self.log_alpha = nn.Parameter(torch.tensor([math.log(init_alpha)]))
        low, high = (torch.as_tensor(b, dtype=torch.float32).flatten()
                     for b in (act_space.low, act_space.high))
        self.register_buffer("scale", (high - low) / 2.0)
        self.register_buffer("bias", (high + low) / 2.0)

    def gaussian(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.policy(obs.flatten(1)).chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def squash(self, u: torch.Tensor) -> torch.Tensor:
        return torch.tanh(u) * self.scale + self.bias

    def sample(self, obs: torch.Tensor, noise: torch.Tensor | None = None):
        """A reparameterized action in the env's scale and its log-probability
        (``noise``: the standard normal draw; drawn with torch's generator if None)."""
        mean, log_std = self.gaussian(obs)
        std = log_std.exp()
        eps = torch.randn_like(mean) if noise is None else noise
        u = mean + std * eps
        logp = (-0.5 * eps.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        # the change of variables of a = tanh(u) * scale + bias (SB3's epsilon 1e-6)
        tanh = torch.tanh(u)
        logp = logp - torch.log(self.scale * (1 - tanh.pow(2)) + 1e-6).sum(-1)
        return tanh * self.scale + self.bias, logp

    def q(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs.flatten(1), action.flatten(1)], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The policy's mean action, squashed (no exploration)."""
        return self.squash(self.gaussian(obs)[0])


@contextmanager
def frozen(*modules: nn.Module):
    """``modules``' parameters take no gradient from what is built inside."""
    params = [p for m in modules for p in m.parameters()]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def sac_terms(online: SacNet, target: SacNet, batch: dict, target_entropy: float):
    """The three losses on ``batch`` (obs, action, ret, disc, next_obs, weights) and
    ``|td|`` per sample: ``y = ret + disc (min Q_targ(s', a') - alpha log pi(a'|s'))``
    with ``a' ~ pi(s')``; critics ``0.5 E_w[(Q1 - y)^2 + (Q2 - y)^2]``; actor
    ``E[alpha log pi(a|s) - min Q(s, a)]`` with ``a ~ pi(s)``; temperature
    ``-E[log alpha (log pi(a|s) + target_entropy)]``."""
    obs, action, weights = batch["obs"], batch["action"], batch.get("weights")
    alpha = online.log_alpha.exp().detach()
    with torch.no_grad():
        next_action, next_logp = online.sample(batch["next_obs"])
        next_q = torch.min(*target.q(batch["next_obs"], next_action))
        y = batch["ret"] + batch["disc"] * (next_q - alpha * next_logp)
    q1, q2 = online.q(obs, action)
    per_sample = (q1 - y).pow(2) + (q2 - y).pow(2)
    critic = 0.5 * (per_sample.mean() if weights is None else (weights * per_sample).mean())
    with frozen(online.q1, online.q2):
        new_action, logp = online.sample(obs)
        actor = (alpha * logp - torch.min(*online.q(obs, new_action))).mean()
    temperature = -(online.log_alpha * (logp.detach() + target_entropy)).mean()
    td = 0.5 * ((q1 - y).abs() + (q2 - y).abs()).detach()
    return critic, actor, temperature, td, logp.detach()


class SacLearner(FlatLearner):
    """A SAC replica (:class:`SacNet`) and its target, each one flat buffer, with Adam
    over the online one; built from ``cfg.seed`` so every rank starts identical."""

    def __init__(self, cfg, obs_space, act_space) -> None:
        self.cfg = cfg
        self.obs_space, self.act_space = obs_space, act_space
        torch.manual_seed(cfg.seed)

        def build() -> SacNet:
            return SacNet(obs_space, act_space, cfg.hidden, cfg.activation, cfg.init_alpha,
                          cfg.layer_norm)

        self.model = build()
        self.flat = FlatParams(self.model)
        self.target = build()
        self.target_flat = FlatParams(self.target)
        self.target.requires_grad_(False)
        self.sync_target()
        self.opt = FlatAdam(self.flat.flat, lr=cfg.lr)
        self.n_step, self.gamma, self.tau = int(cfg.n_step), float(cfg.gamma), float(cfg.tau)
        self.target_entropy = (float(cfg.target_entropy) if cfg.target_entropy
                               else -float(self.model.act_dim))
        self.reward_scale = float(cfg.sac_reward_scale)

    #: what a transition's action is: a vector of the env's scale
    @property
    def action_shape(self) -> tuple[int, ...]:
        return (self.model.act_dim,)

    @property
    def target_params(self) -> np.ndarray:
        return self.target_flat.param_np

    def sync_target(self) -> None:
        """Copy the online parameters into the target."""
        self.target_flat.param_np[:] = self.flat.param_np

    def update_target(self, version: int) -> None:
        """After every update: ``target <- (1 - tau) target + tau online``."""
        target = self.target_flat.param_np
        target *= 1.0 - self.tau
        target += self.tau * self.flat.param_np

    def transitions(self, rollout, last_obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """n-step transitions of a rollout, rewards multiplied by ``--sac-reward-scale``
        (the replay holds the scaled returns)."""
        from .dqn import nstep_transitions
        rewards = rollout.rewards + self.gamma * rollout.boot
        if self.reward_scale != 1.0:
            rewards = rewards * self.reward_scale
        return nstep_transitions(rollout.obs, rollout.actions, rewards, rollout.dones,
                                 last_obs, self.n_step, self.gamma)

    def gradient(self, batch: dict, timer) -> tuple[dict, np.ndarray]:
        """The three losses' gradients in :attr:`grad` (each on its own parameters);
        returns their values, ``alpha`` and ``q_mean``, and each sample's ``|td|``."""
        with timer("backward_s"):
            self.flat.zero_grad()
            critic, actor, temperature, td, logp = sac_terms(self.model, self.target, batch,
                                                             self.target_entropy)
            (critic + actor + temperature).backward()
        parts = {"value_loss": float(critic.detach()), "policy_loss": float(actor.detach()),
                 "entropy": float(-logp.mean()), "td_abs_mean": float(td.mean()),
                 "alpha": float(self.model.log_alpha.detach().exp())}
        return parts, td.numpy()

    @torch.no_grad()
    def initial_priorities(self, obs, action, ret, disc, next_obs) -> np.ndarray:
        """``|td|`` an actor computes with its own copy (no target, the mean action at
        ``s'``, no entropy term): ``y = ret + disc min Q(s', mu(s'))``."""
        q1, q2 = self.model.q(obs, action)
        y = ret + disc * torch.min(*self.model.q(next_obs, self.model.greedy(next_obs)))
        return (0.5 * ((q1 - y).abs() + (q2 - y).abs())).numpy()

    def actor_policy(self, index: int, n_actors: int, generator: torch.Generator):
        """Every actor samples from the policy (SAC explores by its entropy)."""
        return SacPolicy(self.model, generator)

    def digest(self) -> str:
        h = self._state_hash()
        h.update(self.target_flat.param_np.tobytes())
        return h.hexdigest()

    def state(self) -> dict:
        return {"params": torch.from_numpy(self.flat.param_np.copy()),
                "target": torch.from_numpy(self.target_flat.param_np.copy()),
                "adam": copy.deepcopy(self.opt.state_dict())}

    def load_state(self, state: dict) -> None:
        self.flat.param_np[:] = state["params"].numpy()
        self.target_flat.param_np[:] = (state["target"] if "target" in state
                                        else state["params"]).numpy()
        if "adam" in state:
            self.opt.load_state_dict(state["adam"])


class SacPolicy:
    """An actor's policy over a :class:`SacNet`: actions sampled from the squashed
    Gaussian, the noise drawn from ``generator`` (a seed gives the same choices); its
    value is ``min Q(s, mu(s))`` (a time limit's bootstrap), its ``logp`` zero."""

    def __init__(self, model: SacNet, generator: torch.Generator) -> None:
        self.model, self.generator = model, generator

    @torch.no_grad()
    def act(self, obs: torch.Tensor):
        mean, log_std = self.model.gaussian(obs)
        noise = torch.randn(mean.shape, generator=self.generator)
        action = self.model.squash(mean + log_std.exp() * noise)
        return action, torch.zeros(len(obs)), torch.zeros(len(obs))

    @torch.no_grad()
    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.min(*self.model.q(obs, self.model.greedy(obs)))


__all__ = ["SacLearner", "SacNet", "SacPolicy", "sac_terms"]
