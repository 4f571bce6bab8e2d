"""Per-update phase timers: where each second of each rank went."""

from __future__ import annotations

import time
from contextlib import contextmanager


class PhaseTimer:
    """Accumulates wall time per named phase until :meth:`take` hands it over."""

    __slots__ = ("totals",)

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.totals[phase] = self.totals.get(phase, 0.0) + time.perf_counter() - start

    def take(self) -> dict[str, float]:
        """The totals since the last call, and a fresh start."""
        totals, self.totals = self.totals, {}
        return totals
