"""Per-update phase timers: where each second of each rank went."""

from __future__ import annotations

import time
from contextlib import contextmanager


class PhaseTimer:
    """Accumulates wall time per named phase until :meth:`take` hands it over, and
    remembers when each phase was first entered since then (the log's ``exchange_t_s``).

    Phases are exclusive, so that a row's phases and its ``other_s`` add up to its time
    (:meth:`mpirl.telemetry.runlog.RunLogger.record`): a phase entered inside another
    (a worker's wait for a replay batch inside its gradient step, a learner publishing
    parameters while it waits for data, ``Learner.apply``'s ``optimizer_s`` inside a
    server's) counts its seconds for itself alone, and the enclosing phase the rest;
    the same phase nested in itself counts once."""

    __slots__ = ("totals", "starts", "_nested")

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.starts: dict[str, float] = {}
        self._nested = 0.0        # seconds of the phases inside the one running now

    @contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        if phase not in self.starts:
            self.starts[phase] = start
        enclosing, self._nested = self._nested, 0.0
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.totals[phase] = self.totals.get(phase, 0.0) + elapsed - self._nested
            self._nested = enclosing + elapsed

    def started_at(self, phase: str) -> float | None:
        """``time.perf_counter()`` when ``phase`` was first entered since the last take."""
        return self.starts.get(phase)

    def total(self) -> float:
        """Seconds in every phase since the last take (nothing is taken)."""
        return sum(self.totals.values())

    def take(self) -> dict[str, float]:
        """The totals since the last call, and a fresh start."""
        totals, self.totals = self.totals, {}
        self.starts = {}
        return totals


def add_phases(into: dict[str, float], phases: dict[str, float]) -> dict[str, float]:
    """Add ``phases``' seconds into ``into`` (a run's running totals); returns ``into``."""
    for phase, seconds in phases.items():
        into[phase] = into.get(phase, 0.0) + seconds
    return into
