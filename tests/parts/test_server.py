"""The parameter server's policies, driven in one process as a server drives them:
push -> (a step if the decision carries a gradient: ``stepped()``) -> ``sent(w)`` for
every released worker."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mpirl.parts.server import AsyncPolicy, QuorumPolicy

COUNT = 4


class Server:
    """What a parameter server does with a policy's decisions; keeps every step's
    gradient (copied: the quorum's buffer is reused)."""

    def __init__(self, policy, workers):
        self.policy = policy
        self.steps: list[np.ndarray] = []
        for w in workers:
            policy.sent(w)

    def push(self, worker, grad, hold_all=None):
        decision = self.policy.push(worker, np.asarray(grad, dtype=np.float64),
                                    hold_all=hold_all)
        if decision.grad is not None:
            self.steps.append(decision.grad.copy())
            self.policy.stepped()
        for w in decision.release:
            self.policy.sent(w)
        return decision.release


def g(value):
    return np.full(COUNT, float(value))


def quorum(q, late="drop"):
    return QuorumPolicy(q, late, COUNT, dtype=np.float64)


def test_async_applies_every_push_and_answers_only_its_worker():
    server = Server(AsyncPolicy(), [1, 2, 3])
    push = np.arange(COUNT, dtype=np.float64)
    decision = server.policy.push(1, push)
    assert decision.grad is push and decision.release == [1]


def test_async_staleness_counts_updates_since_the_worker_was_sent():
    policy = AsyncPolicy()
    server = Server(policy, [1, 2, 3])
    for w in (1, 2, 3, 1, 1, 3):
        assert server.push(w, g(w)) == [w]
    # versions when sent: 1,2,3 at 0; then 1 at 1 and 4; 2 at 2; 3 at 3
    assert policy.staleness == [0, 1, 2, 2, 0, 2]
    assert policy.version == 6 and policy.applied == 6 and policy.dropped == 0
    assert policy.staleness_of(2) == 4


def test_drop_counts_a_push_not_used():
    policy = AsyncPolicy()
    policy.drop()
    assert (policy.applied, policy.dropped, policy.staleness) == (0, 1, [])


def test_quorum_waits_for_fresh_pushes_then_steps_on_their_mean():
    policy = quorum(2)
    server = Server(policy, [1, 2, 3])
    assert server.push(1, g(1)) == []
    assert policy.version == 0
    assert server.push(2, g(5)) == [1, 2]
    np.testing.assert_array_equal(server.steps[-1], g(3))
    assert policy.version == 1 and policy.staleness == [0, 0]


def test_quorum_drops_a_late_push_but_holds_its_worker():
    policy = quorum(2, "drop")
    server = Server(policy, [1, 2, 3])
    server.push(1, g(1))
    server.push(2, g(3))                    # round 1: version 1; worker 3 still at 0
    assert server.push(3, g(100)) == []     # late: dropped, held
    assert policy.dropped == 1
    assert server.push(1, g(2)) == []
    assert server.push(2, g(4)) == [3, 1, 2]
    np.testing.assert_array_equal(server.steps[-1], g(3))     # mean of 2 and 4 only
    assert policy.applied == 4 and policy.staleness == [0, 0, 0, 0]


def test_quorum_averages_a_late_push_in_with_late_apply():
    policy = quorum(2, "apply")
    server = Server(policy, [1, 2, 3])
    server.push(1, g(1))
    server.push(2, g(3))
    server.push(3, g(9))                    # late by one version: counted, not fresh
    assert policy.version == 1
    server.push(1, g(2))
    assert server.push(2, g(4)) == [3, 1, 2]
    np.testing.assert_array_equal(server.steps[-1], g(5))     # (9 + 2 + 4) / 3
    assert policy.staleness == [0, 0, 1, 0, 0] and policy.dropped == 0


def test_quorum_hold_all_waits_for_every_worker():
    policy = quorum(1)
    server = Server(policy, [1, 2, 3])
    assert server.push(2, g(1), hold_all=3) == []
    assert server.push(1, g(2), hold_all=3) == []
    assert server.push(3, g(6), hold_all=3) == [2, 1, 3]
    np.testing.assert_array_equal(server.steps[-1], g(3))
    assert policy.version == 1


def test_quorum_step_clears_the_accumulator():
    policy = quorum(1)
    server = Server(policy, [1])
    server.push(1, g(4))
    server.push(1, g(2))
    np.testing.assert_array_equal(server.steps[-1], g(2))
    assert not np.any(policy.acc)


@pytest.mark.parametrize("q,late", [(0, "drop"), (2, "keep"), (-1, "apply")])
def test_quorum_rejects_bad_settings(q, late):
    with pytest.raises(ValueError, match="allowed"):
        QuorumPolicy(q, late, COUNT)


@st.composite
def schedules(draw):
    workers = draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["async", "drop", "apply"]))
    q = draw(st.integers(1, workers))
    hold_all = draw(st.sampled_from([None, workers])) if kind != "async" else None
    picks = draw(st.lists(st.integers(0, 10**6), min_size=1, max_size=30))
    values = draw(st.lists(st.integers(-50, 50), min_size=len(picks), max_size=len(picks)))
    return workers, kind, q, hold_all, picks, values


