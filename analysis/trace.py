"""``python -m analysis.trace RUN -o trace.json``: a run's per-rank timeline as Chrome
Trace Event JSON, for Perfetto (ui.perfetto.dev, "Open trace file") or chrome://tracing.

* One process per rank, named with its role (``rank 0: server``) and sorted by rank.
* One track (thread) per phase lane: ``update`` (the whole update, with its counters in
  ``args``), env, forward, straggler slowdown, backward, exchange (its ``exchange:
  waiting`` and ``exchange: transfer`` spans nested inside it), optimizer, and the
  roles' own lanes (an actor's waits for actions or parameters, sending; an inference
  rank's batching wait and replies; a learner's wait for data and publishing; replay).
  Only lanes a rank used appear.
* ``X`` (complete) events, ``ts`` and ``dur`` in microseconds since the run started,
  laid out from the HDF5 log as the timeline figure lays them out
  (:mod:`analysis.spans`: phases in turn from the update's start, the exchange at its
  measured time where the log has it, every span inside its update).
* Counters (``C`` events) per rank: bytes sent and received per update, and the env
  steps the rank has collected.

Big runs: ``--window FROM_S TO_S`` keeps the updates that overlap that stretch of run
time, ``--ranks 0 3 5`` those ranks; the command prints the events written and the
file's size.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from .load import load_run
from .spans import EXCHANGE_PARTS, PART_LABELS, ROW_ORDER, spans

#: track ids: the update lane first, then one per phase in layout order (the exchange's
#: parts share the exchange's track)
UPDATE_TID = 0
TIDS = {part: i + 1 for i, part in enumerate(ROW_ORDER)}
TIDS.update({part: TIDS["exchange_s"] for part in EXCHANGE_PARTS})
LANE_NAMES = {UPDATE_TID: "update", **{TIDS[p]: PART_LABELS[p] for p in ROW_ORDER}}
NS = 1e9


def thread_id(rank: int, lane: int) -> int:
    """The ``tid`` of ``lane`` (:data:`UPDATE_TID`, :data:`TIDS`) in rank ``rank``'s
    process: never 0 and never the rank's ``pid`` (Perfetto takes a thread whose tid is
    its pid for the process's main thread, sorts it first and draws tid 0's spans on it,
    so lanes would merge and lose their names), the same lane order in every rank."""
    return 1000 * (rank + 1) + lane


def _us(start_s: float, end_s: float) -> tuple[float, float]:
    """``ts`` and ``dur`` in microseconds, both whole nanoseconds: a span inside another
    stays inside after rounding, as a viewer reading them to integer ns sees it."""
    lo, hi = round(start_s * NS), round(end_s * NS)
    return lo / 1e3, (hi - lo) / 1e3


def select(updates: pd.DataFrame, window: tuple[float, float] | None,
           ranks: list[int] | None) -> pd.DataFrame:
    """The update rows that overlap ``window`` (run seconds) on ``ranks``."""
    u = updates
    if ranks is not None:
        u = u[u["rank"].isin(ranks)]
    if window is not None:
        lo, hi = window
        u = u[(u["t_run_s"] + u["busy_s"] >= lo) & (u["t_run_s"] <= hi)]
    return u


def trace_events(run, window: tuple[float, float] | None = None,
                 ranks: list[int] | None = None) -> list[dict]:
    """The run's Trace Event Format events (metadata, X spans, C counters)."""
    u = select(run.updates, window, ranks).sort_values(["rank", "t_run_s"])
    phase = spans(u, run.config["mode"])
    events: list[dict] = []
    roles = u.groupby("rank")["role"].first()
    for rank, role in roles.items():
        rank = int(rank)
        events += [{"ph": "M", "name": "process_name", "pid": rank,
                    "args": {"name": f"rank {rank}: {role}"}},
                   {"ph": "M", "name": "process_sort_index", "pid": rank,
                    "args": {"sort_index": rank}}]
        used = {UPDATE_TID, *(TIDS[p] for p in phase.loc[phase["rank"] == rank, "part"])}
        for tid in sorted(used):
            events += [{"ph": "M", "name": "thread_name", "pid": rank,
                        "tid": thread_id(rank, tid), "args": {"name": LANE_NAMES[tid]}},
                       {"ph": "M", "name": "thread_sort_index", "pid": rank,
                        "tid": thread_id(rank, tid), "args": {"sort_index": tid}}]
    spans_out = []
    steps = u.groupby("rank")["env_steps"].cumsum()
    for r, collected in zip(u.itertuples(), steps, strict=True):
        rank = int(r.rank)
        ts, dur = _us(r.t_run_s, r.t_run_s + r.busy_s)
        spans_out.append({"ph": "X", "cat": "update", "name": f"update {r.update}", "pid": rank,
                          "tid": thread_id(rank, UPDATE_TID), "ts": ts, "dur": dur,
                          "args": {"update": int(r.update), "env_steps": int(r.env_steps),
                                   "bytes_sent": int(r.bytes_sent),
                                   "bytes_recv": int(r.bytes_recv),
                                   "other_s": float(r.other_s)}})
        events += [{"ph": "C", "name": "bytes per update", "pid": rank, "ts": ts + dur,
                    "args": {"sent": int(r.bytes_sent), "received": int(r.bytes_recv)}},
                   {"ph": "C", "name": "env steps collected", "pid": rank, "ts": ts + dur,
                    "args": {"env_steps": int(collected)}}]
    for s in phase.itertuples():
        ts, dur = _us(s.start_s, s.end_s)
        spans_out.append({"ph": "X", "cat": "phase", "name": PART_LABELS[s.part],
                          "pid": int(s.rank), "tid": thread_id(int(s.rank), TIDS[s.part]),
                          "ts": ts, "dur": dur,
                          "args": {"update": int(s.update)}})
    # per track in time order, an enclosing span before the spans it holds
    spans_out.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"]))
    return events + spans_out


