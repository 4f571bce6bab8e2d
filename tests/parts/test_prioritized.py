"""SumTree and PrioritizedReplay against direct numpy computations of their definitions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mpirl.parts.replay import PrioritizedReplay, SumTree, beta_at

#: a transition: its insertion number (to check eviction by) and a small observation
FIELDS = [("id", np.int64), ("obs", np.float32, (3,)), ("reward", np.float32)]

#: per-bin bound on a count, in binomial standard deviations: a false failure per bin
#: has probability about 2e-9 (and the seeds are fixed, so the tests are deterministic)
Z = 6.0


def records(first: int, k: int) -> np.ndarray:
    """``k`` transitions numbered ``first, first + 1, ...``."""
    out = np.zeros(k, np.dtype(FIELDS))
    out["id"] = np.arange(first, first + k)
    out["obs"] = out["id"][:, None] * np.float32(0.5)
    out["reward"] = -out["id"]
    return out


def filled(priorities, *, alpha=1.0, eps=1e-6) -> PrioritizedReplay:
    """A replay holding one transition per priority, slot ``i`` of priority ``i``."""
    replay = PrioritizedReplay(len(priorities), FIELDS, alpha=alpha, eps=eps)
    replay.add(records(0, len(priorities)), np.asarray(priorities, dtype=np.float64))
    return replay


def counts_of(replay: PrioritizedReplay, draws: int, n: int, seed: int) -> np.ndarray:
    """How often each slot came out of ``draws // n`` samples of ``n``.  Stratified
    batches vary less than independent draws, so a binomial bound holds for them too."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(replay.capacity, np.int64)
    for _ in range(draws // n):
        indices, _, _ = replay.sample(n, rng, beta=0.4)
        counts += np.bincount(indices, minlength=replay.capacity)
    return counts


def assert_binomial(counts: np.ndarray, probabilities: np.ndarray) -> None:
    """Each count within :data:`Z` standard deviations of its binomial mean."""
    draws = counts.sum()
    mean = draws * probabilities
    sd = np.sqrt(draws * probabilities * (1 - probabilities))
    assert (np.abs(counts - mean) <= Z * sd + 1e-9).all(), (counts, mean.round(1))


# -- the sum tree ------------------------------------------------------------------------

@st.composite
def tree_updates(draw, values=st.floats(0, 1e3, allow_nan=False, allow_infinity=False)):
    """A capacity and a sequence of batches of (leaf, value), leaves possibly repeated."""
    capacity = draw(st.integers(1, 40))
    pair = st.tuples(st.integers(0, capacity - 1), values)
    return capacity, draw(st.lists(st.lists(pair, max_size=12), min_size=1, max_size=8))


@settings(max_examples=100, deadline=None)
@given(tree_updates())
def test_total_and_min_follow_arbitrary_updates(case):
    capacity, batches = case
    tree = SumTree(capacity)
    model = np.full(capacity, np.nan)                 # NaN: never set
    assert tree.total == 0 and tree.min == np.inf
    for batch in batches:
        indices = np.array([i for i, _ in batch], dtype=np.int64)
        values = np.array([v for _, v in batch], dtype=np.float64)
        tree.update(indices, values)
        for i, v in batch:                            # in order: the last value wins
            model[i] = v
        live = model[~np.isnan(model)]
        assert tree.total == pytest.approx(live.sum(), rel=1e-12, abs=0)
        assert tree.min == (live.min() if len(live) else np.inf)
        np.testing.assert_array_equal(tree[np.arange(capacity)], np.nan_to_num(model))


@settings(max_examples=100, deadline=None)
@given(leaves=st.lists(st.integers(0, 50), min_size=1, max_size=40),
       fractions=st.lists(st.floats(0, 1, exclude_max=True), max_size=30))
def test_find_agrees_with_searchsorted_over_the_cumulative_sum(leaves, fractions):
    # integer leaves: every partial sum is exact, so the two must agree to the leaf
    values = np.array(leaves, dtype=np.float64)
    assume(values.sum() > 0)
    tree = SumTree(len(values))
    tree.update(np.arange(len(values)), values)
    cumsum = np.cumsum(values)
    total = cumsum[-1]
    edges = np.concatenate([[0.0], cumsum[cumsum < total]])     # where an off-by-one shows
    prefix = np.concatenate([edges, edges + 0.5, np.array(fractions) * total])
    prefix = prefix[prefix < total]
    found = tree.find(prefix)
    np.testing.assert_array_equal(found, np.searchsorted(cumsum, prefix, side="right"))
    assert (values[found] > 0).all()


@settings(max_examples=100, deadline=None)
@given(case=tree_updates(values=st.one_of(st.just(0.0), st.floats(1e-300, 1e3))),
       fractions=st.lists(st.floats(0, 1), max_size=20))
def test_find_never_returns_a_zero_leaf(case, fractions):
    capacity, batches = case
    tree = SumTree(capacity)
    for batch in batches:
        tree.update(np.array([i for i, _ in batch], dtype=np.int64),
                    np.array([v for _, v in batch], dtype=np.float64))
    assume(tree.total > 0)
    total = tree.total
    edge = [np.nextafter(total, 0), total, total * (1 - 1e-15), 2 * total, -1.0, 0.0]
    found = tree.find(np.concatenate([np.array(fractions) * total, edge]))
    assert ((found >= 0) & (found < capacity)).all()
    assert (tree[found] > 0).all()


def test_round_off_at_the_right_edge_steps_left_to_a_live_leaf():
    # a plain descent to just below this total goes right into the empty leaf 3:
    # fl(fl(0.02 + 0.34) + 0.55) lies above the exact sum of the rounded partial sums
    tree = SumTree(4)
    tree.update(np.arange(3), np.array([0.02, 0.34, 0.55]))
    total = tree.total
    np.testing.assert_array_equal(tree.find(np.array([np.nextafter(total, 0), total])), [2, 2])


def test_tree_rounds_capacity_up_to_a_power_of_two_and_keeps_the_padding_out():
    tree = SumTree(5)
    assert tree.size == 8 and tree.capacity == 5
    tree.update(np.array([4]), np.array([2.5]))
    assert (tree.total, tree.min) == (2.5, 2.5)
    np.testing.assert_array_equal(tree.find(np.array([0.0, 1.0, 2.4999])), [4, 4, 4])
    with pytest.raises(ValueError, match="allowed"):
        tree.update(np.array([5]), np.array([1.0]))


def test_find_in_an_empty_tree_raises():
    with pytest.raises(ValueError, match="sums to 0"):
        SumTree(3).find(np.array([0.0]))


# -- sampling ----------------------------------------------------------------------------

def test_single_draws_come_out_in_proportion_to_priorities():
    priorities = np.arange(1.0, 9.0)
    replay = filled(priorities, alpha=1.0)
    counts = counts_of(replay, draws=10_000, n=1, seed=1)
    assert_binomial(counts, (priorities + 1e-6) / (priorities + 1e-6).sum())
    assert replay.sampled == 10_000


def test_stratified_batches_hold_each_slot_within_two_of_its_share():
    priorities = np.array([5.0, 0.5, 3.0, 1.0, 7.0, 0.1, 2.0])
    replay = filled(priorities, alpha=0.7)
    stored = (priorities + 1e-6) ** 0.7
    share = 512 * stored / stored.sum()
    rng = np.random.default_rng(2)
    total = np.zeros(len(priorities), np.int64)
    for _ in range(100):
        counts = np.bincount(replay.sample(512, rng, beta=0.5)[0], minlength=len(priorities))
        assert (np.abs(counts - share) < 2).all(), (counts, share)
        total += counts
    assert_binomial(total, stored / stored.sum())


def test_alpha_zero_samples_uniformly_with_unit_weights():
    priorities = np.array([1e-3, 1.0, 50.0, 1e4, 0.0, 7.0])
    replay = filled(priorities, alpha=0.0)
    rng = np.random.default_rng(3)
    for n in (1, 5):
        indices, _, weights = replay.sample(n, rng, beta=1.0)
        np.testing.assert_array_equal(weights, np.ones(n, np.float32))
    counts = counts_of(replay, draws=20_000, n=40, seed=3)
    assert_binomial(counts, np.full(len(priorities), 1 / len(priorities)))


@pytest.mark.parametrize("alpha", [0.0, -0.0])
def test_at_alpha_zero_priorities_change_nothing_a_sample_depends_on(alpha):
    """At alpha 0 the priorities given (at insertion or by updates) are not stored (every
    one is 1): a replay fed TD errors and one fed ones sample the same slots with the same
    weights, bit for bit, and both count the updates, the stale ones (their slot
    overwritten between the sample and the update) apart."""
    rng = np.random.default_rng(5)
    told, ones = (PrioritizedReplay(40, FIELDS, alpha=alpha) for _ in range(2))
    draws = [np.random.default_rng(9) for _ in range(2)]
    first = 0

    def add_both(k: int) -> None:
        nonlocal first
        batch = records(first, k)
        told.add(batch, rng.exponential(3.0, k))
        ones.add(batch, 1.0)
        first += k

    for _ in range(30):
        add_both(7)
        got = [r.sample(16, d, beta=0.4) for r, d in zip((told, ones), draws, strict=True)]
        for a, b in zip(*got, strict=True):
            np.testing.assert_array_equal(a, b)
        add_both(3)                        # overwrites slots once the ring is full
        told.update_priorities(got[0][0], got[0][1], rng.exponential(3.0, 16))
        ones.update_priorities(got[1][0], got[1][1], 1.0)
        np.testing.assert_array_equal(told.priorities(np.arange(len(told))),
                                      np.ones(len(told)))
    assert told.updated + told.stale_updates == ones.updated + ones.stale_updates == 30 * 16
    assert told.stale_updates == ones.stale_updates > 0
    assert told.updated == ones.updated > 0
    with pytest.raises(ValueError, match="finite"):
        told.update_priorities(got[0][0], got[0][1], np.full(16, np.nan))


def test_updates_change_the_frequencies_accordingly():
    replay = filled(np.ones(6), alpha=1.0)
    before = counts_of(replay, draws=20_000, n=40, seed=4)
    assert_binomial(before, np.full(6, 1 / 6))
    indices = np.array([0, 3])
    skipped = replay.update_priorities(indices, replay.stamp[indices], np.array([9.0, -4.0]))
    assert skipped == 0 and replay.updated == 2
    stored = np.array([9.0, 1.0, 1.0, 4.0, 1.0, 1.0]) + 1e-6      # |p|: the sign drops
    np.testing.assert_allclose(replay.priorities(np.arange(6)), stored)
    after = counts_of(replay, draws=20_000, n=40, seed=5)
    assert_binomial(after, stored / stored.sum())


def test_importance_weights_follow_the_definition():
    rng = np.random.default_rng(6)
    raw = rng.exponential(size=50) * rng.choice([1e-3, 1.0, 30.0], size=50)
    replay = PrioritizedReplay(64, FIELDS, alpha=0.6, eps=1e-6)
    replay.add(records(0, 50), raw)
    for beta in (0.0, 0.4, 1.0):
        indices, _, weights = replay.sample(200, rng, beta=beta)
        stored = (np.abs(raw) + 1e-6) ** 0.6
        n, probability = len(replay), stored / stored.sum()
        expected = (n * probability[indices]) ** -beta / (n * probability.min()) ** -beta
        assert weights.dtype == np.float32
        np.testing.assert_allclose(weights, expected, rtol=1e-6)
        assert weights.max() <= 1.0


def test_the_smallest_priority_gets_weight_one():
    replay = filled(np.array([4.0, 1.0, 9.0]), alpha=1.0)
    rng = np.random.default_rng(7)
    indices, _, weights = replay.sample(3000, rng, beta=0.7)
    assert 1 in indices
    np.testing.assert_allclose(weights[indices == 1], 1.0)


def test_sample_copies_records_into_out_in_place():
    replay = PrioritizedReplay(10, FIELDS)
    replay.add(records(0, 7), np.arange(1.0, 8.0))
    out = np.zeros(16, replay.data.dtype)
    indices, stamps, _ = replay.sample(5, np.random.default_rng(8), beta=0.5, out=out)
    np.testing.assert_array_equal(out[:5], replay.data[indices])
    np.testing.assert_array_equal(out[:5]["id"], stamps)      # one record per insertion
    assert (out[5:]["id"] == 0).all()
    with pytest.raises(ValueError, match="length >= 5"):
        replay.sample(5, np.random.default_rng(8), beta=0.5, out=out[:4])
    with pytest.raises(ValueError, match="allowed"):
        replay.sample(2, np.random.default_rng(8), beta=0.5, out=np.zeros(4, np.float32))


def test_sampling_an_empty_replay_raises():
    replay = PrioritizedReplay(4, FIELDS)
    with pytest.raises(ValueError, match="empty"):
        replay.sample(1, np.random.default_rng(9), beta=0.4)


# -- capacity, eviction and stamps -------------------------------------------------------

@settings(max_examples=100, deadline=None)
@given(capacity=st.integers(1, 10), batches=st.lists(st.integers(0, 25), max_size=12))
def test_fifo_eviction_keeps_the_last_capacity_records(capacity, batches):
    replay = PrioritizedReplay(capacity, FIELDS, alpha=0.5)
    inserted = 0
    for k in batches:
        batch = records(inserted, k)
        slots = replay.add(batch, np.ones(k))
        inserted += k
        assert len(slots) == min(k, capacity)
        np.testing.assert_array_equal(replay.data[slots], batch[k - len(slots):])
        assert len(replay) == min(inserted, capacity)
        assert replay.inserted == inserted == len(replay) + replay.evicted
        held = np.sort(replay.data["id"][:len(replay)])
        np.testing.assert_array_equal(held, np.arange(inserted - len(replay), inserted))
        live = replay.stamp >= 0
        np.testing.assert_array_equal(replay.stamp[live], replay.data["id"][live])
        np.testing.assert_array_equal(replay.data["id"][live] % capacity,
                                      np.flatnonzero(live))     # record i lives in i % cap


def test_stale_updates_are_skipped_after_the_slot_is_overwritten():
    replay = PrioritizedReplay(4, FIELDS, alpha=1.0, eps=1e-6)
    replay.add(records(0, 4), np.ones(4))
    indices, stamps, _ = replay.sample(64, np.random.default_rng(10), beta=0.4)
    assert set(indices) == {0, 1, 2, 3}
    replay.add(records(4, 2), np.array([3.0, 3.0]))        # slots 0 and 1: new records
    skipped = replay.update_priorities(indices, stamps, np.full(64, 7.0))
    stale = np.isin(indices, [0, 1])
    assert skipped == stale.sum() == replay.stale_updates
    assert replay.updated == (~stale).sum()
    np.testing.assert_allclose(replay.priorities(np.arange(4)), [3.0, 3.0, 7.0, 7.0],
                               rtol=1e-6)
    assert replay.max_priority == 7.0
    assert replay.inserted == len(replay) + replay.evicted == 6


def test_update_with_a_repeated_slot_keeps_the_last_priority():
    replay = filled(np.ones(3), alpha=1.0, eps=1e-6)
    stamps = replay.stamp[[2, 2, 2]]
    assert replay.update_priorities(np.array([2, 2, 2]), stamps, np.array([5.0, 1.0, 2.0])) == 0
    assert replay.priorities(2)[0] == pytest.approx(2.0)
    assert replay.updated == 3


def test_max_priority_is_the_largest_raw_magnitude_seen():
    replay = PrioritizedReplay(3, FIELDS, alpha=0.5)
    assert replay.max_priority == 1.0                     # nothing seen yet: Ape-X's default
    replay.add(records(0, 2), np.array([0.25, -0.5]))
    assert replay.max_priority == 0.5
    replay.add(records(2, 1), replay.max_priority)        # a scalar: every new record
    assert replay.priorities(2)[0] == pytest.approx((0.5 + 1e-6) ** 0.5)
    replay.update_priorities(np.array([0]), replay.stamp[[0]], np.array([-3.0]))
    assert replay.max_priority == 3.0


# -- annealing and arguments -------------------------------------------------------------

def test_beta_anneals_linearly_to_one():
    assert beta_at(0, 0.4, 100) == 0.4
    assert beta_at(50, 0.4, 100) == pytest.approx(0.7)
    assert beta_at(100, 0.4, 100) == 1.0
    assert beta_at(10**6, 0.4, 100) == 1.0
    assert beta_at(123, 0.4, 0) == 0.4


def bad_calls():
    good = PrioritizedReplay(4, FIELDS)
    good.add(records(0, 2), np.ones(2))
    rng = np.random.default_rng(0)
    return {
        "tree capacity 0": (lambda: SumTree(0), "capacity=0"),
        "capacity 0": (lambda: PrioritizedReplay(0, FIELDS), "capacity=0"),
        "capacity 2.5": (lambda: PrioritizedReplay(2.5, FIELDS), "capacity=2.5"),
        "alpha < 0": (lambda: PrioritizedReplay(4, FIELDS, alpha=-0.1), "alpha=-0.1"),
        "eps 0": (lambda: PrioritizedReplay(4, FIELDS, eps=0.0), "eps=0.0"),
        "eps < 0": (lambda: PrioritizedReplay(4, FIELDS, eps=-1e-6), "eps=-1e-06"),
        "unnamed fields": (lambda: PrioritizedReplay(4, np.float32), "structured"),
        "beta < 0": (lambda: good.sample(2, rng, beta=-0.1), "beta=-0.1"),
        "beta > 1": (lambda: good.sample(2, rng, beta=1.5), "beta=1.5"),
        "n 0": (lambda: good.sample(0, rng, beta=0.4), "n=0"),
        "wrong dtype": (lambda: good.add(np.zeros(2, np.float32), np.ones(2)), "dtype"),
        "short priorities": (lambda: good.add(records(2, 2), np.ones(3)), r"\(2,\)"),
        "NaN priority": (lambda: good.add(records(2, 1), np.array([np.nan])), "finite"),
        "slot out of range": (lambda: good.update_priorities([4], [0], [1.0]), r"\[0, 4\)"),
        "stamps mismatch": (lambda: good.update_priorities([0, 1], [0], [1.0, 1.0]), "stamps"),
        "negative leaf": (lambda: SumTree(2).update([0], [-1.0]), ">= 0"),
        "beta0 > 1": (lambda: beta_at(0, 1.2, 10), "beta0=1.2"),
        "anneal < 0": (lambda: beta_at(0, 0.4, -1), "anneal_steps=-1"),
        "step < 0": (lambda: beta_at(-1, 0.4, 10), "step=-1"),
    }


@pytest.mark.parametrize("name", list(bad_calls()))
def test_bad_arguments_raise(name):
    call, message = bad_calls()[name]
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert "allowed" in str(info.value)


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_replay_continued_from_its_state_samples_and_evicts_as_the_original(wrapped):
    """state() into a fresh replay (records, stamps, priorities, ring position, counts;
    the sum tree rebuilt from its leaves): the same draws, weights, evictions and
    counts afterwards, bit for bit; before the ring wraps and after."""
    original = PrioritizedReplay(64, FIELDS, alpha=0.6)
    rng = np.random.default_rng(5)
    original.add(records(0, 100 if wrapped else 40), rng.random(100 if wrapped else 40))
    idx, stamps, _ = original.sample(16, rng, 0.4)
    original.update_priorities(idx, stamps, rng.random(16) * 3)
    copy = PrioritizedReplay(64, FIELDS, alpha=0.6)
    copy.load_state(original.state())
    assert len(copy) == len(original)
    for replay in (original, copy):
        draws = np.random.default_rng(9)
        replay.add(records(500, 30), draws.random(30))
        picked = replay.sample(32, draws, 0.7)
        replay.update_priorities(picked[0], picked[1], draws.random(32))
        replay.outcome = (*picked, replay.sample(8, draws, 1.0), replay.data.copy(),
                          replay.priorities(np.arange(len(replay))))
    for a, b in zip(original.outcome, copy.outcome, strict=True):
        for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple)
                        else (b,), strict=True):
            assert x.tobytes() == y.tobytes()
    for key in PrioritizedReplay.COUNTS:
        assert getattr(copy, key) == getattr(original, key)
    assert copy.max_priority == original.max_priority


def test_a_replay_refuses_a_state_of_another_layout():
    small = PrioritizedReplay(8, FIELDS)
    small.add(records(0, 8), 1.0)
    for capacity in (4, 16):            # a ring's slots mean nothing in another ring
        with pytest.raises(ValueError, match=f"capacity 8, .* this replay: capacity {capacity}"):
            PrioritizedReplay(capacity, FIELDS).load_state(small.state())
    with pytest.raises(ValueError, match="records of 24 bytes; this replay: capacity 8, 8"):
        PrioritizedReplay(8, [("id", np.int64)]).load_state(small.state())
    # a file from before the capacity was kept: taken where its records lie as they fit
    old = {k: v for k, v in small.state().items() if k != "capacity"}       # full at 8
    PrioritizedReplay(8, FIELDS).load_state(old)
    with pytest.raises(ValueError, match="this replay: capacity 16"):
        PrioritizedReplay(16, FIELDS).load_state(old)    # its ring may have wrapped
    young = PrioritizedReplay(8, FIELDS)
    young.add(records(0, 5), 1.0)                        # never wrapped: fits a larger one
    PrioritizedReplay(16, FIELDS).load_state(
        {k: v for k, v in young.state().items() if k != "capacity"})
