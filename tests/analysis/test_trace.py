"""``python -m analysis.trace``: a real run's log as Chrome Trace Event JSON, checked the
way a viewer reads it (the format's fields; spans on one track nesting, as Perfetto
requires) and against the log's own phase totals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict

import pytest

from analysis.load import load_run
from conftest import ROOT, TINY_ASYNC as ASYNC, TINY_SYNC_2R as SYNC_2R

PHASE_LANES = {"env": "env_s", "forward": "forward_s", "backward": "backward_s",
               "optimizer": "optimizer_s", "exchange": "exchange_s"}


def trace(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analysis.trace", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def written(tiny_sweep, tmp_path, name: str, *extra) -> dict:
    out = tmp_path / f"{name}.json"
    result = trace(tiny_sweep / name, "-o", out, *extra)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"wrote {out}: ")
    return json.loads(out.read_text())


def check_format(events: list[dict]) -> None:
    """The Trace Event Format's fields, and every track's spans nesting."""
    tracks = defaultdict(list)
    for e in events:
        assert e["ph"] in {"M", "X", "C"}, e
        assert isinstance(e["pid"], int) and isinstance(e["name"], str) and e["name"]
        if e["ph"] == "M":
            assert e["name"] in {"process_name", "process_sort_index", "thread_name",
                                 "thread_sort_index"} and isinstance(e["args"], dict)
        elif e["ph"] == "X":
            assert isinstance(e["tid"], int) and e["ts"] >= 0 and e["dur"] >= 0
            # Perfetto: tid == pid is the process's main thread, and tid 0 lands on it
            assert e["tid"] not in (0, e["pid"]), e
            # whole nanoseconds, as a viewer converts them
            for key in ("ts", "dur"):
                assert round(e[key] * 1000) == pytest.approx(e[key] * 1000, abs=1e-6)
            tracks[(e["pid"], e["tid"])].append((round(e["ts"] * 1000),
                                                 round((e["ts"] + e["dur"]) * 1000)))
        else:
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values())
    for key, spans in tracks.items():
        stack = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], f"track {key}: a span crosses its parent"
            stack.append(end)


def test_sync_trace_has_a_process_per_rank_and_a_track_per_phase(tiny_sweep, tmp_path):
    doc = written(tiny_sweep, tmp_path, SYNC_2R)
    events = doc["traceEvents"]
    check_format(events)
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "rank 0: worker", 1: "rank 1: worker"}
    lanes = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"update", "env", "forward", "backward", "exchange", "optimizer"} <= lanes
    spans = [e for e in events if e["ph"] == "X"]
    # the exchange's wait and transfer lie on its track, inside it
    assert {"exchange: waiting", "exchange: transfer"} <= {e["name"] for e in spans}
    # each lane's seconds are the log's seconds of that phase
    run = load_run(tiny_sweep / SYNC_2R)
    for rank, u in run.updates.groupby("rank"):
        for lane, column in PHASE_LANES.items():
            total = sum(e["dur"] for e in spans if e["pid"] == rank and e["name"] == lane)
            assert total / 1e6 == pytest.approx(u[column].sum(), rel=1e-3), (rank, lane)
        updates = [e for e in spans if e["pid"] == rank and e["cat"] == "update"]
        assert len(updates) == len(u)
        counted = [e for e in events if e["ph"] == "C" and e["pid"] == rank
                   and e["name"] == "bytes per update"]
        assert sum(e["args"]["sent"] for e in counted) == u["bytes_sent"].sum() > 0


def test_a_server_process_is_named_by_its_role(tiny_sweep, tmp_path):
    events = written(tiny_sweep, tmp_path, ASYNC)["traceEvents"]
    check_format(events)
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names[0] == "rank 0: server" and names[1] == "rank 1: worker"


def test_a_window_and_a_rank_subset_keep_only_their_updates(tiny_sweep, tmp_path):
    whole = [e for e in written(tiny_sweep, tmp_path, SYNC_2R)["traceEvents"] if e["ph"] == "X"]
    end = max(e["ts"] + e["dur"] for e in whole) / 1e6
    lo, hi = end / 3, end / 2
    part = written(tiny_sweep, tmp_path, SYNC_2R, "--window", lo, hi, "--ranks", 1)
    spans = [e for e in part["traceEvents"] if e["ph"] == "X"]
    check_format(part["traceEvents"])
    assert 0 < len(spans) < len(whole) / 3
    assert {e["pid"] for e in part["traceEvents"]} == {1}
    updates = [e for e in spans if e["cat"] == "update"]
    assert all(e["ts"] <= hi * 1e6 and e["ts"] + e["dur"] >= lo * 1e6 for e in updates)
    assert part["otherData"]["ranks"] == [1] and part["otherData"]["window_s"] == [lo, hi]


@pytest.mark.parametrize("args, message", [
    (["--window", "5", "1"], "--window 5 1: allowed: 0 <= FROM_S < TO_S"),
    (["--ranks", "7"], "--ranks 7: allowed: 0-1 (the run has 2 ranks)")])
def test_bad_input_is_one_line_and_exit_2(tiny_sweep, tmp_path, args, message):
    result = trace(tiny_sweep / SYNC_2R, "-o", tmp_path / "t.json", *args)
    assert result.returncode == 2 and result.stderr.strip() == f"analysis.trace: error: {message}"
    result = trace(tmp_path / "none", "-o", tmp_path / "t.json")
    assert result.returncode == 2 and "no such directory" in result.stderr
