"""One rank's learner: its envs, its actor-critic replica, flat buffers and optimizer.

The modes (``mpirl/modes/``) decide when gradients travel and where they are applied;
a Replica only knows how to turn experience into a gradient in ``flat.grad_np`` and how
to apply a gradient that is there.  It never talks to other ranks.
"""

from __future__ import annotations

import hashlib
import time

import torch

from .a2c import Batch, Roller, actor_critic_loss, make_envs
from .config import Config
from .flat import FlatParams
from .model import ActorCritic


class Replica:
    """Envs + model + flat parameter/gradient buffers + Adam, seeded per rank."""

    def __init__(self, cfg: Config, rank: int, *, with_envs: bool = True) -> None:
        self.cfg = cfg
        self.rank = rank
        torch.manual_seed(cfg.seed)            # the same initial replica on every rank
        env_seed = cfg.seed + 10000 * rank
        self.envs = make_envs(cfg.env, cfg.num_envs, env_seed, cfg.action_repeat,
                              cfg.env_kwargs())
        self.model = ActorCritic(self.envs.single_observation_space,
                                 self.envs.single_action_space,
                                 cfg.hidden, cfg.activation, cfg.layer_norm)
        self.flat = FlatParams(self.model)
        self.opt = torch.optim.Adam([self.flat.flat], lr=cfg.lr)
        torch.manual_seed(env_seed)            # each rank samples its own actions
        self.roller = None
        if with_envs:
            self.roller = Roller(self.envs, cfg.gamma, cfg.gae_lambda, cfg.reward_scale)
            self.roller.start(env_seed)
        else:
            self.envs.close()
        self.slowdown = cfg.slowdown_of(rank)
        #: env steps in one batch (one update's experience on this rank).
        self.steps_per_batch = cfg.num_envs * cfg.rollout_steps * cfg.action_repeat

    def collect(self, timer) -> Batch:
        """One rollout; a straggler then idles (factor - 1) times as long as it took."""
        start = time.perf_counter()
        batch = self.roller.collect(self.model, self.cfg.rollout_steps, timer)
        if self.slowdown > 1.0:
            with timer("straggle_s"):
                time.sleep((self.slowdown - 1.0) * (time.perf_counter() - start))
        return batch

    def gradient(self, batch: Batch, timer) -> dict:
        """Loss on ``batch`` with the current parameters; gradient lands in ``flat.grad_np``."""
        with timer("backward_s"):
            self.flat.zero_grad()
            loss, info = actor_critic_loss(self.model, batch, self.cfg.value_coef,
                                           self.cfg.entropy_coef, self.cfg.clip_ratio)
            loss.backward()
        return info

    def apply(self, timer) -> None:
        """Clip and apply the gradient in ``flat.grad_np`` (already exchanged, if at all)."""
        with timer("optimizer_s"):
            if self.cfg.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_([self.flat.flat], self.cfg.max_grad_norm)
            self.opt.step()

    def param_digest(self) -> str:
        """SHA-256 of the parameters alone."""
        return hashlib.sha256(self.flat.param_np.tobytes()).hexdigest()

    def digest(self) -> str:
        """SHA-256 over the parameters and every tensor of the optimizer state."""
        h = hashlib.sha256(self.flat.param_np.tobytes())
        for state in self.opt.state.values():
            for key in sorted(state):
                value = state[key]
                h.update(value.numpy().tobytes() if torch.is_tensor(value)
                         else repr(value).encode())
        return h.hexdigest()
