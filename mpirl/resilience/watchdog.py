"""A watchdog: ends the whole job when a rank's main loop stops making progress.

Every rank's main loop beats once per update; a thread checks the beat and, if none
came for ``--watchdog-s`` seconds, prints which rank, at which update, was stuck for how
long and doing what, and aborts the whole job (MPI_Abort).  Blocking collectives have
no deadline of their own; this is theirs.  Each beat and each "now doing" also reaches
the rank's sentinel (:mod:`mpirl.resilience.sentinel`), which names the rank if its
process dies without a word.
"""

from __future__ import annotations

import threading
import time

from . import sentinel


class Watchdog:
    """Aborts the job when this rank's main loop stops beating for ``timeout_s``."""

    def __init__(self, comm, timeout_s: float, rank: int, *, prog: str = "mpirl.run",
                 unit: str = "update", option: str = "--watchdog-s") -> None:
        self.comm, self.timeout_s, self.rank = comm, timeout_s, rank
        # how the abort message names the program, what a beat counts, and its flag
        self.prog, self.unit, self.option = prog, unit, option
        self.last = time.monotonic()
        self.update = 0
        self.where = "starting"
        self._stop = threading.Event()
        self._thread = None
        if timeout_s > 0:
            self._thread = threading.Thread(target=self._watch, name="mpirl-watchdog",
                                            daemon=True)
            self._thread.start()

    def beat(self, update: int, where: str = "") -> None:
        """An update is done: the clock restarts."""
        self.last = time.monotonic()
        self.update = update
        self.where = where
        sentinel.publish(update, where)

    def at(self, where: str) -> None:
        """Say what this rank is doing now (shown if it stalls there); the clock runs on."""
        self.where = where
        sentinel.publish(self.update, where)

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        period = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(period):
            stalled = time.monotonic() - self.last
            if stalled > self.timeout_s:
                from ..launch import abort_job

                abort_job(self.comm, f"{self.prog}: error: rank {self.rank} made no progress "
                          f"for {stalled:.0f} s after {self.unit} {self.update}, "
                          f"{self.where or 'outside the training loop'} ({self.option} "
                          f"{self.timeout_s:g}); ending the job", 4)
