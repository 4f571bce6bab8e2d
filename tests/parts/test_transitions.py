"""The transition records apex and gorila move: layouts, packing, tensors out."""

from __future__ import annotations

import numpy as np
import torch

from mpirl.parts.transitions import (BATCH_META, BLOCK_META, SAMPLE_META, TransitionLayout,
                                     as_batch, fill)
from topologies.channels import as_bytes


def _transitions(n, obs_dim=4):
    g = torch.Generator().manual_seed(0)
    return {"obs": torch.randn(n, obs_dim, generator=g), "action": torch.arange(n) % 2,
            "ret": torch.randn(n, generator=g), "disc": torch.full((n,), 0.97),
            "next_obs": torch.randn(n, obs_dim, generator=g)}


def test_every_field_is_four_bytes_wide_and_every_message_one_buffer():
    layout = TransitionLayout((4,), block_size=64, batch=32)
    t = layout.transition
    assert t.itemsize == 4 * (4 + 1 + 1 + 1 + 4 + 1 + 1)
    assert all(t.fields[name][0].base.itemsize == 4 for name in t.names)
    assert layout.nbytes("block") == 8 * len(BLOCK_META) + 64 * t.itemsize
    assert layout.nbytes("request") == 8 * len(SAMPLE_META) + 32 * (8 + 8 + 4)
    assert layout.nbytes("reply") == 8 * len(BATCH_META) + 32 * (8 + 8 + 4 + t.itemsize)
    for kind in ("block", "request", "reply"):
        record = layout.empty(kind)
        assert as_bytes(record).size == layout.nbytes(kind)


def test_fill_then_as_batch_round_trips_the_transitions():
    layout = TransitionLayout((4,), block_size=16, batch=8)
    block = layout.empty("block")
    trans = _transitions(10)
    prios = np.linspace(0.1, 1.0, 10).astype(np.float32)
    assert fill(block[0]["trans"], trans, prios, version=7) == 10
    records = block[0]["trans"][:10]
    assert (records["version"] == 7).all() and np.allclose(records["prio"], prios)
    batch = as_batch(records, weights=np.full(10, 0.5))
    for name in ("obs", "ret", "disc", "next_obs"):
        assert torch.equal(batch[name], trans[name])
    assert batch["action"].dtype == torch.int64 and torch.equal(batch["action"], trans["action"])
    assert torch.equal(batch["weights"], torch.full((10,), 0.5))
    assert torch.equal(as_batch(records)["weights"], torch.ones(10))
