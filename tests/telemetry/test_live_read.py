"""Reading a rank log while its writer is still appending to it (a notebook watching a
run): :func:`mpirl.telemetry.read.read_h5` and the writer's room ahead of each flush."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpirl.telemetry.h5log import RankLog
from mpirl.telemetry.read import LIVE_READ_DEADLINE_S, read_h5

TABLE_NAMES = ("updates", "episodes", "sim_steps")


def write_for(run_dir: Path, seconds: float, started, pace_s: float = 0.003) -> None:
    """A rank's log written at a run's pace: a flush every 7 updates of ``pace_s`` each
    (3 ms: a CartPole update)."""
    log = RankLog(run_dir, 0, "worker", 7)
    started.set()
    t0, update = time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        update += 1
        log.add_update({"update": update, "t_s": log.now()})
        log.episode(update, 1.0, 10)
        log.sim_times(update, np.full((8, 2), 1e-3))
        time.sleep(pace_s)
    log.close()


@pytest.fixture
def live_log(tmp_path):
    """A rank log another process keeps flushing into for 6 s."""
    started = mp.get_context("spawn").Event()
    writer = mp.get_context("spawn").Process(target=write_for, args=(tmp_path, 6.0, started))
    writer.start()
    try:
        assert started.wait(60), "the writer never started"
        time.sleep(0.5)
        yield tmp_path / "rank0000.h5"
    finally:
        writer.join(60)
        if writer.is_alive():
            writer.kill()
    assert writer.exitcode == 0, "the writer failed while being read"


def test_every_read_of_a_log_being_flushed_succeeds_and_sees_rows_grow(live_log):
    counts = []
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        tables = read_h5(live_log, lambda f: {n: f[n][...] for n in TABLE_NAMES})
        assert (tables["updates"]["update"] >= 0).all()     # no fill rows read as rows
        counts.append(len(tables["updates"]))
    # ~100 flushes went by: without reading again, about one read in ten fails here
    assert len(counts) > 100
    assert counts == sorted(counts) and counts[-1] > counts[0]


def test_read_h5_opens_a_log_flushed_back_to_back_every_time(tmp_path):
    """The live-read guarantee: ``read_h5`` opens and reads a rank log whose writer
    flushes back to back, every time.  (A plain ``h5py.File(path, "r")`` on a live file
    can fail now and then, "truncated file", when an open meets a flush: 49 of 100,000
    with both cores busy, experiments/bench_live_open.py; docs/log-schema.md says which
    reader to use.  Plain opens of a finished or killed writer's file: test_h5log.py.)"""
    started = mp.get_context("spawn").Event()
    writer = mp.get_context("spawn").Process(target=write_for,
                                             args=(tmp_path, 6.0, started, 0.0))
    writer.start()
    opened, failed = 0, []
    try:
        assert started.wait(60), "the writer never started"
        time.sleep(0.3)
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            try:
                read_h5(tmp_path / "rank0000.h5", lambda f: len(f["updates"]))
                opened += 1
            except OSError as err:
                failed.append(str(err))
    finally:
        writer.join(60)
        if writer.is_alive():
            writer.kill()
    assert writer.exitcode == 0
    assert opened > 500 and not failed, (opened, failed[:3])


def test_a_broken_file_that_does_not_change_is_reported_at_once(tmp_path):
    log = RankLog(tmp_path, 0, "worker", 7)
    for update in range(1, 50):
        log.add_update({"update": update, "t_s": log.now()})
    log.close()
    path = tmp_path / "rank0000.h5"
    os.truncate(path, os.stat(path).st_size // 2)
    t0 = time.monotonic()
    with pytest.raises(OSError, match="truncated file"):
        read_h5(path, lambda f: len(f["updates"]))
    assert time.monotonic() - t0 < LIVE_READ_DEADLINE_S / 2
    with pytest.raises(OSError):
        h5py.File(path, "r")