@settings(max_examples=80, deadline=None)
@given(schedules())
def test_random_arrival_orders_keep_the_books(case):
    workers, kind, q, hold_all, picks, values = case
    policy = AsyncPolicy() if kind == "async" else quorum(q, kind)
    ids = list(range(1, workers + 1))
    server = Server(policy, ids)
    ready, held = set(ids), []                 # who may push; who waits for a round
    sent = dict.fromkeys(ids, 0)
    version, counted, fresh, staleness = 0, [], 0, []
    last_sent = dict(sent)
    for pushes, (pick, value) in enumerate(zip(picks, values, strict=True), 1):
        assert ready, "every worker is held and no round can complete"
        w = sorted(ready)[pick % len(ready)]
        ready.discard(w)
        stale = version - sent[w]
        if kind in ("async", "apply") or stale == 0:
            counted.append(value)
            staleness.append(stale)
        fresh += stale == 0
        held.append(w)
        due = kind == "async" or fresh >= q and (hold_all is None or len(held) >= hold_all)
        steps_before = len(server.steps)
        released = server.push(w, g(value), hold_all=hold_all)
        if due:
            assert len(server.steps) == steps_before + 1
            np.testing.assert_allclose(server.steps[-1], g(np.mean(counted)), rtol=1e-12)
            assert released == held
            version += 1
            for r in released:
                sent[r] = version
            ready |= set(released)
            held, counted, fresh = [], [], 0
        else:
            assert released == [] and len(server.steps) == steps_before
        assert policy.version == version
        assert policy.applied == len(staleness)
        assert policy.applied + policy.dropped == pushes
        assert all(policy.sent_version[r] >= last_sent[r] for r in ids)   # versions only grow
        last_sent = dict(policy.sent_version)
    assert len(policy.staleness) == policy.applied
    assert policy.staleness == staleness
    assert all(s >= 0 for s in policy.staleness)


def round_trip(policy, fresh):
    buf = io.BytesIO()
    torch.save(policy.state(), buf)
    buf.seek(0)
    fresh.load_state(torch.load(buf, weights_only=True))
    return fresh


@pytest.mark.parametrize("make", [AsyncPolicy, lambda: quorum(2, "drop")],
                         ids=["async", "quorum"])
def test_state_round_trip_continues_identically(make):
    a = make()
    server = Server(a, [1, 2, 3])
    for w, v in ((1, 1), (2, 2), (3, 3), (1, 4), (2, 5)):   # ends at a round boundary
        server.push(w, g(v))
    b = round_trip(a, make())
    for name in ("version", "applied", "dropped", "staleness", "sent_version"):
        assert getattr(b, name) == getattr(a, name), name
    other = Server(b, [])
    for w, v in ((3, 7), (1, 8), (2, 9)):
        assert server.push(w, g(v)) == other.push(w, g(v))
    assert other.steps
    np.testing.assert_array_equal(np.array(server.steps[-len(other.steps):]),
                                  np.array(other.steps))
    assert a.staleness == b.staleness and a.version == b.version


# -- ShardOptimizer: one parameter shard's optimizer (gorila) ---------------------------------
@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("shards", [2, 3, 7])
def test_shards_stepped_on_slices_end_identical_to_one_optimizer(kind, shards):
    from mpirl.parts.server import ShardOptimizer

    rng = np.random.default_rng(3)
    start = rng.standard_normal(1001).astype(np.float32)
    pushes = [rng.standard_normal(1001).astype(np.float32) for _ in range(30)]
    whole = start.copy()
    one = ShardOptimizer(whole, lr=1e-2, kind=kind)
    split = start.copy()
    edges = np.linspace(0, 1001, shards + 1).round().astype(int)
    parts = [ShardOptimizer(split[lo:hi], lr=1e-2, kind=kind)
             for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
    for grad in pushes:
        one.step(grad)
        for opt, lo, hi in zip(parts, edges[:-1], edges[1:], strict=True):
            opt.step(grad[lo:hi])
    assert not np.array_equal(whole, start)              # the steps moved the parameters
    assert whole.tobytes() == split.tobytes()            # bit for bit


def test_a_shard_optimizer_steps_its_view_in_place_and_refuses_unknown_kinds():
    from mpirl.parts.server import ShardOptimizer

    buf = np.zeros(10, dtype=np.float32)
    ShardOptimizer(buf[2:5], lr=0.5, kind="sgd").step(np.ones(3, dtype=np.float32))
    assert buf.tolist() == [0, 0, -0.5, -0.5, -0.5, 0, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="kind='rmsprop'; allowed: adam, sgd"):
        ShardOptimizer(buf, lr=0.1, kind="rmsprop")
