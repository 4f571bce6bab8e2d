"""Name the rank that died: a tiny watcher process per rank, for deaths that leave no word.

A rank killed with SIGKILL (the OOM killer, ``kill -9``, a segfault in a C library) can
print nothing, and MPICH's launcher then kills every other rank at once with SIGKILL, so
no survivor can speak either; all the launcher says is "BAD TERMINATION ... PID p"
(measured with MPICH 5.0.2: it names *a* killed process, often not the one that died
first, and never the rank or the update).

So each rank, once its run directory exists, starts a *sentinel*: a separate Python
process (``python -S``, standard library only, about 10 MB) in its own session, holding
the read end of a pipe whose write end only the rank holds.  When the rank's process
ends, for whatever reason, the kernel closes the pipe and the sentinel wakes within
milliseconds.  The rank publishes where it is into a small memory-mapped status file
(``RUN_DIR/.status/rankNNNN``: pid, host, update, what it is doing; a few hundred
nanoseconds per update, written by :class:`mpirl.resilience.watchdog.Watchdog`), and
says when it leaves cleanly or has already printed its own error.  On an unexplained
death the sentinel first mends the files the rank was writing (``mend``: its HDF5 log,
whose flush the death may have cut; :mod:`mpirl.telemetry.superblock`, run with
``runpy``), then stamps the time into the status file, waits a moment for the other
sentinels to stamp theirs, and the sentinel of the rank that died *first* prints one
line: which rank (pid, host), at which update, doing what, and what the others were
doing.  The others stay silent.  Its stderr is the rank's, so the launcher forwards the
line like any output of the rank.

Limits: "first" is decided by wall-clock stamps taken as each sentinel wakes; the
launcher's kill reaches the survivors milliseconds after the first death (6-30 ms
measured here), so on a heavily overloaded node a sentinel woken late could misname
the rank; across nodes it relies on the nodes' clocks agreeing to that precision.  A
rank that dies before its run directory exists has no sentinel (start-up errors are
reported by :mod:`mpirl.run` itself).
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

#: status file layout: magic, state, rank, pid, update, beat time, death time (or, for a
#: REPORTED rank, when it reported), host, where
_LAYOUT = struct.Struct("<4siii q d d 64s 256s")
_MAGIC = b"MPRS"
RUNNING, CLEAN, REPORTED = 0, 1, 2      # states; REPORTED: the rank printed its own error
_STATE_AT = 4
_UPDATE_AT = 16
_DEATH_AT = 32
_WHERE_AT = 104

_current: "Sentinel | None" = None


def status_dir(run_dir: Path) -> Path:
    return Path(run_dir) / ".status"


class Sentinel:
    """This rank's status file and the watcher process that reports its death."""

    def __init__(self, run_dir: Path, rank: int, mend: tuple = (), mender: str = "") -> None:
        """``mend``: files to pass to ``repair(path)`` of the stdlib-only module file
        ``mender`` when the rank dies without a word."""
        self.rank = rank
        folder = status_dir(run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"rank{rank:04d}"
        with open(self.path, "wb") as f:
            f.write(_LAYOUT.pack(_MAGIC, RUNNING, rank, os.getpid(), 0, time.time(), 0.0,
                                 socket.gethostname().encode()[:64], b"starting"))
        self._file = open(self.path, "r+b")
        self._map = mmap.mmap(self._file.fileno(), _LAYOUT.size)
        read_end, self._write_end = os.pipe()
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-S", "-c", _WATCHER, str(read_end), str(self.path),
                 _LAYOUT.format, str(_DEATH_AT), mender, *map(str, mend)],
                pass_fds=(read_end,), start_new_session=True, stdin=subprocess.DEVNULL)
        except OSError as err:           # no watcher: the run goes on, deaths go unnamed
            print(f"mpirl: rank {rank}: could not start the death watcher ({err})",
                  file=sys.stderr, flush=True)
            self._child = None
        finally:
            os.close(read_end)

    def publish(self, update: int, where: str) -> None:
        """Where this rank is now (what the sentinel reports if the rank dies here)."""
        struct.pack_into("<q d", self._map, _UPDATE_AT, update, time.time())
        encoded = where.encode()[:255]
        self._map[_WHERE_AT:_WHERE_AT + 256] = encoded.ljust(256, b"\0")

    def close(self, state: int = CLEAN) -> None:
        """The rank is leaving: cleanly, or having printed its own error (REPORTED)."""
        global _current
        struct.pack_into("<i", self._map, _STATE_AT, state)
        if state == REPORTED:
            struct.pack_into("<d", self._map, _DEATH_AT, time.time())   # when it spoke
        self._map.flush()
        os.write(self._write_end, b"x")   # anything but EOF: "not a death"
        os.close(self._write_end)
        if self._child is not None:
            try:
                self._child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._child.kill()
        self._map.close()
        self._file.close()
        if _current is self:
            _current = None


