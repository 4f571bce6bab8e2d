"""The registry and the checks every topology shares, in one process (a 1-rank world)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st
from mpi4py import MPI

import topologies
from topologies.base import Topology, check_buffer
from topologies.butterfly import fold, rank_of
from topologies.rabenseifner import plan
from topologies.ring import chunk_bounds


def test_get_returns_each_registered_class():
    for name in topologies.names():
        cls = topologies.get(name)
        assert issubclass(cls, Topology) and cls.name == name


def test_unknown_name_lists_valid_names():
    with pytest.raises(topologies.UnknownTopologyError) as info:
        topologies.get("hypercube")
    message = str(info.value)
    assert "hypercube" in message
    for name in topologies.names():
        assert name in message


@pytest.mark.parametrize("bad, fragment", [
    ([1.0, 2.0], "numpy.ndarray"),
    (np.ones(4, dtype=np.int32), "allowed dtypes: float32, float64"),
    (np.ones(8, dtype=np.float32)[::2], "not C-contiguous"),
    (np.ones((4, 4), dtype=np.float64).T, "not C-contiguous"),
])
@pytest.mark.parametrize("name", topologies.names())
def test_bad_buffers_are_rejected_with_a_reason(name, bad, fragment):
    topo = topologies.get(name)(MPI.COMM_WORLD)
    with pytest.raises(topologies.TopologyError, match=fragment):
        topo.allreduce(bad)
    with pytest.raises(topologies.TopologyError, match=fragment):
        topo.bcast(bad)


def test_read_only_buffer_is_rejected():
    buf = np.ones(3, dtype=np.float32)
    buf.flags.writeable = False
    with pytest.raises(topologies.TopologyError, match="read-only"):
        check_buffer(buf)


def test_two_dimensional_contiguous_buffer_is_reduced_in_place():
    buf = np.arange(6, dtype=np.float64).reshape(2, 3)
    out = topologies.get("ring")(MPI.COMM_WORLD).allreduce(buf, average=True)
    assert out is buf and buf.shape == (2, 3)


@pytest.mark.parametrize("root", [-1, 1, 2.0, True, "0"])
def test_root_out_of_range_is_rejected(root):
    with pytest.raises(topologies.TopologyError, match=r"allowed: 0\.\.0"):
        topologies.get("tree")(MPI.COMM_WORLD, root=root)
    topo = topologies.get("tree")(MPI.COMM_WORLD)
    with pytest.raises(topologies.TopologyError, match=r"allowed: 0\.\.0"):
        topo.bcast(np.ones(2), root=root)


@given(st.integers(min_value=1, max_value=4096))
def test_butterfly_fold_maps_participants_one_to_one(size):
    newranks = [fold(r, size)[0] for r in range(size)]
    pof2 = fold(0, size)[1]
    participants = sorted(n for n in newranks if n >= 0)
    assert participants == list(range(pof2))
    assert pof2 <= size < 2 * pof2
    for r, n in enumerate(newranks):
        if n >= 0:
            assert rank_of(n, size) == r
        else:   # a folded rank hands its data to the participant just above it
            assert fold(r + 1, size)[0] >= 0


@given(st.integers(min_value=0, max_value=10**7), st.integers(min_value=1, max_value=4096))
def test_ring_chunks_cover_the_buffer_without_overlap(count, size):
    bounds = chunk_bounds(count, size)
    assert bounds[0] == 0 and bounds[-1] == count and len(bounds) == size + 1
    lengths = np.diff(bounds)
    assert lengths.min() >= 0 and lengths.max() - lengths.min() <= 1


@given(st.integers(min_value=1, max_value=13), st.integers(min_value=0, max_value=300))
def test_rabenseifner_plan_sums_every_block_once_and_gathers_it_everywhere(size, count):
    """Every participant's rounds, played in one process on integer buffers (exact sums):
    each partner sends what the other keeps, each block's sum is made by its owner
    alone, and the allgather leaves the whole sum on every participant."""
    pof2 = fold(0, size)[1]
    rng = np.random.default_rng(size * 1000 + count)
    bufs = {n: rng.integers(-1000, 1000, count) for n in range(pof2)}
    total = sum(bufs.values())
    plans = {n: plan(n, pof2, size, count) for n in range(pof2)}
    for phase in (0, 1):
        for step in range(len(plans[0][phase])):
            sent = {}
            for n in range(pof2):
                partner, (s0, s1), received = plans[n][phase][step]
                sent[n] = (bufs[n][s0:s1].copy(), (s0, s1), partner)
            for n in range(pof2):
                partner, _, (r0, r1) = plans[n][phase][step]
                data, span, to = sent[fold(partner, size)[0]]
                assert to == rank_of(n, size) and span == (r0, r1)
                if phase == 0:
                    bufs[n][r0:r1] += data
                else:
                    bufs[n][r0:r1] = data
        if phase == 0 and pof2 > 1:   # after the reduce-scatter: one block per owner
            bounds = chunk_bounds(count, pof2)
            kept = {n: plans[n][0][-1][2] for n in range(pof2)}
            assert sorted(kept.values()) == [(bounds[b], bounds[b + 1]) for b in range(pof2)]
            for n, (lo, hi) in kept.items():
                assert np.array_equal(bufs[n][lo:hi], total[lo:hi])
    for n in range(pof2):
        assert np.array_equal(bufs[n], total)


@pytest.mark.parametrize("spec, fragment", [
    ("hierarchical:nope", "unknown topology 'nope'"),
    ("hierarchical:hierarchical", "cannot be hierarchical"),
    ("hierarchical:ring:0", "node size '0'"),
    ("hierarchical:ring:two", "node size 'two'"),
    ("ring:butterfly", "takes no options"),
])
def test_bad_variant_specs_say_what_is_allowed(spec, fragment):
    with pytest.raises(topologies.TopologyError, match=fragment):
        topologies.get(spec)


def test_a_variant_is_built_once_and_keeps_its_options():
    cls = topologies.get("hierarchical:butterfly:2")
    assert cls is topologies.get("hierarchical:butterfly:2")
    assert issubclass(cls, topologies.get("hierarchical"))
    assert (cls.name, cls.inner, cls.node_size) == ("hierarchical", "butterfly", 2)
    assert topologies.get("hierarchical").inner == "ring"
