"""Mending a superblock whose end-of-file address a kill left behind, and the sentinel
that does it when its rank dies."""

from __future__ import annotations

import os
import struct
import time

import h5py
import numpy as np
import pytest

from mpirl.resilience.sentinel import Sentinel
from mpirl.telemetry import superblock
from mpirl.telemetry.h5log import RankLog

EOA_AT = 28


def log_with_rows(tmp_path, rows: int):
    log = RankLog(tmp_path, 1, "worker", flush_every=5)
    for update in range(1, rows + 1):
        log.add_update({"update": update, "t_s": log.now(), "env_s": 0.001})
        log.episode(update, 1.0, 5)
    log.close()
    return log


def set_eoa(path, eoa: int) -> None:
    """Rewrite the superblock's end-of-file address (with a valid checksum)."""
    with open(path, "r+b") as f:
        raw = bytearray(f.read(48))
        raw[EOA_AT:EOA_AT + 8] = struct.pack("<Q", eoa)
        raw[-4:] = struct.pack("<I", superblock.lookup3(bytes(raw[:-4])))
        f.seek(0)
        f.write(raw)


def stale(tmp_path):
    """A log whose last flush's objects lie past the recorded end of file: the state a
    kill between HDF5 writing them and writing the superblock leaves."""
    log = log_with_rows(tmp_path, 10)
    before = superblock.read(log.path)["eoa"]
    for update in range(11, 21):
        log.add_update({"update": update, "t_s": log.now(), "env_s": 0.001})
        log.episode(update, 1.0, 5)
    log.close()
    assert os.path.getsize(log.path) > before
    set_eoa(log.path, before)
    return log.path


@pytest.mark.parametrize("libver", [("v108", "v108"), ("v110", "v110"), ("latest", "latest")])
def test_the_checksum_is_hdf5s_own(tmp_path, libver):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w", libver=libver) as f:
        f["x"] = np.arange(3)
    block = superblock.read(path)            # None unless lookup3 matched HDF5's checksum
    assert block is not None and block["eoa"] == os.path.getsize(path)
    assert block["version"] == (2 if libver[0] == "v108" else 3)


def test_lookup3_known_values():
    # Bob Jenkins' lookup3.c driver: hashlittle("", 0) and of "Four score and seven years ago"
    assert superblock.lookup3(b"") == 0xDEADBEEF
    assert superblock.lookup3(b"Four score and seven years ago") == 0x17770551
    assert superblock.lookup3(b"Four score and seven years ago", 1) == 0xCD628161


def test_a_stale_end_of_file_address_is_mended(tmp_path):
    path = stale(tmp_path)
    with h5py.File(path, "r") as f, pytest.raises(OSError, match="addr overflow"):
        f["updates"][...]
    assert superblock.repair(path)
    with h5py.File(path, "r") as f:              # every row of both flushes reads again
        assert list(f["updates"]["update"]) == list(range(1, 21))
        assert list(f["episodes"]["update"]) == list(range(1, 21))
    assert not superblock.repair(path)            # once is enough


def test_a_stale_address_is_mended_with_the_writers_room_still_after_it(tmp_path):
    path = stale(tmp_path)
    os.truncate(path, os.path.getsize(path) + 300_000)        # the room, a hole of zeros
    assert superblock.repair(path)
    with h5py.File(path, "r") as f:
        assert list(f["updates"]["update"]) == list(range(1, 21))


def test_a_log_cut_between_flushes_is_trimmed_to_its_address_not_mended(tmp_path):
    log = RankLog(tmp_path, 1, "worker", flush_every=5)
    for update in range(1, 11):
        log.add_update({"update": update, "t_s": log.now()})
    log.flush()                                      # a writer killed now: no close
    eoa = superblock.read(log.path)["eoa"]
    assert os.path.getsize(log.path) > eoa          # the room kept for the next flush
    assert not superblock.repair(log.path)
    assert os.path.getsize(log.path) == eoa
    with h5py.File(log.path, "r") as f:
        assert list(f["updates"]["update"]) == list(range(1, 11))


def test_healthy_and_foreign_files_are_left_alone(tmp_path):
    log = log_with_rows(tmp_path, 7)
    before = log.path.read_bytes()
    assert not superblock.repair(log.path) and log.path.read_bytes() == before
    other = tmp_path / "notes.txt"
    other.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(60))        # signature, bad checksum
    assert superblock.read(other) is None and not superblock.repair(other)
    assert not superblock.repair(tmp_path / "missing.h5")


def test_the_sentinel_mends_its_ranks_log_when_the_rank_dies(tmp_path, capfd):
    path = stale(tmp_path)
    watcher = Sentinel(tmp_path, 1, mend=(path,), mender=superblock.__file__)
    os.close(watcher._write_end)         # the rank's end of the pipe closes: a death
    watcher._child.wait(timeout=30)
    assert "died inside a write of rank0001.h5" in capfd.readouterr().err
    with h5py.File(path, "r") as f:
        assert len(f["updates"]) == 20



def test_a_clean_goodbye_mends_nothing(tmp_path):
    path = stale(tmp_path)
    watcher = Sentinel(tmp_path, 1, mend=(path,), mender=superblock.__file__)
    watcher.close()
    time.sleep(0.1)
    assert superblock.read(path)["eoa"] < os.path.getsize(path)
