"""What recording an async run's order of events costs, and what replaying it costs.

    python experiments/bench_schedule.py --ranks 4 --steps 20000 --out runs/bench_schedule

For async, quorum, impala, seed, ga3c and apex (a 2x straggler at rank 1, so the order
is not a round robin): one recorded run and its replay (``--replay-schedule``),
interleaved, then

* the recording's cost per event, timed in-process on the same machine
  (:class:`mpirl.resilience.schedule.Schedule.take`, plus the final ``save`` spread over
  the events), as a share of the deciding rank's mean time per event (a server's
  seconds per push taken, a learner's per unroll taken, an inference rank's per
  request, a replay rank's per block, request or batch), from the run's own log, and of
  its working time per event (without its waits for a message); with several deciding
  ranks (apex: the learner and the replay rank), the one where recording costs most;
* the replay's wall time against the recording's (same machine, one after the other);
* whether the replay ended with the recorded parameter SHA-256.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpirl.launch import mpiexec_command  # noqa: E402
from mpirl.resilience.schedule import Schedule, schedule_path  # noqa: E402
from mpirl.telemetry.read import load_run  # noqa: E402
from mpirl.telemetry.schema import PHASES  # noqa: E402

MODES = {"async": ["--mode", "async", "--topology", "star"],
         "quorum": ["--mode", "quorum", "--topology", "star"],
         "impala": ["--mode", "impala"],
         "seed": ["--mode", "seed"],
         "ga3c": ["--mode", "ga3c"],
         "apex": ["--mode", "apex", "--learning-starts", "256", "--replay-batch", "64"]}
#: a deciding rank's phases spent waiting for a message (not its work)
WAITS = ("exchange_s", "data_wait_s", "batch_wait_s")


def per_event_cost_s(events: int = 200_000) -> float:
    """Seconds one recorded event costs (append + its share of the final save)."""
    with tempfile.TemporaryDirectory() as tmp:
        schedule = Schedule(Path(tmp), 0)
        start = time.perf_counter()
        for i in range(events):
            schedule.take(i % 7, i)
        schedule.save()
        return (time.perf_counter() - start) / events


def run(ranks: int, out: Path, name: str, args: list[str]) -> dict:
    cmd = mpiexec_command(ranks, [sys.executable, "-m", "mpirl.run", *args,
                                  "--run-dir", str(out), "--run-name", name])
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=900)
    return json.loads((out / name / "summary.json").read_text())


def deciding_seconds_per_event(run_dir: Path) -> tuple[int, float, float]:
    """Of the deciding ranks (one schedule file each), the one with the least work per
    recorded event: its events, its logged seconds per event, and those not spent
    waiting for a message (its work per event)."""
    u = load_run(run_dir).updates
    working = [p for p in PHASES if p not in WAITS]
    worst = None
    for path in sorted((run_dir / "schedule").glob("rank*.npy")):
        rank = int(path.stem[4:])
        events = max(len(np.load(schedule_path(run_dir, rank))), 1)
        rows = u[u["rank"] == rank]
        found = (events, float(rows["t_s"].max() - rows["t_s"].min()) / events,
                 float(rows[working].to_numpy().sum()) / events)
        if worst is None or found[2] < worst[2]:
            worst = found
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--out", type=Path, default=Path("runs/bench_schedule"))
    args = parser.parse_args(argv)
    cost = per_event_cost_s()
    print(f"recording: {cost * 1e6:.2f} us per event (append + save), timed in-process")
    print("mode    events  s/event(rank 0)  record share  working s/event  record share"
          "  wall rec  wall replay  same SHA")
    for mode, flags in MODES.items():
        base = [*flags, "--total-steps", str(args.steps), "--straggler", "1:2",
                "--checkpoint-every", "0"]
        rec = run(args.ranks, args.out, f"{mode}-rec", base)
        rep = run(args.ranks, args.out, f"{mode}-rep",
                  [*base, "--replay-schedule", str(args.out / f"{mode}-rec")])
        events, per_event, working = deciding_seconds_per_event(args.out / f"{mode}-rec")
        print(f"{mode:7s} {events:6d}  {per_event * 1e3:12.3f} ms  {100 * cost / per_event:9.4f}%"
              f"  {working * 1e3:12.3f} ms  {100 * cost / working:9.4f}%"
              f"  {rec['wall_s']:7.1f}s  {rep['wall_s']:10.1f}s  "
              f"{rec['param_digest'] == rep['param_digest']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
