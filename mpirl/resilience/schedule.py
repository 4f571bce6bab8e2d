"""Reproducible asynchronous runs: record the order of events that decided the result,
and replay a run with that order enforced.

An asynchronous design's result depends on arrival order: which worker's push the
server took next (async, quorum; each shard server of gorila or ``async --servers``),
which actor's unroll the learner took and when it stepped (impala).  Everything else a
rank does is a function of its seed and of what it was sent, so the order is all that
needs recording.  Every run records it, one
file per deciding rank: ``schedule/rankNNNN.npy``, an int64 array of rows
``(who, version)``: the rank whose message was taken (or :data:`STEP`, "the learner
updated here", with the version it stepped from) and the parameter version that message
was computed on (the version that rank had been given).  Recording is one list append
per event; the file is written at the run's end.

``--replay-schedule RUN_DIR`` re-runs with RUN_DIR's order enforced: the deciding
rank waits for the scheduled sender's message alone (the others' wait where MPI put
them), and checks that the message's version matches the recorded one, raising
:class:`ScheduleDiverged` at the first event that differs.  A replayed run ends with
the recorded run's parameter SHA-256.  The configuration must be the recorded one
(checked at start); the rank count too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

STEP = -1            # the event "the learner took an update step here"
#: the designs whose runs can be replayed (the deciding ranks record their order)
REPLAYABLE = ("async", "quorum", "impala", "gorila")
#: fields a replay may change: where its files go, and the replay itself
FREE_FIELDS = ("run_dir", "run_name", "replay_schedule", "log_every")


class ScheduleDiverged(RuntimeError):
    """A replayed run took a different turn from the recorded one."""


def schedule_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / "schedule" / f"rank{rank:04d}.npy"


class Schedule:
    """This rank's event order: recorded always, enforced when ``replay_from`` is set."""

    def __init__(self, run_dir: Path, rank: int, replay_from: str = "") -> None:
        self.path = schedule_path(run_dir, rank)
        self.events: list[tuple[int, int]] = []
        self.recorded = None
        if replay_from:
            self.recorded = np.load(schedule_path(replay_from, rank))

    @property
    def replaying(self) -> bool:
        return self.recorded is not None

    def next(self) -> int | None:
        """Who the next event is from (:data:`STEP` for a step), when replaying; else None."""
        if self.recorded is None:
            return None
        if len(self.events) >= len(self.recorded):
            raise ScheduleDiverged(f"the replay needs event {len(self.events) + 1}, but the "
                                   f"recorded run ended after {len(self.recorded)}")
        return int(self.recorded[len(self.events), 0])

    def take(self, who: int, version: int) -> None:
        """Record an event (checked against the recorded one when replaying)."""
        if self.recorded is not None:
            k = len(self.events)
            want = tuple(int(x) for x in self.recorded[k]) if k < len(self.recorded) else None
            if want != (who, version):
                raise ScheduleDiverged(f"event {k + 1}: recorded {want}, replayed "
                                       f"{(who, version)} (who, parameter version)")
        self.events.append((who, version))

    def save(self) -> None:
        self.path.parent.mkdir(exist_ok=True)
        np.save(self.path, np.asarray(self.events, dtype=np.int64).reshape(-1, 2))
