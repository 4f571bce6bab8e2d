"""PhaseTimer and add_phases, on a clock the test moves by hand."""

from __future__ import annotations

import pytest

from mpirl.telemetry import timing
from mpirl.telemetry.timing import PhaseTimer, add_phases


class Clock:
    def __init__(self, now=100.0):
        self.now = now

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(timing.time, "perf_counter", fake)
    return fake


def test_repeated_sections_accumulate(clock):
    timer = PhaseTimer()
    for seconds in (1.0, 2.5, 0.25):
        with timer("env_s"):
            clock.advance(seconds)
        clock.advance(10.0)                     # outside any section: not counted
    with timer("forward_s"):
        clock.advance(0.5)
    assert timer.totals == {"env_s": 3.75, "forward_s": 0.5}
    assert timer.total() == 4.25


def test_nested_sections_each_count_their_own_time(clock):
    """Phases are exclusive: a row's phases add up to the time they took, once."""
    timer = PhaseTimer()
    with timer("outer"):
        clock.advance(1.0)
        with timer("inner"):
            clock.advance(2.0)
            with timer("innermost"):
                clock.advance(4.0)
        clock.advance(0.5)
    with timer("after"):
        clock.advance(8.0)
    assert timer.take() == {"outer": 1.5, "inner": 2.0, "innermost": 4.0, "after": 8.0}
    # the same phase inside itself (a server's optimizer_s around Learner.apply's)
    with timer("optimizer_s"):
        clock.advance(1.0)
        with timer("optimizer_s"):
            clock.advance(2.0)
    assert timer.take() == {"optimizer_s": 3.0}
    assert timer.total() == 0.0


def test_take_hands_over_totals_and_starts_afresh(clock):
    timer = PhaseTimer()
    with timer("a"):
        clock.advance(2.0)
    assert timer.take() == {"a": 2.0}
    assert timer.take() == {}
    assert timer.total() == 0.0
    assert timer.started_at("a") is None
    with timer("a"):
        clock.advance(1.0)
    assert timer.take() == {"a": 1.0}


def test_started_at_is_the_first_entry_since_the_last_take(clock):
    timer = PhaseTimer()
    assert timer.started_at("exchange_s") is None
    clock.advance(5.0)
    with timer("exchange_s"):
        clock.advance(1.0)
    with timer("exchange_s"):
        clock.advance(1.0)
    assert timer.started_at("exchange_s") == 105.0
    timer.take()
    with timer("exchange_s"):
        pass
    assert timer.started_at("exchange_s") == 107.0


def test_an_exception_inside_a_section_is_timed_and_propagates(clock):
    timer = PhaseTimer()
    with pytest.raises(RuntimeError, match="boom"):
        with timer("backward_s"):
            clock.advance(0.75)
            raise RuntimeError("boom")
    assert timer.take() == {"backward_s": 0.75}


def test_take_returns_a_dict_later_sections_do_not_change(clock):
    timer = PhaseTimer()
    with timer("a"):
        clock.advance(1.0)
    taken = timer.take()
    with timer("a"):
        clock.advance(1.0)
    assert taken == {"a": 1.0}


def test_real_clock_measures_something():
    timer = PhaseTimer()
    with timer("busy"):
        sum(range(10000))
    assert timer.total() > 0.0


def test_add_phases_adds_into_the_running_totals():
    into = {"env_s": 1.0}
    out = add_phases(into, {"env_s": 0.5, "forward_s": 2.0})
    assert out is into
    assert into == {"env_s": 1.5, "forward_s": 2.0}
    assert add_phases(into, {}) == {"env_s": 1.5, "forward_s": 2.0}
