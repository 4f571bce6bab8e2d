"""What the learner optimises: returns and advantages, and the actor-critic loss.

Pure functions of tensors, checked in one process against direct evaluations of their
formulas (``tests/parts/test_losses.py``).
"""

from __future__ import annotations

import math

import torch


def gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor,
        last_value: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Generalised advantage estimates ``A_t`` (Schulman et al. 2016) over ``[T, E]``.

    ``delta_t = r_t + gamma V_{t+1} (1 - d_t) - V_t`` and
    ``A_t = delta_t + gamma lam (1 - d_t) A_{t+1}``, where ``d_t = 1`` when the episode
    ended at step t (the env reset in that same step, so ``V_{t+1}`` is of a new
    episode), and ``V_T`` is ``last_value``.  ``lam = 1`` gives plain n-step returns
    minus the values; the returns (the value target) are ``A + V``."""
    adv = torch.zeros_like(rewards)
    running = torch.zeros_like(last_value)
    next_value = last_value
    for t in reversed(range(rewards.shape[0])):
        live = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_value * live - values[t]
        running = delta + gamma * lam * live * running
        adv[t] = running
        next_value = values[t]
    return adv


def actor_critic_loss(model, batch, value_coef: float, entropy_coef: float,
                      clip_ratio: float = 0.0) -> tuple[torch.Tensor, dict]:
    """Policy-gradient loss with advantages, value regression, entropy bonus.

    ``clip_ratio`` 0 gives A2C's ``-logp * A``; above 0, PPO's clipped surrogate
    ``-min(r A, clip(r, 1-e, 1+e) A)`` with ``r = exp(logp - logp_old)``, the objective of
    DPPO (Heess et al. 2017), whose repeated updates on one batch (``update_repeat``)
    it keeps close to the policy that collected it.

    Returns the loss and its parts as numbers: ``policy_loss``, ``value_loss``,
    ``entropy`` and, with the clipped objective, ``approx_kl``, the estimate
    ``E[(r - 1) - log r]`` of KL(pi_old || pi) (unbiased and never negative; NaN without
    clipping, where there is no old policy to compare with)."""
    dist, value = model(batch.obs)
    logp = dist.log_prob(batch.actions)
    approx_kl = math.nan
    if clip_ratio > 0:
        log_ratio = logp - batch.logp_old
        ratio = torch.exp(log_ratio)
        clipped = torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
        policy_loss = -torch.min(ratio * batch.advantages, clipped * batch.advantages).mean()
        with torch.no_grad():
            approx_kl = ((ratio - 1.0) - log_ratio).mean().item()
    else:
        policy_loss = -(logp * batch.advantages).mean()
    value_loss = 0.5 * (batch.returns - value).pow(2).mean()
    entropy = dist.entropy().mean()
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy
    return loss, {"policy_loss": policy_loss.item(), "value_loss": value_loss.item(),
                  "entropy": entropy.item(), "approx_kl": approx_kl}
