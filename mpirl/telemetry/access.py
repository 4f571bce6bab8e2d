"""Opening the logs for reading, whatever state their writers are in.

Pandas-free, so that a rank resuming its own log (:class:`mpirl.telemetry.h5log.RankLog`)
pays no table library at start; :mod:`mpirl.telemetry.read` builds its tables on these.
A closed file, one a kill left behind, and one a running rank is still flushing into
(:func:`read_h5`) all open here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import h5py
import numpy as np

from .schema import TABLES, upgrade, written

T = TypeVar("T")


def open_h5(path: str | Path) -> h5py.File:
    """Open an mpirl HDF5 file for reading, whatever state its writer left it in.

    Files of schema 4 open plainly even after a crash.  Older logs were written in SWMR
    mode, and one whose writer was killed carries HDF5's "open for write" flag: it is
    opened in SWMR-read mode instead, which that flag does not stop."""
    try:
        return h5py.File(path, "r")
    except OSError as err:
        if "open for write" not in str(err):
            raise
        return h5py.File(path, "r", libver="latest", swmr=True)


def open_run(run_h5: str | Path) -> h5py.File:
    """``run.h5`` for reading: metadata, and every rank's file through ``/ranks/NNNN``."""
    return open_h5(run_h5)


#: how long :func:`read_h5` keeps trying a file that a writer keeps flushing into
LIVE_READ_DEADLINE_S = 10.0
#: longer than a flush (about a millisecond): a file that did not change in this long
#: after a failed read has no flush going on
_SETTLE_S = 0.05


def _stamp(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def read_h5(path: str | Path, read: Callable[[h5py.File], T]) -> T:
    """``read(f)`` on ``path`` opened with :func:`open_h5`, all in one open, once more
    each time it fails while a writer's flush is changing the file.

    A running rank's log is appended to in place (:mod:`mpirl.telemetry.h5log`): a reader
    that opens it in the middle of a flush, or reads tables after a flush it did not
    see, can find it half-written.  Such a failure leaves the file changing: read again.
    A failure on a file that stays unchanged is the file's own and is raised, as is
    anything after :data:`LIVE_READ_DEADLINE_S`."""
    path = Path(path)
    deadline = time.monotonic() + LIVE_READ_DEADLINE_S
    while True:
        before = _stamp(path)
        try:
            with open_h5(path) as f:
                return read(f)
        except (OSError, KeyError):      # h5py: KeyError when an object's header is bad
            time.sleep(_SETTLE_S)
            if _stamp(path) == before or time.monotonic() > deadline:
                raise


def rows_until(path: Path, update: int | None, counts: dict[str, int] | None = None
               ) -> tuple[dict, float]:
    """Rows of a rank log (also one left by a crash) with ``update <= update`` (any
    update when None); of a table named in ``counts``, at most its first that many rows
    of those.  Returns ``({table: rows}, start_unix_s)``."""
    def read(f: h5py.File) -> tuple[dict, float]:
        out = {}
        for name, dtype in TABLES:
            rows = written(upgrade(f[name][...], dtype)) if name in f else np.zeros(0, dtype)
            if update is not None:
                rows = rows[rows["update"] <= update]
            if name in (counts or {}):
                rows = rows[:counts[name]]
            out[name] = rows
        return out, float(f.attrs["start_unix_s"])
    return read_h5(path, read)