def write_trace(run, out: Path, window: tuple[float, float] | None = None,
                ranks: list[int] | None = None) -> int:
    """Write ``run``'s (:func:`analysis.load_run`) trace file; returns the number of
    events."""
    events = trace_events(run, window, ranks)
    doc = {"traceEvents": events, "displayTimeUnit": "ms",
           "otherData": {"run": run.name, "design": run.label, "env": run.config["env"],
                         "world_size": int(run.meta["world_size"]),
                         "window_s": list(window) if window else None,
                         "ranks": ranks}}
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    return len(events)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.trace", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run directory (holding run.h5)")
    parser.add_argument("-o", "--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--window", nargs=2, type=float, metavar=("FROM_S", "TO_S"),
                        help="keep updates overlapping this stretch of run time (seconds)")
    parser.add_argument("--ranks", nargs="+", type=int, metavar="RANK",
                        help="keep these ranks only")
    args = parser.parse_args(argv)
    if not (args.run / "run.h5").is_file():
        what = "no such directory" if not args.run.exists() else "not a run directory (no run.h5)"
        print(f"analysis.trace: error: {args.run}: {what}", file=sys.stderr)
        return 2
    if args.window and not 0 <= args.window[0] < args.window[1]:
        print(f"analysis.trace: error: --window {args.window[0]:g} {args.window[1]:g}: "
              "allowed: 0 <= FROM_S < TO_S", file=sys.stderr)
        return 2
    if args.out.is_dir():
        print(f"analysis.trace: error: -o {args.out}: is a directory; allowed: a file path",
              file=sys.stderr)
        return 2
    run = load_run(args.run)
    world = run.meta["world_size"]
    bad = [r for r in args.ranks or () if not 0 <= r < world]
    if bad:
        print(f"analysis.trace: error: --ranks {' '.join(map(str, bad))}: allowed: 0-"
              f"{world - 1} (the run has {world} ranks)", file=sys.stderr)
        return 2
    n = write_trace(run, args.out, tuple(args.window) if args.window else None,
                    args.ranks)
    size = args.out.stat().st_size
    print(f"wrote {args.out}: {n} events, {size / 2**20:.1f} MiB; open it in "
          "ui.perfetto.dev or chrome://tracing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
