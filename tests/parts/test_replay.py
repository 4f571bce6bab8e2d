"""FifoReplay against a list-of-[item, uses left] model of itself."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpirl.parts.replay import FifoReplay


def test_first_in_first_out():
    replay = FifoReplay(capacity=5)
    for item in "abc":
        replay.add(item)
    assert [replay.next() for _ in range(3)] == ["a", "b", "c"]
    assert len(replay) == 0


def test_each_item_is_handed_out_reuse_times_in_a_row():
    replay = FifoReplay(capacity=5, reuse=3)
    replay.add("a")
    replay.add("b")
    assert [replay.next() for _ in range(6)] == ["a"] * 3 + ["b"] * 3
    assert replay.sampled == 6


def test_adding_to_a_full_buffer_evicts_the_oldest():
    replay = FifoReplay(capacity=2, reuse=2)
    for item in (1, 2, 3):
        replay.add(item)
    assert len(replay) == 2 and replay.evicted == 1
    assert [replay.next() for _ in range(4)] == [2, 2, 3, 3]


def test_partly_used_item_is_evicted_with_its_uses_left():
    replay = FifoReplay(capacity=1, reuse=3)
    replay.add("a")
    assert replay.next() == "a"
    replay.add("b")
    assert replay.evicted == 1
    assert [replay.next() for _ in range(3)] == ["b"] * 3


def test_empty_next_raises():
    replay = FifoReplay(capacity=1)
    with pytest.raises(IndexError, match="empty"):
        replay.next()
    replay.add(0)
    replay.next()
    with pytest.raises(IndexError):
        replay.next()


@pytest.mark.parametrize("capacity,reuse", [(0, 1), (1, 0), (-3, 2), (2, -1)])
def test_bad_capacity_or_reuse_raises(capacity, reuse):
    with pytest.raises(ValueError, match="allowed"):
        FifoReplay(capacity, reuse)


def test_state_round_trip_with_encode_and_decode():
    replay = FifoReplay(capacity=3, reuse=2)
    for item in ({"x": 1}, {"x": 2}, {"x": 3}, {"x": 4}):
        replay.add(item)
    replay.next()
    state = replay.state(encode=lambda item: item["x"])
    assert state["items"] == [[2, 1], [3, 2], [4, 2]]
    other = FifoReplay(capacity=3, reuse=2)
    other.load_state(state, decode=lambda x: {"x": x})
    assert (other.inserted, other.evicted, other.sampled) == (4, 1, 1)
    assert [other.next() for _ in range(5)] == [{"x": 2}, {"x": 3}, {"x": 3}, {"x": 4},
                                                 {"x": 4}]
    assert len(other) == 0


@settings(max_examples=80, deadline=None)
@given(capacity=st.integers(1, 4), reuse=st.integers(1, 3),
       ops=st.lists(st.booleans(), max_size=40))
def test_matches_a_model_and_counters_stay_consistent(capacity, reuse, ops):
    replay = FifoReplay(capacity, reuse)
    model: list[list] = []
    used_up = evicted = inserted = 0
    for i, add in enumerate(ops):
        if add:
            if len(model) == capacity:
                model.pop(0)
                evicted += 1
            model.append([i, reuse])
            inserted += 1
            replay.add(i)
        elif model:
            item = model[0][0]
            model[0][1] -= 1
            if model[0][1] == 0:
                model.pop(0)
                used_up += 1
            assert replay.next() == item
        else:
            with pytest.raises(IndexError):
                replay.next()
        assert len(replay) == len(model)
        assert (replay.inserted, replay.evicted) == (inserted, evicted)
        assert replay.inserted == len(replay) + replay.evicted + used_up
        assert replay.state()["items"] == model
