"""Ape-X's (and Gorila's) learner: n-step double DQN over a Q-network.

:class:`DqnLearner` mirrors :class:`~mpirl.parts.learner.Learner` (one flat parameter
and gradient buffer, Adam over it, ``apply`` with gradient clipping, digests, state), so
a design can move its parameters and gradients alike; it adds a target network (a second
flat buffer, :meth:`~DqnLearner.sync_target`) and hands back each sample's ``|td|`` as
its new replay priority.  :class:`EpsilonGreedy` is the matching actor policy and
:func:`apex_epsilon` Ape-X's per-actor exploration schedule.
"""

from __future__ import annotations

import copy

import gymnasium
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import FlatLearner
from .flat import FlatParams
from .model import mlp
from .optim import FlatAdam


class QNetwork(nn.Module):
    """An MLP from observations to one Q-value per discrete action; with ``dueling``, a
    shared torso (the hidden layers) then value and advantage heads, Q = V + A - mean A."""

    def __init__(self, obs_space: gymnasium.Space, act_space: gymnasium.Space,
                 hidden: list[int], activation: str = "relu", layer_norm: bool = False,
                 dueling: bool = False) -> None:
        super().__init__()
        if not isinstance(act_space, gymnasium.spaces.Discrete):
            raise ValueError(f"action space {act_space} is not supported by a Q-network; "
                             "allowed: Discrete")
        obs_dim = int(np.prod(obs_space.shape))
        self.n_actions = int(act_space.n)
        self.dueling = dueling
        if dueling:
            if not hidden:
                raise ValueError("a dueling Q-network needs a hidden layer; allowed: "
                                 "a non-empty hidden")
            # every hidden layer with its activation: mlp's layers less its output head
            self.torso = nn.Sequential(
                *list(mlp(obs_dim, hidden, 1, activation, layer_norm, out_gain=1.0))[:-1])
            self.value_head = mlp(hidden[-1], [], 1, activation, layer_norm, out_gain=1.0)
            self.advantage_head = mlp(hidden[-1], [], self.n_actions, activation, layer_norm,
                                      out_gain=1.0)
        else:
            self.q = mlp(obs_dim, hidden, self.n_actions, activation, layer_norm, out_gain=1.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values ``[B, n_actions]`` of observations ``[B, obs...]``."""
        x = obs.flatten(1)
        if not self.dueling:
            return self.q(x)
        h = self.torso(x)
        adv = self.advantage_head(h)
        return self.value_head(h) + adv - adv.mean(dim=1, keepdim=True)


def nstep_transitions(obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor,
                      dones: torch.Tensor, last_obs: torch.Tensor, n: int,
                      gamma: float) -> dict[str, torch.Tensor]:
    """The n-step transition starting at every step of one rollout of ``T`` steps of
    ``E`` envs, flattened time-major (row ``t * E + e``).

    ``ret`` sums ``gamma^k r_{t+k}`` over ``m = min(n, T - t, steps to the episode's end
    inclusive)`` steps; ``disc`` is ``gamma^m``, or 0 when the episode ended within them;
    ``next_obs`` is ``obs[t + m]`` (``last_obs``, the observation after the rollout, when
    ``t + m == T``).  Steps near the rollout's end bootstrap after fewer than ``n`` steps,
    so none is lost and nothing of the next rollout is needed.  ``rewards`` already hold
    ``gamma * value`` at time-limit cuts; ``dones`` are 1 where an episode ended."""
    if n < 1:
        raise ValueError(f"n={n}; allowed: n >= 1")
    steps, envs = rewards.shape
    r = rewards.double()
    ended_at = dones.bool()
    ret = torch.zeros(steps, envs, dtype=torch.float64)
    m = torch.zeros(steps, envs, dtype=torch.long)
    alive = torch.ones(steps, envs, dtype=torch.bool)     # still summing rewards
    ended = torch.zeros(steps, envs, dtype=torch.bool)    # the episode ended within m steps
    for k in range(min(n, steps)):
        rows = steps - k                                   # the t with t + k < T
        live = alive[:rows]
        ret[:rows] += torch.where(live, (gamma ** k) * r[k:], 0.0)
        m[:rows] += live.long()
        ended[:rows] |= live & ended_at[k:]
        alive[:rows] = live & ~ended_at[k:]
    disc = torch.where(ended, 0.0, torch.pow(torch.tensor(float(gamma), dtype=torch.float64),
                                              m.double()))
    nxt = torch.arange(steps).unsqueeze(1) + m             # in [1, T]; T is last_obs
    padded = torch.cat([obs, last_obs.unsqueeze(0).to(obs.dtype)])
    next_obs = padded[nxt, torch.arange(envs).unsqueeze(0)]
    return {"obs": obs.flatten(0, 1), "action": actions.flatten(0, 1),
            "ret": ret.to(rewards.dtype).flatten(), "disc": disc.to(rewards.dtype).flatten(),
            "next_obs": next_obs.flatten(0, 1)}


def _double_dqn_terms(online: nn.Module, target: nn.Module, obs, action, ret, disc, next_obs,
                      weights=None):
    """(loss, td detached, Q of the taken actions detached)."""
    q = online(obs).gather(1, action.long().unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        best = online(next_obs).argmax(dim=1, keepdim=True)
        y = ret + disc * target(next_obs).gather(1, best).squeeze(1)
    per_sample = F.smooth_l1_loss(q, y, reduction="none", beta=1.0)
    loss = per_sample.mean() if weights is None else (weights * per_sample).mean()
    return loss, (q - y).detach(), q.detach()


def double_dqn_loss(online: nn.Module, target: nn.Module, obs: torch.Tensor,
                    action: torch.Tensor, ret: torch.Tensor, disc: torch.Tensor,
                    next_obs: torch.Tensor, weights: torch.Tensor | None = None):
    """Double DQN on n-step transitions: ``y = ret + disc * Q_target(s')[argmax_a
    Q_online(s')]`` (no gradient through ``y``), ``td = Q_online(s)[a] - y``, loss the
    ``weights``-weighted mean Huber (delta 1) of ``td``.  Returns ``(loss, td)``, ``td``
    detached."""
    loss, td, _ = _double_dqn_terms(online, target, obs, action, ret, disc, next_obs, weights)
    return loss, td


class DqnLearner(FlatLearner):
    """A Q-network replica and its target network, each one flat buffer, with Adam over
    the online one; built from ``cfg.seed`` so every rank starts identical."""

    def __init__(self, cfg, obs_space, act_space) -> None:
        self.cfg = cfg
        self.obs_space, self.act_space = obs_space, act_space
        torch.manual_seed(cfg.seed)            # the same initial replica on every rank

        def build() -> QNetwork:
            return QNetwork(obs_space, act_space, cfg.hidden, cfg.activation, cfg.layer_norm,
                            bool(cfg.dueling))

        self.model = build()
        self.flat = FlatParams(self.model)
        self.target = build()                  # its initial values are overwritten
        self.target_flat = FlatParams(self.target)
        self.target.requires_grad_(False)
        self.sync_target()
        self.opt = FlatAdam(self.flat.flat, lr=cfg.lr)
        self.n_step, self.gamma = int(cfg.n_step), float(cfg.gamma)

    #: what a transition's action is: an index
    action_shape: tuple[int, ...] = ()

    @property
    def target_params(self) -> np.ndarray:
        """The target network's parameters as one flat numpy buffer."""
        return self.target_flat.param_np

    def sync_target(self) -> None:
        """Copy the online parameters into the target network."""
        self.target_flat.param_np[:] = self.flat.param_np

    def update_target(self, version: int) -> None:
        """After update ``version``: the target is copied every ``--target-update``."""
        if version % self.cfg.target_update == 0:
            self.sync_target()

    def actor_policy(self, index: int, n_actors: int, generator: torch.Generator):
        """Actor ``index`` of ``n_actors`` acts epsilon-greedily with Ape-X's epsilon."""
        return EpsilonGreedy(self.model, apex_epsilon(index, n_actors, self.cfg.apex_eps,
                                                      self.cfg.apex_eps_alpha), generator)

    def transitions(self, rollout, last_obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """The ``cfg.n_step`` transitions of a :class:`~mpirl.parts.actor.Rollout`
        (``last_obs``: the actor's observation after it, ``Actor.obs``); a step cut by a
        time limit bootstraps from the value of its final observation, as in
        :meth:`Learner.batch <mpirl.parts.learner.Learner.batch>`."""
        return nstep_transitions(rollout.obs, rollout.actions,
                                 rollout.rewards + self.gamma * rollout.boot, rollout.dones,
                                 last_obs, self.n_step, self.gamma)

    def gradient(self, batch: dict, timer) -> tuple[dict, np.ndarray]:
        """Double-DQN loss on ``batch`` (keys obs, action, ret, disc, next_obs and
        optionally weights, the importance-sampling weights); the gradient lands in
        :attr:`grad`.  Returns the loss's parts and each sample's ``|td|`` (its new
        priority)."""
        with timer("backward_s"):
            self.flat.zero_grad()
            loss, td, q = _double_dqn_terms(
                self.model, self.target, batch["obs"], batch["action"], batch["ret"],
                batch["disc"], batch["next_obs"], batch.get("weights"))
            loss.backward()
        td_abs = td.abs()
        parts = {"value_loss": float(loss.detach()), "td_abs_mean": float(td_abs.mean()),
                 "q_mean": float(q.mean())}
        return parts, td_abs.numpy()

    @torch.no_grad()
    def initial_priorities(self, obs, action, ret, disc, next_obs) -> np.ndarray:
        """``|td|`` with the online network alone, ``y = ret + disc * max_a Q(s')``: what
        an Ape-X actor computes for the transitions it adds to the replay."""
        q = self.model(obs).gather(1, action.long().unsqueeze(1)).squeeze(1)
        y = ret + disc * self.model(next_obs).max(dim=1).values
        return (q - y).abs().numpy()


    def digest(self) -> str:
        """SHA-256 over the online parameters, every tensor of the optimizer state and
        the target parameters."""
        h = self._state_hash()
        h.update(self.target_flat.param_np.tobytes())
        return h.hexdigest()

    def state(self) -> dict:
        return {"params": torch.from_numpy(self.flat.param_np.copy()),
                "target": torch.from_numpy(self.target_flat.param_np.copy()),
                "adam": copy.deepcopy(self.opt.state_dict())}   # not the live moments

    def load_state(self, state: dict) -> None:
        """Continue from :meth:`state`; without ``target`` the target is synced to the
        loaded parameters, without ``adam`` the optimizer is kept."""
        self.flat.param_np[:] = state["params"].numpy()
        if "target" in state:
            self.target_flat.param_np[:] = state["target"].numpy()
        else:
            self.sync_target()
        if "adam" in state:
            self.opt.load_state_dict(state["adam"])


def apex_epsilon(i: int, n: int, eps: float = 0.4, alpha: float = 7.0) -> float:
    """Ape-X's exploration of actor ``i`` of ``n``: ``eps ** (1 + alpha * i / (n - 1))``
    (``eps`` when there is one actor)."""
    if not 0 <= i < n:
        raise ValueError(f"actor i={i} of n={n}; allowed: 0 <= i < n")
    if n == 1:
        return float(eps)
    return float(eps ** (1.0 + alpha * i / (n - 1)))


class EpsilonGreedy:
    """An actor's policy over a Q-network: a uniformly random action with probability
    ``epsilon``, else the greedy one; coins and random actions come from ``generator``,
    so a seed gives the same choices.  Its value is ``max_a Q`` and its ``logp`` zero."""

    def __init__(self, model: nn.Module, epsilon: float, generator: torch.Generator) -> None:
        self.model = model
        self.epsilon = float(epsilon)
        self.generator = generator

    @torch.no_grad()
    def act(self, obs: torch.Tensor):
        q = self.model(obs)
        envs, n_actions = q.shape
        best = q.max(dim=1)
        # always draw both, so the generator advances the same whatever epsilon is
        coin = torch.rand(envs, generator=self.generator) < self.epsilon
        random = torch.randint(n_actions, (envs,), generator=self.generator)
        action = torch.where(coin, random, best.indices)
        return action, torch.zeros(envs), best.values

    @torch.no_grad()
    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.model(obs).max(dim=1).values


__all__ = ["DqnLearner", "EpsilonGreedy", "QNetwork", "apex_epsilon", "double_dqn_loss",
           "nstep_transitions"]
