"""Mending the one thing a kill in the middle of an HDF5 flush can leave unreadable.

Standard library only: the rank's sentinel (:mod:`mpirl.resilience.sentinel`) runs this
file with ``runpy`` when its rank dies, before anyone reads the log.

HDF5 without SWMR writes a flush's metadata in no guaranteed order and the superblock
last (:mod:`mpirl.telemetry.h5log`).  A writer killed in between can leave new objects
(a table's chunk, a B-tree node) written past the end-of-file address that the
superblock still records: the file opens, but reading those tables fails with "addr
overflow ... eoa = ...".  Everything they need was written, up to the file's real end.
:func:`repair` moves the superblock's end-of-file address to that end (what
``h5clear --increment`` does, without the increment) and rewrites its checksum; where
only the zeros of the writer's room for its next flush lie past the address, it cuts
the file back to it instead.

A kill rarely lands inside a flush (a fraction of a percent of a run's time) and rarely
leaves this behind when it does; how rarely, measured: docs/log-schema.md.

Superblock version 2 and 3 layout (HDF5 File Format Specification, section II.A), with
8-byte offsets and lengths: signature (8), version (1), size of offsets (1), size of
lengths (1), file consistency flags (1), base address (8), superblock extension
address (8), end-of-file address (8), root group object header address (8), checksum
(4, Jenkins' lookup3 over the 44 bytes before it).
"""

from __future__ import annotations

import os
import struct

SIGNATURE = b"\x89HDF\r\n\x1a\n"
_LAYOUT = struct.Struct("<8sBBBBQQQQI")          # versions 2 and 3, 8-byte offsets
_EOA_AT = 28                                       # offset of the end-of-file address
_MASK = 0xFFFFFFFF


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _MASK


def lookup3(data: bytes, initval: int = 0) -> int:
    """Bob Jenkins' lookup3 ``hashlittle`` (HDF5's metadata checksum)."""
    length = len(data)
    a = b = c = (0xDEADBEEF + length + initval) & _MASK
    i = 0
    while length - i > 12:
        a = (a + int.from_bytes(data[i:i + 4], "little")) & _MASK
        b = (b + int.from_bytes(data[i + 4:i + 8], "little")) & _MASK
        c = (c + int.from_bytes(data[i + 8:i + 12], "little")) & _MASK
        a = (a - c) & _MASK; a ^= _rot(c, 4); c = (c + b) & _MASK       # noqa: E702
        b = (b - a) & _MASK; b ^= _rot(a, 6); a = (a + c) & _MASK       # noqa: E702
        c = (c - b) & _MASK; c ^= _rot(b, 8); b = (b + a) & _MASK       # noqa: E702
        a = (a - c) & _MASK; a ^= _rot(c, 16); c = (c + b) & _MASK      # noqa: E702
        b = (b - a) & _MASK; b ^= _rot(a, 19); a = (a + c) & _MASK      # noqa: E702
        c = (c - b) & _MASK; c ^= _rot(b, 4); b = (b + a) & _MASK       # noqa: E702
        i += 12
    if length - i == 0:
        return c
    tail = data[i:] + bytes(12 - (length - i))
    a = (a + int.from_bytes(tail[0:4], "little")) & _MASK
    b = (b + int.from_bytes(tail[4:8], "little")) & _MASK
    c = (c + int.from_bytes(tail[8:12], "little")) & _MASK
    c ^= b; c = (c - _rot(b, 14)) & _MASK                               # noqa: E702
    a ^= c; a = (a - _rot(c, 11)) & _MASK                               # noqa: E702
    b ^= a; b = (b - _rot(a, 25)) & _MASK                               # noqa: E702
    c ^= b; c = (c - _rot(b, 16)) & _MASK                               # noqa: E702
    a ^= c; a = (a - _rot(c, 4)) & _MASK                                # noqa: E702
    b ^= a; b = (b - _rot(a, 14)) & _MASK                               # noqa: E702
    c ^= b; c = (c - _rot(b, 24)) & _MASK                               # noqa: E702
    return c


def read(path) -> dict | None:
    """The superblock's fields, or None when the file has no version 2/3 superblock at
    offset 0 with 8-byte offsets and a valid checksum (nothing this module may touch)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(_LAYOUT.size)
    except OSError:
        return None
    if len(raw) < _LAYOUT.size:
        return None
    sig, version, offsets, lengths, flags, base, ext, eoa, root, checksum = _LAYOUT.unpack(raw)
    if sig != SIGNATURE or version not in (2, 3) or offsets != 8 or lengths != 8 \
            or lookup3(raw[:-4]) != checksum:
        return None
    return {"version": version, "flags": flags, "base": base, "eoa": eoa, "root": root}


def repair(path) -> bool:
    """Move a stale end-of-file address to the file's end; True when it was stale.

    A log whose writer died between flushes also runs past its address: the room the
    writer keeps for its next flush, a hole of zeros (:mod:`mpirl.telemetry.h5log`).
    Nothing HDF5 wrote lies there, so the file is cut back to the address instead."""
    block = read(path)
    if block is None or block["base"] != 0:
        return False
    size = os.path.getsize(path)
    if block["eoa"] >= size:
        return False
    with open(path, "r+b") as f:
        f.seek(block["eoa"])
        if not f.read().strip(b"\0"):
            f.truncate(block["eoa"])
            return False
        f.seek(0)
        raw = bytearray(f.read(_LAYOUT.size))
        raw[_EOA_AT:_EOA_AT + 8] = struct.pack("<Q", size)
        raw[-4:] = struct.pack("<I", lookup3(bytes(raw[:-4])))
        f.seek(0)
        f.write(raw)
    return True
