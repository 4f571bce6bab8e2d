"""The learner part: a model, its flat parameter and gradient buffers, the loss, the
optimizer.  It turns experience into a gradient in ``grad`` and applies a gradient; it
never talks to other ranks (the designs decide where a gradient travels)."""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from .flat import FlatParams
from .losses import actor_critic_loss, gae, vtrace, vtrace_loss
from .model import ActorCritic
from .normalize import Moments, RewardNormalizer
from .optim import FlatAdam


@dataclass
class Batch:
    """One rollout ready to learn from, flattened over time and envs."""

    obs: torch.Tensor        # [T*E, obs_dim]
    actions: torch.Tensor    # [T*E] or [T*E, act_dim]
    returns: torch.Tensor    # [T*E] value targets
    advantages: torch.Tensor  # [T*E]
    logp_old: torch.Tensor   # [T*E] log-probability of the action when it was taken
    values: torch.Tensor | None = None   # [T*E] the values the actor saw (--clip-vloss)

    def __len__(self) -> int:
        return self.obs.shape[0]

    def take(self, index: torch.Tensor) -> "Batch":
        """The samples at ``index`` (a minibatch)."""
        return Batch(self.obs[index], self.actions[index], self.returns[index],
                     self.advantages[index], self.logp_old[index],
                     None if self.values is None else self.values[index])


class FlatLearner:
    """What every learner shares: a model in one flat parameter buffer (``self.flat``,
    a :class:`FlatParams`) and one optimizer over it (``self.opt``), built by the
    subclass; the flat views the topologies move, the clipped step, the digest."""

    cfg: object
    flat: FlatParams
    opt: FlatAdam

    @property
    def params(self) -> np.ndarray:
        """The parameters as one flat numpy buffer (what topologies move)."""
        return self.flat.param_np

    @property
    def wire(self) -> np.ndarray:
        """:attr:`params` and the state they act with (``--obs-norm``'s statistics), one
        contiguous buffer: what a rank hands another that acts with its policy; the same
        memory as :attr:`params` where nothing is carried."""
        return self.flat.wire_np

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """The tensors :attr:`params` and :attr:`grad` hold, in order."""
        return self.flat.shapes

    @property
    def grad(self) -> np.ndarray:
        """The gradient as one flat numpy buffer: ``backward()`` writes straight into it."""
        return self.flat.grad_np

    def clip_grad(self, max_norm: float) -> None:
        """Clip :attr:`grad` in place to ``max_norm`` (its global norm), where a design
        clips before it sends (sharded servers do not clip)."""
        torch.nn.utils.clip_grad_norm_([self.flat.flat], max_norm)

    def apply(self, timer, grad: np.ndarray | None = None) -> None:
        """Clip and apply the gradient in :attr:`grad` (already exchanged, if at all),
        or in ``grad``, another flat buffer of the same size, used in place (the
        parameter server's, holding a worker's push; clipping rescales it there)."""
        flat = self.flat.flat
        own = flat.grad
        if grad is not None:
            flat.grad = torch.from_numpy(grad)
        try:
            with timer("optimizer_s"):
                if self.cfg.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_([flat], self.cfg.max_grad_norm)
                self.opt.step()
        finally:
            flat.grad = own

    def param_digest(self) -> str:
        """SHA-256 of the parameters alone."""
        return hashlib.sha256(self.flat.param_np.tobytes()).hexdigest()

    def digest(self) -> str:
        """SHA-256 over the parameters and every tensor of the optimizer state."""
        return self._state_hash().hexdigest()

    def _state_hash(self):
        """The running SHA-256 of :meth:`digest` (a subclass may add to it)."""
        h = hashlib.sha256(self.flat.param_np.tobytes())
        for state in self.opt.state.values():
            for key in sorted(state):
                value = state[key]
                h.update(value.numpy().tobytes() if torch.is_tensor(value)
                         else repr(value).encode())
        return h


