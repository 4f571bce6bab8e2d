"""Checks --overlap's buckets (mpirl.kit.overlap) on a torch MLP; run under mpiexec.

Usage: mpiexec -n N python tests/mpi/check_overlap.py     (N >= 2)

Rank 0 prints ``OK CASE`` or ``FAIL CASE: why`` per case; exit status 1 on any failure.
"""

from __future__ import annotations

import sys

from cases import cases, comm, rank, report, size  # first: it starts MPI

import numpy as np
import torch

from mpirl.kit.overlap import Overlap, Whole
from mpirl.parts.learner.flat import FlatParams
from mpirl.resilience.exchange import Exchange


def model() -> tuple[torch.nn.Module, FlatParams]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                              torch.nn.Tanh(), torch.nn.Linear(64, 2))
    return net, FlatParams(net)


def backward(net, step: int) -> None:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, 8, generator=g)
    net(x).pow(2).sum().backward()


def gradients(topology: str, overlap: bool, steps: int = 3) -> list[bytes]:
    net, flat = model()
    exchange = Exchange(topology, comm)
    way = Overlap(exchange, flat, 0.0005) if overlap else Whole(exchange, flat.grad_np)
    out = []
    for step in range(steps):
        pending = way.start(step + 1)
        flat.zero_grad()
        backward(net, step)
        pending.wait()
        out.append(flat.grad_np.tobytes())
    return out


def check_same_bytes() -> None:
    """Butterfly and native add element by element in an order that does not depend on
    the buffer's length: bucketed, the same bytes; ring: other bytes, the same on every
    rank."""
    problems = []
    for topology in ("butterfly", "native"):
        if gradients(topology, True) != gradients(topology, False):
            problems.append(f"rank {rank}: {topology} bucketed differs from whole")
    ring = gradients("ring", True)
    if len(set(comm.allgather(ring[-1]))) != 1:
        problems.append("ring bucketed: ranks differ")
    whole = np.frombuffer(gradients("ring", False)[-1], np.float32)
    if not np.allclose(np.frombuffer(ring[-1], np.float32), whole, rtol=1e-5, atol=1e-6):
        problems.append(f"rank {rank}: ring bucketed is not the whole buffer's average")
    report("bucketed averages: butterfly and native bytes unchanged, ring within rounding",
           problems)


def check_buckets_leave_during_backward() -> None:
    """When the first layer's weight gets its gradient (the last of backward), the
    buckets of the layers above it have already been started."""
    net, flat = model()
    overlap = Overlap(Exchange("butterfly", comm), flat, 0.0005)
    seen = []
    flat.tensors[0].register_post_accumulate_grad_hook(lambda _: seen.append(overlap._next))
    problems = []
    if len(overlap.plan) < 3:
        problems.append(f"{len(overlap.plan)} buckets, expected at least 3")
    pending = overlap.start(1)
    flat.zero_grad()
    backward(net, 0)
    pending.wait()
    if not seen or seen[0] < len(overlap.plan) - 1:
        problems.append(f"rank {rank}: {seen[0] if seen else None} of {len(overlap.plan)} "
                        "buckets started when backward reached the first layer")
    starts = [t0 for t0, _ in overlap.times]
    if starts != sorted(starts):
        problems.append(f"rank {rank}: buckets did not start in order: {starts}")
    # a backward outside start/wait sends nothing (the hooks are disarmed)
    calls = overlap.exchange.topology.stats.calls
    backward(net, 1)
    if overlap.exchange.topology.stats.calls != calls:
        problems.append(f"rank {rank}: a backward outside start/wait sent buckets")
    report("buckets leave during backward, in order; none outside start/wait", problems)


def main() -> None:
    if size < 2:
        sys.exit("check_overlap needs at least 2 ranks")
    torch.set_num_threads(1)
    check_same_bytes()
    check_buckets_leave_during_backward()
    sys.exit(1 if cases.failed else 0)


if __name__ == "__main__":
    main()
