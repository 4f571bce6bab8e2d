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
                      clip_ratio: float = 0.0, *, norm_adv: bool = False,
                      clip_vloss: bool = False) -> tuple[torch.Tensor, dict]:
    """Policy-gradient loss with advantages, value regression, entropy bonus.

    ``clip_ratio`` 0 gives A2C's ``-logp * A``; above 0, PPO's clipped surrogate
    ``-min(r A, clip(r, 1-e, 1+e) A)`` with ``r = exp(logp - logp_old)``, the objective of
    DPPO (Heess et al. 2017), whose repeated updates on one batch (``update_repeat``)
    it keeps close to the policy that collected it.

    Returns the loss and its parts as numbers: ``policy_loss``, ``value_loss``,
    ``entropy`` and, with the clipped objective, ``approx_kl``, the estimate
    ``E[(r - 1) - log r]`` of KL(pi_old || pi) (unbiased and never negative; NaN without
    clipping, where there is no old policy to compare with).

    ``norm_adv``: the advantages are normalized to mean 0, std 1 over this batch (a
    minibatch, in PPO); ``clip_vloss``: the value loss is PPO2's
    ``0.5 max((V - R)^2, (V_old + clip(V - V_old, -e, e) - R)^2)``, ``V_old`` being the
    values the actor saw (``batch.values``)."""
    dist, value = model(batch.obs)
    logp = dist.log_prob(batch.actions)
    approx_kl = math.nan
    advantages = batch.advantages
    if norm_adv:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    if clip_ratio > 0:
        log_ratio = logp - batch.logp_old
        ratio = torch.exp(log_ratio)
        clipped = torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
        policy_loss = -torch.min(ratio * advantages, clipped * advantages).mean()
        with torch.no_grad():
            approx_kl = ((ratio - 1.0) - log_ratio).mean().item()
    else:
        policy_loss = -(logp * advantages).mean()
    if clip_vloss:
        old = batch.values
        kept = old + torch.clamp(value - old, -clip_ratio, clip_ratio)
        value_loss = 0.5 * torch.max((value - batch.returns).pow(2),
                                     (kept - batch.returns).pow(2)).mean()
    else:
        value_loss = 0.5 * (batch.returns - value).pow(2).mean()
    entropy = dist.entropy().mean()
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy
    return loss, {"policy_loss": policy_loss.item(), "value_loss": value_loss.item(),
                  "entropy": entropy.item(), "approx_kl": approx_kl}


def _clip(x: torch.Tensor, bar: float | None) -> torch.Tensor:
    return x if bar is None else torch.clamp(x, max=bar)


@torch.no_grad()
def vtrace(behaviour_logp: torch.Tensor, target_logp: torch.Tensor, rewards: torch.Tensor,
           discounts: torch.Tensor, values: torch.Tensor, bootstrap: torch.Tensor, *,
           rho_bar: float | None = 1.0, c_bar: float | None = 1.0,
           pg_rho_bar: float | None = 1.0, lam: float = 1.0
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets ``vs`` and policy-gradient advantages over ``[T, B]`` (Espeholt et
    al. 2018, eq. 1 and section 4.2), by the backward recursion.

    ``rho_t = pi(a_t|x_t) / mu(a_t|x_t)`` from the two log-probabilities; ``discounts``
    is ``gamma`` where the episode goes on after step t and 0 where it ended;
    ``bootstrap`` is ``V(x_T)``.  With ``delta_t = min(rho_bar, rho_t) (r_t + d_t V_{t+1}
    - V_t)`` and ``c_t = lam min(c_bar, rho_t)``:
    ``vs_t - V_t = delta_t + d_t c_t (vs_{t+1} - V_{t+1})``; the advantage is
    ``min(pg_rho_bar, rho_t) (r_t + d_t vs_{t+1} - V_t)`` with ``vs_T = V(x_T)``.
    A bar of ``None`` does not clip.  Nothing here carries a gradient."""
    rho = torch.exp(target_logp - behaviour_logp)
    clipped_rho = _clip(rho, rho_bar)
    cs = lam * _clip(rho, c_bar)
    next_values = torch.cat([values[1:], bootstrap[None]], dim=0)
    deltas = clipped_rho * (rewards + discounts * next_values - values)
    acc = torch.zeros_like(bootstrap)
    corrections = torch.empty_like(values)
    for t in reversed(range(values.shape[0])):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        corrections[t] = acc
    vs = values + corrections
    next_vs = torch.cat([vs[1:], bootstrap[None]], dim=0)
    advantages = _clip(rho, pg_rho_bar) * (rewards + discounts * next_vs - values)
    return vs, advantages


def vtrace_loss(model, batch, value_coef: float, entropy_coef: float, *,
                rho_bar: float | None = 1.0, c_bar: float | None = 1.0,
                pg_rho_bar: float | None = 1.0, lam: float = 1.0
                ) -> tuple[torch.Tensor, dict]:
    """IMPALA's loss on a batch of unrolls (:class:`mpirl.parts.unroll.Unrolls`):
    ``-logp * A_vtrace + value_coef * 0.5 (vs - V)^2 - entropy_coef * H``, means over
    ``[T, B]``.  The values come from the learner's current network, on ``T + 1``
    observations per column (the last one is the bootstrap).  Returns the loss and its
    parts; ``approx_kl`` is ``E[(r - 1) - log r]`` of the learner's policy against the
    behaviour policy (the lag V-trace corrects)."""
    steps, cols = batch.rewards.shape
    dist = model.dist(batch.obs[:-1].flatten(0, 1))
    value = model.value(batch.obs.flatten(0, 1)).view(steps + 1, cols)
    logp = dist.log_prob(batch.actions.flatten(0, 1)).view(steps, cols)
    vs, adv = vtrace(batch.logp, logp.detach(), batch.rewards, batch.discounts, value[:-1].detach(),
                     value[-1].detach(), rho_bar=rho_bar, c_bar=c_bar,
                     pg_rho_bar=pg_rho_bar, lam=lam)
    policy_loss = -(logp * adv).mean()
    value_loss = 0.5 * (vs - value[:-1]).pow(2).mean()
    entropy = dist.entropy().mean()
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy
    with torch.no_grad():
        log_ratio = logp - batch.logp
        approx_kl = ((torch.exp(log_ratio) - 1.0) - log_ratio).mean().item()
    return loss, {"policy_loss": policy_loss.item(), "value_loss": value_loss.item(),
                  "entropy": entropy.item(), "approx_kl": approx_kl}
