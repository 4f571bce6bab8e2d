"""What rank 0 (or the parameter server) prints while a run goes, and progress.csv."""

from __future__ import annotations

import csv
import math
import os
import time
from pathlib import Path

from . import tensorboard

COLUMNS = ("update", "env_steps", "wall_s", "episodes", "mean_return", "steps_per_s",
           "comm_share", "mean_staleness", "wait_role", "wait_share", "actors_wait_share")


class Progress:
    """One CSV row and one console line per report; a no-op on ranks that do not report."""

    def __init__(self, run_dir: Path, enabled: bool, *, resume: bool = False,
                 elapsed_s: float = 0.0) -> None:
        self.enabled = enabled
        self.start = time.perf_counter() - elapsed_s   # a resumed run counts on
        self._file = None
        self.run_dir = run_dir
        self.lines = 0                                 # progress.csv's, below its header
        if enabled:
            self._open(append=resume)

    def _open(self, append: bool) -> None:
        path = self.run_dir / "progress.csv"
        append = append and path.is_file()
        self.lines = len(whole_lines(path)) if append else 0
        self._file = open(path, "a" if append else "w", newline="")
        self._csv = csv.writer(self._file)
        if not append:
            self._csv.writerow(COLUMNS)

    def take_over(self) -> None:
        """This rank reports from now on (the reporting rank failed and the run went on)."""
        if not self.enabled:
            self.enabled = True
            self._open(append=True)

    def report(self, *, update: int, env_steps: int, episodes: float, return_sum: float,
               comm_share: float | None, mean_staleness: float = math.nan,
               waiting: tuple[str, float] | None = None,
               actors_waiting: float | None = None) -> None:
        """One line: ``comm_share`` is the workers' exchange share (the gradient
        designs); ``waiting`` the reporting rank's role and its share of time waiting for
        peers (designs whose reporting rank sees no one else's time: a learner, an
        inference rank), printed as ``learner waits 23%``; ``actors_waiting`` the mean
        of the actors' own shares, as their last messages told (``actors wait 80%``)."""
        if not self.enabled:
            return
        comm_share = math.nan if comm_share is None else comm_share
        role, wait = waiting if waiting is not None else ("", math.nan)
        actors = math.nan if actors_waiting is None else actors_waiting
        wall = time.perf_counter() - self.start
        mean = return_sum / episodes if episodes else math.nan
        rate = env_steps / wall if wall > 0 else math.nan
        episodes = int(episodes)
        self.lines += 1
        self._csv.writerow([update, env_steps, f"{wall:.3f}", episodes, f"{mean:.3f}",
                            f"{rate:.1f}", f"{comm_share:.4f}", f"{mean_staleness:.3f}", role,
                            f"{wait:.4f}", f"{actors:.4f}"])
        self._file.flush()
        stale = "" if math.isnan(mean_staleness) else f"  staleness {mean_staleness:5.2f}"
        tensorboard.scalars({"return/mean": mean, "throughput/env_steps_per_s": rate,
                             "exchange/comm_share": comm_share,
                             **({f"wait/{role}": wait} if role else {}),
                             **({} if math.isnan(actors) else {"wait/actors": actors}),
                             "lag/mean": mean_staleness}, env_steps)
        share = f"  {role} waits {100 * wait:4.1f}%" if role else \
            ("" if math.isnan(comm_share) else f"  comm {100 * comm_share:4.1f}%")
        share += "" if math.isnan(actors) else f"  actors wait {100 * actors:4.1f}%"
        print(f"update {update:6d}  steps {env_steps:9d}  return {mean:8.2f} "
              f"({episodes:3d} ep)  {rate:7.0f} steps/s{share}{stale}", flush=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def state(self) -> dict:
        """The run's wall time so far (a resumed run counts on from it) and the lines
        progress.csv held (on the reporting rank; 0 elsewhere)."""
        return {"wall_s": self.elapsed(), "progress_lines": self.lines}

    def load_state(self, state: dict) -> None:
        """Count on from the checkpoint's wall time; on the reporting rank, drop the
        lines written after the checkpoint (a killed run wrote them, and the resumed run
        writes them again): all but its ``progress_lines`` first, or, in a checkpoint
        from before they were counted, those beyond its ``env_steps``."""
        self.start = time.perf_counter() - state["wall_s"]
        if self._file is None or not ("progress_lines" in state or "env_steps" in state):
            return
        self._file.close()
        path = self.run_dir / "progress.csv"
        rows = whole_lines(path)
        kept = (rows[:int(state["progress_lines"])] if "progress_lines" in state
                else [r for r in rows if int(r[1]) <= int(state["env_steps"])])
        tmp = path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as f:
            csv.writer(f).writerows([COLUMNS, *kept])
        os.replace(tmp, path)
        self._open(append=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def whole_lines(path: Path) -> list[list[str]]:
    """progress.csv's lines below its header that are whole (a crash can leave a torn
    last one); none when there is no file."""
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return [r for r in rows[1:] if len(r) == len(COLUMNS) and r[1].isdigit()]


def read_progress(run_dir: Path):
    """A run's progress.csv as a numpy record array (fields :data:`COLUMNS`), or None when
    it has no file or no line yet."""
    import numpy as np

    path = Path(run_dir) / "progress.csv"
    if not path.is_file():
        return None
    rows = np.genfromtxt(path, delimiter=",", names=True, ndmin=1, dtype=None,
                         encoding="utf-8")
    return rows if rows.size else None
