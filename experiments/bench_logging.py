"""What the measuring costs: logging and phase timers as a share of update time.

    python experiments/bench_logging.py runs/sweeps/topologies      # any runs or sweeps

* Writer: every update row carries ``log_s``, the seconds the previous row cost to
  record (filling the row, appending, flushing every K rows).  Its share is
  ``sum(log_s) / sum(update time)`` per rank, read back from the runs' own logs.
* Timers: a :class:`mpirl.telemetry.timing.PhaseTimer` section costs the same whatever it times;
  its cost is measured here (best of 5 x 100k empty sections) and multiplied by the
  sections an update opens (2 per rollout step, plus the last value, backward,
  exchange, optimizer and straggle).

The issue's bound is 2% of an update; the table prints the worst rank of each run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis import load_sweep  # noqa: E402
from mpirl.telemetry.schema import PHASES  # noqa: E402
from mpirl.telemetry.timing import PhaseTimer  # noqa: E402


def timer_section_cost(n: int = 100_000) -> float:
    timer, best = PhaseTimer(), float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            with timer("x"):
                pass
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def main(paths: list[str]) -> None:
    sweep = load_sweep(*paths)
    section = timer_section_cost()
    print(f"PhaseTimer section: {section * 1e6:.2f} us")
    print(f"{'run':42} {'ms/update':>9} {'writer %':>9} {'timers %':>9} {'total %':>8}")
    worst = 0.0
    for name, run in sorted(sweep.by_name.items()):
        u = run.updates
        per_rank = []
        for _, r in u.groupby("rank"):
            period = r[list(PHASES)].sum(axis=1).sum() + r["log_s"].sum()
            sections = 2 * run.config["rollout_steps"] + 5 if (r["role"] == "worker").all() \
                else 2
            per_rank.append((period / len(r), r["log_s"].sum() / period,
                             sections * section * len(r) / period))
        ms, writer, timers = max(per_rank, key=lambda x: x[1] + x[2])
        worst = max(worst, writer + timers)
        print(f"{name:42} {ms * 1e3:9.2f} {100 * writer:9.3f} {100 * timers:9.3f} "
              f"{100 * (writer + timers):8.3f}")
    print(f"worst rank of any run: {100 * worst:.3f}% of its update time")


if __name__ == "__main__":
    main(sys.argv[1:] or ["runs/sweeps"])