def start(run_dir: Path, rank: int, mend: tuple = (), mender: str = "") -> Sentinel:
    """Start this rank's sentinel; :func:`publish` and :func:`reported` then reach it."""
    global _current
    _current = Sentinel(run_dir, rank, mend, mender)
    return _current


def publish(update: int, where: str) -> None:
    if _current is not None:
        _current.publish(update, where)


def reported() -> None:
    """This rank printed its own error and is ending the job: no death report for it,
    nor for the ranks the launcher kills because of it."""
    if _current is not None:
        struct.pack_into("<i", _current._map, _STATE_AT, REPORTED)
        struct.pack_into("<d", _current._map, _DEATH_AT, time.time())   # when it spoke
        _current._map.flush()


def read_status(path: Path) -> dict | None:
    """One status file as a dict (None if unreadable); also used by tests."""
    try:
        raw = Path(path).read_bytes()[:_LAYOUT.size]
        magic, state, rank, pid, update, beat, death, host, where = _LAYOUT.unpack(raw)
    except (OSError, struct.error):
        return None
    if magic != _MAGIC:
        return None
    return {"state": state, "rank": rank, "pid": pid, "update": update, "beat_t": beat,
            "death_t": death, "host": host.rstrip(b"\0").decode(errors="replace"),
            "where": where.rstrip(b"\0").decode(errors="replace")}


# The watcher: standard library only (it runs under ``python -S``, before and after the
# rank's own modules are gone).  argv: the pipe's read end, this rank's status file, the
# status layout, the death time's offset in it, the mending module's file ('' for none)
# and the files to mend.
_WATCHER = r'''
import os, struct, sys, time
from pathlib import Path
LAYOUT, DEATH_AT = struct.Struct(sys.argv[3]), int(sys.argv[4])
fd, path = int(sys.argv[1]), Path(sys.argv[2])
try:
    data = os.read(fd, 1)
except OSError:
    data = b""
if data:                                   # the rank said goodbye: nothing to report
    sys.exit(0)
died = time.time()
def load(p):
    try:
        m, state, rank, pid, update, beat, death, host, where = LAYOUT.unpack(
            p.read_bytes()[:LAYOUT.size])
    except Exception:
        return None
    return dict(state=state, rank=rank, pid=pid, update=update, beat=beat, death=death,
                host=host.rstrip(b"\0").decode(errors="replace"),
                where=where.rstrip(b"\0").decode(errors="replace"))
me = load(path)
if me is None or me["state"] != 0:         # left cleanly, or printed its own error
    sys.exit(0)
with open(path, "r+b") as f:
    f.seek(DEATH_AT)
    f.write(struct.pack("<d", died))
if sys.argv[5]:                            # files the death may have cut in mid-write
    import runpy
    repair = runpy.run_path(sys.argv[5])["repair"]
    for cut in map(Path, sys.argv[6:]):
        try:
            if cut.is_file() and repair(cut):
                print(f"mpirl: rank {me['rank']} died inside a write of {cut.name}: its "
                      "end-of-file address was moved to the file's end (every table reads "
                      "again)", file=sys.stderr, flush=True)
        except Exception as err:           # never in the way of the death report
            print(f"mpirl: could not check {cut.name}: {err}", file=sys.stderr, flush=True)
time.sleep(0.5)                            # let the other ranks' sentinels stamp theirs
everyone = [s for s in (load(p) for p in sorted(path.parent.glob("rank*"))) if s]
# A rank that reported its own error before this one died caused the end (abort_job
# waits 0.5 s before MPI_Abort, so its victims die later than that); an error reported
# after, or within 0.2 s (a peer's MPI noticing this death first), is a consequence.
if any(s["state"] == 2 and s["death"] < died - 0.2 for s in everyone):
    sys.exit(0)
dead = sorted((s for s in everyone if s["state"] == 0 and s["death"] > 0),
              key=lambda s: s["death"])
if not dead or dead[0]["rank"] != me["rank"]:
    sys.exit(0)                            # not the first to die: the first one speaks
others = [s for s in everyone if s["rank"] != me["rank"]]
def doing(s):
    return f"rank {s['rank']} {s['where'] or 'starting'}"
msg = (f"mpirl: rank {me['rank']} (pid {me['pid']} on {me['host']}) died without a word "
       f"at update {me['update']}, {me['where'] or 'starting'} "
       f"(last report {died - me['beat']:.1f} s before)")
if others:
    msg += "; the others last reported: " + "; ".join(doing(s) for s in others[:6])
    if len(others) > 6:
        msg += f"; ... ({len(others) - 6} more)"
run_dir = path.parent.parent
if (run_dir / "checkpoints").is_dir():
    msg += f"; checkpoints kept: continue with  python -m mpirl.run --resume {run_dir}"
print(msg, file=sys.stderr, flush=True)
'''
