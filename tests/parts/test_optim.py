"""FlatAdam and FlatSGD against torch.optim's Adam and SGD, step by step: the same bytes,
the same state layout (checkpoints load either way), and no torch._dynamo import."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from mpirl.parts.learner.optim import FlatAdam, FlatSGD


def twins(n: int = 1000, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    start = torch.randn(n, generator=g)
    a = torch.nn.Parameter(start.clone())
    b = torch.nn.Parameter(start.clone())
    return a, b, g


def same_steps(ours, theirs, a, b, g, steps: int = 50) -> None:
    for _ in range(steps):
        grad = torch.randn(a.numel(), generator=g) * 3.0
        a.grad, b.grad = grad.clone(), grad.clone()
        ours.step()
        theirs.step()
        assert torch.equal(a, b)                # bit for bit, every step


@pytest.mark.parametrize("lr", [1e-3, 0.03])
def test_flat_adam_is_torch_adam_bit_for_bit(lr):
    a, b, g = twins()
    ours, theirs = FlatAdam(a, lr=lr), torch.optim.Adam([b], lr=lr)
    same_steps(ours, theirs, a, b, g)
    mine, ref = ours.state[a], theirs.state[b]
    assert set(mine) == set(ref) == {"step", "exp_avg", "exp_avg_sq"}
    for key in mine:
        assert mine[key].dtype == ref[key].dtype and torch.equal(mine[key], ref[key]), key


def test_flat_sgd_is_torch_sgd_bit_for_bit():
    a, b, g = twins(seed=1)
    ours, theirs = FlatSGD(a, lr=0.05), torch.optim.SGD([b], lr=0.05)
    same_steps(ours, theirs, a, b, g)
    assert ours.state == {} and len(theirs.state) == 0


def test_state_dicts_load_either_way_and_steps_go_on_identical():
    """A checkpoint of torch.optim.Adam resumes in FlatAdam and the other way round;
    both then step to the same bytes as an optimizer that never stopped."""
    a, b, g = twins(seed=2)
    ours, theirs = FlatAdam(a, lr=0.01), torch.optim.Adam([b], lr=0.01)
    same_steps(ours, theirs, a, b, g, steps=7)
    ours_dict, theirs_dict = ours.state_dict(), theirs.state_dict()
    assert ours_dict["param_groups"] == theirs_dict["param_groups"]
    assert set(ours_dict["state"]) == set(theirs_dict["state"]) == {0}
    for key, value in theirs_dict["state"][0].items():
        assert torch.equal(ours_dict["state"][0][key], value), key
    import copy

    a2, b2 = torch.nn.Parameter(a.detach().clone()), torch.nn.Parameter(b.detach().clone())
    swapped_ours, swapped_theirs = FlatAdam(a2, lr=1.0), torch.optim.Adam([b2], lr=1.0)
    swapped_ours.load_state_dict(copy.deepcopy(theirs_dict))    # torch's into ours
    swapped_theirs.load_state_dict(copy.deepcopy(ours_dict))    # ours into torch's
    assert swapped_ours.param_groups[0]["lr"] == 0.01
    g2 = torch.Generator().manual_seed(5)
    for _ in range(10):
        grad = torch.randn(a.numel(), generator=g2)
        for p in (a, b, a2, b2):
            p.grad = grad.clone()
        for opt in (ours, theirs, swapped_ours, swapped_theirs):
            opt.step()
        assert torch.equal(a, b) and torch.equal(a, a2) and torch.equal(a, b2)


def test_a_fresh_optimizer_has_no_state_and_no_grad_means_no_step():
    a, _, _ = twins()
    opt = FlatAdam(a, lr=0.1)
    assert opt.state == {} and opt.state_dict()["state"] == {}
    before = a.detach().clone()
    opt.step()                                   # .grad is None: nothing to do
    assert torch.equal(a, before) and opt.state == {}
    with pytest.raises(ValueError, match="lr"):
        FlatAdam(a, lr=-1.0)
    with pytest.raises(ValueError, match="one tensor"):
        opt.load_state_dict({"state": {}, "param_groups": [{"params": [0, 1]}]})


def test_building_and_stepping_does_not_import_torch_dynamo():
    """The point of these classes: torch.optim's first optimizer imports torch._dynamo
    (over a second of CPU per process); these never do."""
    code = ("import sys, torch; from mpirl.parts.learner.optim import FlatAdam, FlatSGD; "
            "p = torch.nn.Parameter(torch.ones(4)); p.grad = torch.ones(4); "
            "FlatAdam(p, lr=0.1).step(); FlatSGD(p, lr=0.1).step(); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
