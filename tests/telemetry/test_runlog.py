"""The run logger counts traffic itself: rows carry what the watched channels moved since
the row before, read back from the HDF5 file."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from mpirl.config import Config
from mpirl.telemetry.read import read_h5
from mpirl.telemetry.runlog import RunLogger
from mpirl.telemetry.schema import written
from mpirl.telemetry.timing import PhaseTimer
from topologies.base import CommStats


class Channel:
    """Anything a role sends through: the logger reads its ``stats``."""

    def __init__(self) -> None:
        self.stats = CommStats()

    def move(self, sent: int, received: int, waited: float = 0.0) -> None:
        self.stats.bytes_sent += sent
        self.stats.bytes_recv += received
        self.stats.wait_s += waited


def rows(tmp_path, role_steps) -> np.ndarray:
    log = RunLogger(Config(run_dir=str(tmp_path)), MPI.COMM_SELF, tmp_path, role="worker")
    role_steps(log)
    log.close()
    return read_h5(tmp_path / "rank0000.h5", lambda f: written(f["updates"][...]))


def test_rows_hold_the_traffic_since_the_row_before(tmp_path):
    a, b = Channel(), Channel()
    a.move(1000, 1000)                                   # before watch: in no row

    def steps(log):
        log.watch(a, b, waits=(a,))
        log.begin()
        a.move(10, 20, 0.5)
        b.move(1, 2, 7.0)                                # b's waits are not the row's
        log.record(1, PhaseTimer())
        log.record(2, PhaseTimer())                      # nothing moved
        a.move(5, 0)
        log.unlogged()                                   # a stream's end: in no row
        b.move(3, 4)
        log.record(3, PhaseTimer())
        assert log.bytes_sent() == 1000 + 10 + 1 + 5 + 3

    u = rows(tmp_path, steps)
    assert u["bytes_sent"].tolist() == [11, 0, 3]
    assert u["bytes_recv"].tolist() == [22, 0, 4]
    assert u["wait_s"].tolist() == [0.5, 0.0, 0.0]


def test_a_role_that_measures_no_waits_leaves_them_unset_and_from_zero_counts_all(tmp_path):
    a = Channel()
    a.move(64, 32)                                       # a first broadcast, before the log

    def steps(log):
        log.watch(a, waits=(), from_zero=True)
        log.begin()
        a.move(8, 8)
        log.record(1, PhaseTimer())

    u = rows(tmp_path, steps)
    assert u["bytes_sent"].tolist() == [72] and u["bytes_recv"].tolist() == [40]
    assert np.isnan(u["wait_s"]).all()
