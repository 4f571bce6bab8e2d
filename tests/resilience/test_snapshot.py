"""The parameter server's snapshot bookkeeping (no MPI): when one is due, which flag each
reply carries, closing, pruning old generations, stop snapshots."""

from __future__ import annotations

import pytest

from mpirl.resilience.checkpoint import generation_dir, generations
from mpirl.resilience.snapshot import PARAMS, SNAPSHOT, SNAPSHOT_STOP, Snapshots

WORKERS = {1, 2, 3}


class Saver:
    """A server's save(generation): writes its file of that generation."""

    def __init__(self, run_dir):
        self.run_dir, self.calls = run_dir, []

    def __call__(self, generation):
        self.calls.append(generation)
        path = generation_dir(self.run_dir, generation)
        path.mkdir(parents=True, exist_ok=True)
        (path / "rank0000.pt").write_bytes(b"x")


def flag_all(snaps, workers=WORKERS):
    return {w: snaps.flag(w) for w in sorted(workers)}


def test_due_every_n_versions(tmp_path):
    snaps = Snapshots(tmp_path, every=3)
    assert [v for v in range(1, 10) if snaps.due(v)] == [3, 6, 9]


def test_every_zero_is_due_only_on_a_stop_request(tmp_path):
    snaps = Snapshots(tmp_path, every=0)
    assert not any(snaps.due(v) for v in range(1, 10))
    snaps.request_stop(WORKERS, ending=True)       # ending: nothing opened
    assert snaps.open is None and snaps.due(5)


def test_not_due_while_one_is_open(tmp_path):
    snaps = Snapshots(tmp_path, every=1)
    snaps.start(WORKERS)
    assert not snaps.due(1)


def test_outside_a_snapshot_every_reply_carries_params(tmp_path):
    snaps = Snapshots(tmp_path, every=2)
    assert snaps.pending is None and not snaps.complete
    assert flag_all(snaps) == dict.fromkeys(sorted(WORKERS), PARAMS)


def test_each_pending_worker_is_flagged_once(tmp_path):
    snaps = Snapshots(tmp_path, every=2)
    snaps.start(WORKERS)
    assert snaps.generation == 1 and snaps.pending == WORKERS
    assert snaps.flag(2) == SNAPSHOT
    assert snaps.flag(2) == PARAMS                 # its second reply: a plain one
    assert snaps.flag(9) == PARAMS                 # not a worker of this snapshot
    assert snaps.pending == {1, 3} and not snaps.complete
    assert flag_all(snaps, {1, 3}) == {1: SNAPSHOT, 3: SNAPSHOT}
    assert snaps.complete


def test_start_copies_the_worker_set(tmp_path):
    workers = set(WORKERS)
    snaps = Snapshots(tmp_path, every=1)
    snaps.start(workers)
    snaps.flag(1)
    assert workers == WORKERS


def test_stop_request_with_none_open_starts_a_stop_snapshot(tmp_path):
    snaps = Snapshots(tmp_path, every=5)
    snaps.request_stop(WORKERS, ending=False)
    assert snaps.open is not None and snaps.open.stop and snaps.generation == 1
    assert flag_all(snaps) == dict.fromkeys(sorted(WORKERS), SNAPSHOT_STOP)
    save = Saver(tmp_path)
    assert snaps.close(save, WORKERS, ending=False) is True
    assert save.calls == [1] and snaps.open is None


def test_stop_request_during_a_regular_snapshot_follows_it(tmp_path):
    snaps = Snapshots(tmp_path, every=5)
    snaps.start(WORKERS)
    snaps.flag(1)
    snaps.request_stop(WORKERS, ending=False)
    assert not snaps.open.stop and snaps.generation == 1      # the open one stays regular
    assert flag_all(snaps) == {1: PARAMS, 2: SNAPSHOT, 3: SNAPSHOT}
    save = Saver(tmp_path)
    assert snaps.close(save, {2, 3}, ending=False) is False
    assert snaps.open.stop and snaps.generation == 2 and snaps.pending == {2, 3}
    assert flag_all(snaps, {2, 3}) == {2: SNAPSHOT_STOP, 3: SNAPSHOT_STOP}
    assert snaps.close(save, {2, 3}, ending=False) is True
    assert save.calls == [1, 2]


def test_stop_requested_when_ending_opens_nothing_after_close(tmp_path):
    snaps = Snapshots(tmp_path, every=5)
    snaps.start(WORKERS)
    snaps.request_stop(WORKERS, ending=True)
    flag_all(snaps)
    assert snaps.close(Saver(tmp_path), WORKERS, ending=True) is False
    assert snaps.open is None


def test_close_saves_counts_and_prunes_all_but_the_last_two_generations(tmp_path):
    snaps = Snapshots(tmp_path, every=1)
    save = Saver(tmp_path)
    for g in range(1, 4):                              # older generations on disk
        generation_dir(tmp_path, g).mkdir(parents=True)
    snaps.load_state({"generation": 3, "snapshots": 3, "snapshot_s": 0.0})
    for expected in (4, 5, 6):
        snaps.start(WORKERS)
        flag_all(snaps)
        assert snaps.complete
        assert snaps.close(save, WORKERS, ending=False) is False
        assert generations(tmp_path) == [expected - 1, expected]
    assert save.calls == [4, 5, 6]
    assert snaps.taken == 6 and snaps.seconds > 0.0


def test_close_keeps_a_newer_incomplete_generation(tmp_path):
    snaps = Snapshots(tmp_path, every=1)
    generation_dir(tmp_path, 7).mkdir(parents=True)    # e.g. a worker ahead of the server
    snaps.start(WORKERS)
    flag_all(snaps)
    snaps.close(Saver(tmp_path), WORKERS, ending=False)
    assert generations(tmp_path) == [1, 7]


def test_abandon_drops_a_regular_snapshot(tmp_path):
    snaps = Snapshots(tmp_path, every=1)
    snaps.start(WORKERS)
    assert snaps.abandon() is True
    assert snaps.open is None and snaps.pending is None
    assert Snapshots(tmp_path, every=1).abandon() is True        # none open


def test_abandon_keeps_a_stop_snapshot(tmp_path):
    snaps = Snapshots(tmp_path, every=1)
    snaps.request_stop(WORKERS, ending=False)
    assert snaps.abandon() is False
    assert snaps.open is not None and snaps.open.stop and snaps.pending == WORKERS


def test_state_round_trip(tmp_path):
    snaps = Snapshots(tmp_path, every=2)
    for _ in range(2):
        snaps.start(WORKERS)
        flag_all(snaps)
        snaps.close(Saver(tmp_path), WORKERS, ending=False)
    state = snaps.state()
    assert state["generation"] == 2 and state["snapshots"] == 2
    assert state["snapshot_s"] == snaps.seconds > 0
    other = Snapshots(tmp_path, every=2)
    other.load_state(state)
    assert (other.generation, other.taken, other.seconds) == (2, 2, snaps.seconds)
    other.start(WORKERS)
    assert other.generation == 3


@pytest.mark.parametrize("stop", [False, True])
def test_complete_needs_every_worker_flagged(tmp_path, stop):
    snaps = Snapshots(tmp_path, every=1)
    snaps.stop_requested = stop
    snaps.start({4})
    assert snaps.open.stop is stop and not snaps.complete
    assert snaps.flag(4) == (SNAPSHOT_STOP if stop else SNAPSHOT)
    assert snaps.complete