class Learner(FlatLearner):
    """An actor-critic replica with Adam over its one flat parameter buffer.

    Every rank builds it from the same seed, so every replica starts identical (a
    design broadcasts rank 0's parameters anyway)."""

    def __init__(self, cfg, obs_space, act_space) -> None:
        self.cfg = cfg
        self.obs_space, self.act_space = obs_space, act_space
        torch.manual_seed(cfg.seed)            # the same initial replica on every rank
        if cfg.model:                          # --model: the user's network
            from .custom import build

            self.model = build(cfg, obs_space, act_space)
        else:
            self.model = ActorCritic(obs_space, act_space, cfg.hidden, cfg.activation,
                                     cfg.layer_norm, init_log_std=cfg.init_log_std,
                                     obs_norm=cfg.obs_norm)
        norm = self.model.obs_norm     # its statistics travel with the parameters
        self.flat = FlatParams(self.model, carried=() if norm is None else
                               tuple(norm.buffers()))
        self.opt = FlatAdam(self.flat.flat, lr=cfg.lr, eps=cfg.adam_eps)
        #: --obs-norm: the statistics the model normalizes with, and the last batch's
        #: own (which the design merges, over the ranks that agree on them)
        self.obs_stats = Moments(self.model.obs_norm.mean.shape) if cfg.obs_norm else None
        self.batch_obs_stats: Moments | None = None
        self.reward_norm = (RewardNormalizer(cfg.num_envs, cfg.gamma) if cfg.reward_norm
                            else None)


    def batch(self, rollout) -> Batch:
        """Targets for a :class:`~mpirl.parts.actor.Rollout`: GAE advantages and returns
        (rewards divided by their standard deviation first, with ``--reward-scale``)."""
        cfg = self.cfg
        rewards = rollout.rewards
        if cfg.reward_scale:      # the book's trick: rewards divided by the batch's std
            rewards = rewards / (rewards.std() + 1e-8)
        if self.reward_norm is not None:    # PPO's: by the running return's std
            rewards = self.reward_norm(rewards, rollout.dones)
        if self.obs_stats is not None:
            self.observe(rollout.obs)
        # an episode cut by a time limit is not over: bootstrap from its last observation
        adv = gae(rewards + cfg.gamma * rollout.boot, rollout.values, rollout.dones,
                  rollout.last_value, cfg.gamma, cfg.gae_lambda)
        return Batch(obs=rollout.obs.flatten(0, 1), actions=rollout.actions.flatten(0, 1),
                     returns=(adv + rollout.values).flatten(), advantages=adv.flatten(),
                     logp_old=rollout.logp.flatten(), values=rollout.values.flatten())

    def minibatches(self, batch: Batch) -> list[Batch]:
        """``--minibatches`` shuffled parts of ``batch`` (torch's global generator draws
        the order), or ``batch`` itself, whole and unshuffled, when there is one."""
        parts = self.cfg.minibatches
        if parts == 1:
            return [batch]
        return [batch.take(index) for index in torch.randperm(len(batch)).chunk(parts)]

    def merge_obs_stats(self, parts: list[Moments]) -> None:
        """Add ``parts`` (batches' statistics, in the order every replica merges them)
        to the observation statistics, which the model normalizes with from now on."""
        total = Moments(self.obs_stats.mean.shape)
        for part in parts:
            total.merge(part)
        self.obs_stats.merge(total)
        self.model.obs_norm.load(self.obs_stats)

    def observe(self, obs: torch.Tensor) -> None:
        """Note the statistics of ``obs`` (``[..., obs...]``, a batch trained on), for
        :meth:`merge_batch_obs_stats`."""
        shape = self.obs_stats.mean.shape
        self.batch_obs_stats = Moments.of(obs.reshape(-1, *shape).numpy())

    def merge_batch_obs_stats(self, exchange=None) -> None:
        """The last batch's observation statistics merged into :attr:`obs_stats`: every
        rank's of ``exchange`` (a topology whose ranks trained on different batches; one
        Allgather of a flat float64 record, merged in rank order, so every rank holds
        the same bytes), or this rank's alone."""
        mine = self.batch_obs_stats.pack()
        if exchange is None:
            every = mine[None]
        else:
            every = np.empty((exchange.size, mine.size))
            exchange.collective(lambda c: c.Allgather(mine, every), "observation statistics")
        shape = self.obs_stats.mean.shape
        self.merge_obs_stats([Moments.unpack(row, shape) for row in every])

    def set_lr(self, lr: float) -> None:
        """The optimizer's learning rate from now on (``--anneal-lr``)."""
        for group in self.opt.param_groups:
            group["lr"] = lr

    def gradient(self, batch: Batch, timer) -> dict:
        """Loss on ``batch`` with the current parameters; the gradient lands in
        :attr:`grad`.  Returns the loss's parts (the log's loss columns)."""
        cfg = self.cfg
        return self._backward(timer, lambda: actor_critic_loss(
            self.model, batch, cfg.value_coef, cfg.entropy_coef, cfg.clip_ratio,
            norm_adv=cfg.norm_adv, clip_vloss=cfg.clip_vloss))

    def vtrace_gradient(self, unrolls, timer) -> dict:
        """IMPALA's V-trace loss on a batch of :class:`~mpirl.parts.unroll.Unrolls`
        (clipping thresholds ``--rho-bar``, ``--c-bar``, ``--pg-rho-bar``, 0 = none;
        ``--vtrace-lambda``); the gradient lands in :attr:`grad`."""
        cfg = self.cfg
        return self._backward(timer, lambda: vtrace_loss(
            self.model, unrolls, cfg.value_coef, cfg.entropy_coef,
            rho_bar=cfg.rho_bar or None, c_bar=cfg.c_bar or None,
            pg_rho_bar=cfg.pg_rho_bar or None, lam=cfg.vtrace_lambda))

    def _backward(self, timer, loss_and_parts) -> dict:
        with timer("backward_s"):
            self.flat.zero_grad()
            loss, parts = loss_and_parts()
            loss.backward()
        return parts


    def _state_hash(self):
        """The parameters, Adam's state and the observation statistics (replicas must
        agree on what they normalize with)."""
        h = super()._state_hash()
        if self.obs_stats is not None:
            h.update(self.obs_stats.pack().tobytes())
        return h

    def state(self) -> dict:
        # the wire: with the statistics the model acts with (a worker's are its server's)
        out = {"params": torch.from_numpy(self.flat.wire_np.copy()),
               "adam": copy.deepcopy(self.opt.state_dict())}   # not the live moments
        if self.obs_stats is not None:
            out["obs_stats"] = torch.from_numpy(self.obs_stats.pack())
        if self.reward_norm is not None:
            out["reward_norm"] = {k: torch.from_numpy(v)
                                  for k, v in self.reward_norm.state().items()}
        return out

    def load_state(self, state: dict) -> None:
        saved = state["params"].numpy()
        if saved.size not in (self.flat.param_np.size, self.flat.wire_np.size):
            raise ValueError(f"a checkpoint of {saved.size} parameters; this model has "
                             f"{self.flat.param_np.size}")
        self.flat.wire_np[:saved.size] = saved     # with the statistics, where saved
        if "adam" in state:           # an async worker's checkpoint holds no optimizer
            self.opt.load_state_dict(state["adam"])
        if self.obs_stats is not None:
            self.obs_stats = Moments.unpack(state["obs_stats"].numpy(),
                                            self.obs_stats.mean.shape)
            if saved.size < self.flat.wire_np.size:     # saved before they travelled
                self.model.obs_norm.load(self.obs_stats)
        if self.reward_norm is not None:
            self.reward_norm.load_state({k: v.numpy()
                                         for k, v in state["reward_norm"].items()})


__all__ = ["ActorCritic", "Batch", "FlatAdam", "FlatLearner", "FlatParams", "Learner",
           "actor_critic_loss", "gae", "vtrace", "vtrace_loss"]
