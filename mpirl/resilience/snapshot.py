"""The parameter server's side of a consistent snapshot taken without stopping the world.

The protocol (worker side and why it is consistent: :mod:`mpirl.designs.paramserver`):
the server opens *generation G*, flags the next reply to each live worker, takes pushes
only from workers not yet flagged, and when every live worker has been flagged writes
its own checkpoint of G and closes the snapshot.  This class keeps that state: which
generation is open, which workers still wait for their flag, whether it is a stop
snapshot, and what snapshots cost.  It sends nothing: the server asks it which flag a
reply carries.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import checkpoint

#: what a reply carries (the server maps them to its message tags)
PARAMS, SNAPSHOT, SNAPSHOT_STOP = "params", "snapshot", "snapshot_stop"


@dataclass
class Open:
    """An open snapshot: the workers whose flagged reply is still to be sent."""

    generation: int
    pending: set[int]
    stop: bool
    start: float = field(default_factory=time.perf_counter)


class Snapshots:
    """Snapshot generations of one parameter server: every ``every`` versions (0: only
    on a stop request), and the one a SIGTERM/SIGINT asks for."""

    def __init__(self, run_dir: Path, every: int) -> None:
        self.run_dir, self.every = run_dir, every
        self.generation = 0                 # the newest opened
        self.open: Open | None = None
        self.stop_requested = False
        self.taken, self.seconds = 0, 0.0   # completed, and the server's time in them

    @property
    def pending(self) -> set[int] | None:
        """The workers whose push the server may take now (None: any)."""
        return None if self.open is None else self.open.pending

    @property
    def complete(self) -> bool:
        """Every live worker has been flagged: the server's own side is due."""
        return self.open is not None and not self.open.pending

    def due(self, version: int) -> bool:
        """A snapshot should start now (none is open)."""
        if self.open is not None:
            return False
        return self.stop_requested or bool(self.every) and version % self.every == 0

    def start(self, workers: set[int]) -> None:
        self.generation += 1
        self.open = Open(self.generation, set(workers), stop=self.stop_requested)

    def request_stop(self, workers: set[int], ending: bool) -> None:
        """A signal (here or on a worker): a stop snapshot, after the open one if any;
        none when the run is ``ending`` anyway (its budget is spent)."""
        self.stop_requested = True
        if self.open is None and not ending:
            self.start(workers)

    def flag(self, worker: int) -> str:
        """What the reply to ``worker`` carries: PARAMS, or its snapshot flag."""
        if self.open is None or worker not in self.open.pending:
            return PARAMS
        self.open.pending.discard(worker)
        return SNAPSHOT_STOP if self.open.stop else SNAPSHOT

    def abandon(self) -> bool:
        """The budget is spent: a regular snapshot still open is dropped (its files are an
        incomplete generation, removed at the end); returns False, keeping it, for a stop
        snapshot, which the run must finish."""
        if self.open is not None and self.open.stop:
            return False
        self.open = None
        return True

    def close(self, save: Callable[[int], None], workers: set[int], ending: bool) -> bool:
        """Write the server's side (``save(generation)``), delete generations no longer
        needed, and open the stop snapshot if one was asked for meanwhile.  Returns True
        when the closed snapshot was a stop snapshot: the server then ends."""
        snap, self.open = self.open, None
        self.taken += 1
        saving = time.perf_counter()
        self.seconds += saving - snap.start
        save(snap.generation)
        self.seconds += time.perf_counter() - saving
        # every worker pushed again after writing generation G-1 before it could be
        # flagged for G: G-1 is complete on every rank, older ones are not needed
        checkpoint.remove_generations(self.run_dir, lambda g: g >= snap.generation - 1)
        if snap.stop:
            return True
        if self.stop_requested and not ending:
            self.start(workers)
        return False

    def state(self) -> dict:
        return {"generation": self.generation, "snapshots": self.taken,
                "snapshot_s": self.seconds}

    def load_state(self, state: dict) -> None:
        self.generation = state["generation"]
        self.taken, self.seconds = state["snapshots"], state["snapshot_s"]
