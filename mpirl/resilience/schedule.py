"""Reproducible asynchronous runs: record the order of events that decided the result,
and replay a run with that order enforced.

An asynchronous design's result depends on arrival order: which worker's push the
server took next (async, quorum; each shard server of gorila or ``async --servers``),
which actor's unroll the learner took and when it stepped (impala), which actors'
requests made each forward pass (seed; ga3c's predictor, and when it took the
trainer's parameters), and in apex which replay's batch or actor's parameter request
the learner took next, and in what order each replay rank took blocks, took requests
and answered them.  Everything else a rank does is a function of its seed and of what
it was sent, so the order is all that needs recording.  Every run records it, one
file per deciding rank (:func:`deciding_ranks`): ``schedule/rankNNNN.npy``, an int64
array of rows ``(who, version)``: the rank whose message was taken (or a marker below)
and the parameter version that message was computed on (the version that rank had
been given), or for a marker what it says:

* :data:`STEP`: the learner updated here (impala), or a forward pass ended (seed,
  ga3c), with the version it ran with;
* :data:`PARAMS`: ga3c's predictor took the trainer's reply, with the version it then
  acted with;
* :data:`REQUEST` / :data:`ANSWER`: a replay rank took a sample request from / sent a
  batch to the sampler in ``version``'s place;
* :data:`BATCH`: a gorila worker over replay ranks looked for its batch, ``version`` 1
  if it had arrived (it trained), 0 if not (it collected more).

Recording is one list append per event; the file is written at the run's end.

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

from .. import registry

STEP = -1            # the event "the learner took an update step here"
PARAMS = -3          # ga3c's predictor took the trainer's reply here
REQUEST = -4         # a replay rank took a sample request (version: the sampler)
ANSWER = -5          # a replay rank answered a sample request (version: the sampler)
BATCH = -6           # a gorila service worker looked for its batch (version: 1 if there)
#: the designs whose runs can be replayed (the deciding ranks record their order)
REPLAYABLE = tuple(name for name, d in registry.DESIGNS.items() if d.replayable)
#: fields a replay may change: where its files go, and the replay itself
#: (deadlines end a run that hangs, and how replies progress moves the same bytes:
#: they change no result)
FREE_FIELDS = ("run_dir", "run_name", "replay_schedule", "log_every", "wait_timeout_s",
               "watchdog_s", "reply_progress")


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

    def upcoming(self) -> tuple[int, int] | None:
        """The next recorded event (not taken), or None past the recorded run's end."""
        k = len(self.events)
        if self.recorded is None or k >= len(self.recorded):
            return None
        return int(self.recorded[k, 0]), int(self.recorded[k, 1])

    def group(self) -> list[int]:
        """Who the recorded events up to the next :data:`STEP` are from (not taken)."""
        if self.recorded is None:
            return []
        k = len(self.events)
        whos = self.recorded[k:, 0]
        ends = np.flatnonzero(whos == STEP)
        if not len(ends):
            raise ScheduleDiverged(f"the replay needs a group from event {k + 1}, but the "
                                   "recorded run ends without one")
        return [int(w) for w in whos[:ends[0]]]

    def take(self, who: int, version: int) -> None:
        """Record an event (checked against the recorded one when replaying)."""
        if self.recorded is not None:
            k = len(self.events)
            want = tuple(int(x) for x in self.recorded[k]) if k < len(self.recorded) else None
            if want != (who, version):
                self.events.append((who, version))
                diverged = self.path.with_suffix(".diverged.npy")
                self._save(diverged)
                raise ScheduleDiverged(f"event {k + 1}: recorded {want}, replayed "
                                       f"{(who, version)} (who, parameter version); the "
                                       f"replayed events are in {diverged}")
        self.events.append((who, version))

    def save(self) -> None:
        self._save(self.path)

    def _save(self, path: Path) -> None:
        path.parent.mkdir(exist_ok=True)
        np.save(path, np.asarray(self.events, dtype=np.int64).reshape(-1, 2))


def deciding_ranks(cfg, world_size: int) -> list[int]:
    """The ranks whose order a run of ``cfg`` records (one schedule file each): the
    design registry's ``deciding`` (:mod:`mpirl.registry`)."""
    return registry.design(cfg.mode).deciding(cfg, world_size)
