"""A model's parameters and gradients as views into two flat, contiguous buffers.

After :class:`FlatParams` wraps a module, every parameter tensor is a view into
``params`` and every ``.grad`` a view into ``grads``: ``loss.backward()`` accumulates
straight into the flat gradient buffer (autograd adds into an existing ``.grad`` in
place), so an exchange is one call on ``grad_np`` with no packing or copying, and
the optimizer steps one flat tensor, so its state (Adam's moments) is flat too.

``carried`` buffers (the observation normalizer's mean and std) become views into the
same memory, after the parameters: :attr:`FlatParams.wire_np` is parameters and carried
state as one contiguous buffer, what travels where a rank hands its policy to another
(whoever owns the parameters owns the statistics they act with).  No gradient, optimizer
or exchange of gradients sees the carried part.
"""

from __future__ import annotations

import numpy as np
import torch


class FlatParams:
    """Flat parameter and gradient buffers shared, without copies, by torch and numpy."""

    def __init__(self, module: torch.nn.Module, dtype: torch.dtype = torch.float32,
                 carried: tuple[torch.Tensor, ...] = ()) -> None:
        tensors = list(module.parameters())
        if not tensors:
            raise ValueError("module has no parameters to flatten")
        count = sum(p.numel() for p in tensors)
        wire = torch.empty(count + sum(b.numel() for b in carried), dtype=dtype)
        self.flat = torch.nn.Parameter(wire[:count])
        self.flat.grad = torch.zeros(count, dtype=dtype)
        offset = 0
        with torch.no_grad():
            for p in tensors:
                n = p.numel()
                self.flat[offset:offset + n].copy_(p.reshape(-1))
                p.data = self.flat.data[offset:offset + n].view_as(p)
                p.grad = self.flat.grad[offset:offset + n].view_as(p)
                offset += n
            for b in carried:
                n = b.numel()
                wire[offset:offset + n].copy_(b.reshape(-1))
                b.data = wire[offset:offset + n].view_as(b)
                offset += n
        self._views = tensors
        #: numpy views of the same memory: what the topologies operate on.
        self.param_np: np.ndarray = self.flat.data.numpy()
        self.grad_np: np.ndarray = self.flat.grad.numpy()
        #: the parameters, then the carried buffers: one contiguous buffer
        self.wire_np: np.ndarray = wire.numpy()

    @property
    def tensors(self) -> list[torch.nn.Parameter]:
        """The module's parameter tensors (views into :attr:`flat`), in the buffer's order."""
        return self._views

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """Each parameter tensor's shape, in the buffer's order (for exchanges that
        compress per tensor, ``Topology.describe``)."""
        return [tuple(p.shape) for p in self._views]

    @property
    def count(self) -> int:
        return self.flat.numel()

    def zero_grad(self) -> None:
        self.flat.grad.zero_()

    def check_views(self) -> None:
        """Raise if something replaced a parameter's or gradient's storage (e.g. set_to_none)."""
        base_p, base_g = self.flat.data.data_ptr(), self.flat.grad.data_ptr()
        end = self.count * self.flat.element_size()
        for p in self._views:
            if p.grad is None or not (0 <= p.grad.data_ptr() - base_g < end) \
                    or not (0 <= p.data.data_ptr() - base_p < end):
                raise RuntimeError(
                    "a parameter or gradient no longer lives in the flat buffer; do not call "
                    "zero_grad(set_to_none=True) or replace .data/.grad on a FlatParams model")
