"""FlatParams: a module's parameters and gradients are views into two flat buffers."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from mpirl.parts.learner.flat import FlatParams


def small_module():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def test_flattening_keeps_the_values_in_parameter_order():
    module = small_module()
    before = torch.cat([p.detach().reshape(-1).clone() for p in module.parameters()])
    flat = FlatParams(module)
    assert flat.count == sum(p.numel() for p in module.parameters()) == 3 * 4 + 4 + 4 * 2 + 2
    np.testing.assert_array_equal(flat.param_np, before.numpy())
    assert flat.param_np.dtype == np.float32


def test_writing_param_np_changes_the_module():
    module = small_module()
    flat = FlatParams(module)
    x = torch.randn(5, 3)
    flat.param_np[:] = 0.0
    assert torch.count_nonzero(module(x)) == 0
    flat.param_np[-2:] = [3.0, -1.0]                # the last layer's bias
    torch.testing.assert_close(module(x), torch.tensor([[3.0, -1.0]]).expand(5, 2))
    assert module[2].bias.tolist() == [3.0, -1.0]


def test_each_parameter_is_its_slice_of_the_buffer():
    module = small_module()
    flat = FlatParams(module)
    flat.param_np[:] = np.arange(flat.count, dtype=np.float32)
    offset = 0
    for p in module.parameters():
        np.testing.assert_array_equal(p.detach().numpy().reshape(-1),
                                      np.arange(offset, offset + p.numel()))
        offset += p.numel()


def test_backward_writes_into_grad_np():
    module = small_module()
    reference = copy.deepcopy(module)
    flat = FlatParams(module)
    x = torch.randn(6, 3)
    module(x).pow(2).sum().backward()
    expected = torch.autograd.grad(reference(x).pow(2).sum(), list(reference.parameters()))
    np.testing.assert_allclose(flat.grad_np, torch.cat([g.reshape(-1) for g in expected]),
                               rtol=1e-6)
    flat.check_views()                               # backward kept .grad in the buffer


def test_backward_accumulates_and_zero_grad_clears():
    module = small_module()
    flat = FlatParams(module)
    x = torch.randn(6, 3)
    module(x).sum().backward()
    once = flat.grad_np.copy()
    assert np.any(once != 0)
    module(x).sum().backward()
    np.testing.assert_allclose(flat.grad_np, 2 * once, rtol=1e-6)
    flat.zero_grad()
    assert not np.any(flat.grad_np)
    assert all(torch.count_nonzero(p.grad) == 0 for p in module.parameters())


def test_a_step_on_the_flat_parameter_moves_the_module():
    module = small_module()
    flat = FlatParams(module)
    opt = torch.optim.SGD([flat.flat], lr=0.5)
    flat.grad_np[:] = 1.0
    first_bias = module[0].bias.detach().clone()
    opt.step()
    torch.testing.assert_close(module[0].bias.detach(), first_bias - 0.5)


def test_check_views_raises_after_zero_grad_set_to_none():
    module = small_module()
    flat = FlatParams(module)
    flat.check_views()
    module.zero_grad(set_to_none=True)
    with pytest.raises(RuntimeError, match="set_to_none"):
        flat.check_views()


def test_check_views_raises_after_a_grad_is_replaced():
    module = small_module()
    flat = FlatParams(module)
    module[0].weight.grad = torch.zeros_like(module[0].weight)
    with pytest.raises(RuntimeError, match="flat buffer"):
        flat.check_views()


def test_check_views_raises_after_data_is_replaced():
    module = small_module()
    flat = FlatParams(module)
    module[2].bias.data = torch.zeros(2)
    with pytest.raises(RuntimeError, match="flat buffer"):
        flat.check_views()


def test_a_module_without_parameters_raises():
    with pytest.raises(ValueError, match="no parameters"):
        FlatParams(nn.Sequential(nn.ReLU(), nn.Tanh()))


def test_float64_buffers():
    flat = FlatParams(small_module(), dtype=torch.float64)
    assert flat.param_np.dtype == flat.grad_np.dtype == np.float64
