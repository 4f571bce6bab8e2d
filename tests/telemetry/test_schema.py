"""The schema's fill rows: what a kill in the middle of a flush leaves, and readers that
drop it; reading rows of an older schema."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from mpirl.telemetry.h5log import RankLog
from mpirl.telemetry.read import rows_until
from mpirl.telemetry.schema import (EPISODE_DTYPE, FAILURE_DTYPE, SIM_STEP_DTYPE, TABLES,
                                    UPDATE_DTYPE, UPDATE_UNSET, fill_row, upgrade, written)


def test_fill_rows_are_marked_in_every_table():
    for _, dtype in TABLES:
        row = fill_row(dtype)
        assert row["update"] == -1
        for name in dtype.names:
            kind = dtype[name].kind
            assert (row[name] == -1) if kind == "i" else \
                np.isnan(row[name]) if kind == "f" else row[name] == b""


def torn_log(tmp_path, rows: int, torn: int):
    """A rank log whose last flush was cut after its tables grew and before their rows
    landed: what HDF5 leaves when the metadata of the new extent reaches the disk first."""
    log = RankLog(tmp_path, 1, "worker", flush_every=4)
    for update in range(1, rows + 1):
        log.add_update({"update": update, "t_s": log.now(), "env_s": 0.001, "env_steps": 8})
        log.episode(update, 1.0, 5)
    log.close()
    with h5py.File(log.path, "a") as f:
        for name in ("updates", "episodes"):
            f[name].resize((f[name].shape[0] + torn,))
    return log.path


def test_a_torn_flush_reads_as_fill_rows_everywhere_and_readers_drop_them(tmp_path):
    path = torn_log(tmp_path, rows=8, torn=3)
    with h5py.File(path, "r") as f:                       # any reader sees them, marked
        raw = f["updates"][...]
    assert len(raw) == 11 and list(raw["update"][-3:]) == [-1, -1, -1]
    assert np.isnan(raw["t_s"][-3:]).all() and (raw["env_steps"][-3:] == -1).all()
    kept, _ = rows_until(path, None)                      # resume's reader
    assert list(kept["updates"]["update"]) == list(range(1, 9))
    assert list(kept["episodes"]["update"]) == list(range(1, 9))
    # a resumed log starts from the written rows only
    RankLog(tmp_path, 1, "worker", 4, resume_update=6)
    with h5py.File(path, "r") as f:
        assert list(f["updates"]["update"]) == list(range(1, 7))


def test_written_keeps_every_real_row():
    rows = np.zeros(3, UPDATE_DTYPE)
    rows["update"] = [0, 1, 2]          # a server's version 0 is a real row
    assert len(written(rows)) == 3
    assert len(written(np.zeros(0, SIM_STEP_DTYPE))) == 0


def test_upgrade_fills_what_an_older_schema_lacks():
    old = np.zeros(2, np.dtype([("update", "i8"), ("t_s", "f8")]))
    old["update"], old["t_s"] = [1, 2], [0.5, 1.5]
    new = upgrade(old, UPDATE_DTYPE)
    assert list(new["update"]) == [1, 2] and list(new["t_s"]) == [0.5, 1.5]
    assert np.isnan(new["policy_loss"]).all() and (new["staleness"] == -1).all()
    assert upgrade(np.zeros(1, EPISODE_DTYPE), EPISODE_DTYPE).dtype == EPISODE_DTYPE
    assert upgrade(np.zeros(1, FAILURE_DTYPE), FAILURE_DTYPE).dtype == FAILURE_DTYPE


def test_an_update_row_holds_what_it_was_given_and_the_unset_values(tmp_path):
    log = RankLog(tmp_path, 0, "worker", flush_every=4)
    log.add_update({"update": 1, "t_s": 0.5, "env_s": 0.25, "env_steps": 64,
                    "policy_loss": -1.5})
    log.close()
    with h5py.File(log.path, "r") as f:
        row = f["updates"][0]
    assert (row["update"], row["t_s"], row["env_s"], row["env_steps"]) == (1, 0.5, 0.25, 64)
    assert row["policy_loss"] == -1.5 and row["backward_s"] == 0.0 and row["dropped"] == 0
    for field, unset in UPDATE_UNSET.items():
        if field == "policy_loss":
            continue                      # given
        assert row[field] == unset or (np.isnan(unset) and np.isnan(row[field])), field
    with pytest.raises(KeyError):
        log.add_update({"update": 2, "t_s": 1.0, "no_such_column": 1})
