"""Your own network in the actor-critic learner: ``--model MODULE:FUNCTION``.

``FUNCTION(obs_space, act_space, cfg)`` returns a ``torch.nn.Module`` whose
``forward(obs)`` takes a batch of flattened observations (float32, shape ``(..., obs_dim)``)
and returns ``(out, value)``: ``out`` the policy's logits (Discrete: ``(..., n)``) or
action means (Box: ``(..., act_dim)``), ``value`` the state values (``(...,)`` or
``(..., 1)``).  mpirl wraps it as it wraps its MLP: a Box policy's state-independent log
std is a parameter of the wrapper (``--init-log-std``), ``--obs-norm`` normalizes the
observations before the network, and every parameter goes into the replica's one flat
buffer, so every topology exchanges it like the built-in network's.

:func:`check_model` runs at start, in the configuration checks: the factory is imported
and called on the env's spaces, and one forward pass on two observations checks the
output shapes; anything wrong is one line (``mpirl.run: error: model=...: ...``) and
exit 2, before any rank starts training.
"""

from __future__ import annotations

import importlib

import gymnasium
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Independent, Normal

from .normalize import ObsNormalizer


def load_factory(spec: str):
    """The callable named by ``MODULE:FUNCTION``; ValueError saying what is missing."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"model={spec!r}; allowed: MODULE:FUNCTION, e.g. mynets:make_net")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"model={spec!r}: cannot import {module_name!r} ({err}); it must be "
                          "importable where the ranks start (the working directory or "
                          "PYTHONPATH)") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ValueError(f"model={spec!r}: {module_name} has no function {name!r}")
    return factory


class CustomActorCritic(nn.Module):
    """A user's network behind :class:`~mpirl.parts.learner.model.ActorCritic`'s
    interface (``discrete``, ``obs_norm``, ``dist(obs)``, ``value(obs)``,
    ``forward(obs)``)."""

    def __init__(self, net: nn.Module, obs_space: gymnasium.Space, act_space: gymnasium.Space,
                 init_log_std: float = -0.5, obs_norm: bool = False) -> None:
        super().__init__()
        self.net = net
        self.discrete = isinstance(act_space, gymnasium.spaces.Discrete)
        if not self.discrete:
            act_dim = int(np.prod(act_space.shape))
            self.log_std = nn.Parameter(torch.full((act_dim,), float(init_log_std)))
        obs_dim = int(np.prod(obs_space.shape))
        self.obs_norm = ObsNormalizer((obs_dim,)) if obs_norm else None

    def heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.obs_norm is not None:
            obs = self.obs_norm(obs)
        out, value = self.net(obs)
        if value.dim() == out.dim():             # (..., 1) values
            value = value.squeeze(-1)
        return out, value

    def _dist(self, out: torch.Tensor):
        if self.discrete:
            return Categorical(logits=out)
        return Independent(Normal(out, self.log_std.exp()), 1)

    def dist(self, obs: torch.Tensor):
        return self._dist(self.heads(obs)[0])

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State values of shape ``(..., 1)``, as the MLP's value network gives them."""
        return self.heads(obs)[1].unsqueeze(-1)

    def forward(self, obs: torch.Tensor):
        out, value = self.heads(obs)
        return self._dist(out), value


def build(cfg, obs_space: gymnasium.Space, act_space: gymnasium.Space) -> CustomActorCritic:
    """The wrapped network of ``cfg.model`` (call under the learner's seed)."""
    net = load_factory(cfg.model)(obs_space, act_space, cfg)
    if not isinstance(net, nn.Module):
        raise ValueError(f"model={cfg.model!r} returned {type(net).__name__}; allowed: a "
                          "torch.nn.Module")
    return CustomActorCritic(net, obs_space, act_space, cfg.init_log_std, cfg.obs_norm)


def _expect(cfg, what: str, got) -> ValueError:
    return ValueError(f"model={cfg.model!r}: forward(obs of shape (2, obs_dim)) must return "
                       f"{what}; it returned {got}")


def check_model(cfg) -> None:
    """Build ``cfg.model`` on the env's spaces and check one forward pass (ValueError)."""
    env = gymnasium.make(cfg.env, **cfg.env_kwargs())
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    torch.manual_seed(cfg.seed)
    model = build(cfg, obs_space, act_space)
    params = list(model.net.parameters())
    if not params:
        raise ValueError(f"model={cfg.model!r} has no parameters to learn")
    odd = sorted({str(p.dtype) for p in params} - {"torch.float32"})
    if odd:
        raise ValueError(f"model={cfg.model!r} has {', '.join(odd)} parameters; allowed: "
                          "torch.float32 (one flat float32 buffer per replica)")
    state = [n for n, b in model.net.named_buffers() if b.is_floating_point()]
    if state:
        raise ValueError(f"model={cfg.model!r} keeps running state in buffers ({state[0]}): "
                          "replicas would drift apart unseen; allowed: parameters only "
                          "(e.g. LayerNorm, not BatchNorm)")
    obs_dim = int(np.prod(obs_space.shape))
    obs = torch.as_tensor(np.stack([np.asarray(obs_space.sample(), dtype=np.float32).ravel()
                                    for _ in range(2)]))
    try:
        result = model.net(obs)
    except Exception as err:                     # the user's code: any error is theirs
        raise ValueError(f"model={cfg.model!r}: forward on a batch of shape (2, {obs_dim}) "
                          f"failed: {type(err).__name__}: {err}") from None
    if not (isinstance(result, (tuple, list)) and len(result) == 2
            and all(torch.is_tensor(t) for t in result)):
        raise _expect(cfg, "a pair of tensors (policy output, values)", type(result).__name__)
    out, value = result
    n = int(act_space.n) if model.discrete else int(np.prod(act_space.shape))
    head = "logits" if model.discrete else "action means"
    if tuple(out.shape) != (2, n):
        raise _expect(cfg, f"{head} of shape (2, {n}) first", f"shape {tuple(out.shape)}")
    if tuple(value.shape) not in ((2,), (2, 1)):
        raise _expect(cfg, "values of shape (2,) or (2, 1) second", f"shape {tuple(value.shape)}")
