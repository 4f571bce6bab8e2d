"""A run given a wall-time budget (``mpirl.launch.run_for``, used by the timed
experiment scripts) is stopped as a batch system's time limit stops it: SIGTERM to a
real mpiexec reaches every rank, each ends by itself, and the call says the limit
stopped it; a job that ends first, fails, or ignores the SIGTERM is told apart."""

from __future__ import annotations

import sys
import time

import pytest

from mpirl.launch import mpiexec_command, run_for

#: every rank waits (up to 60 s) for SIGTERM, then writes its file and exits 0
WAITER = """
import os, signal, sys, time
done = []
signal.signal(signal.SIGTERM, lambda *a: done.append(1))
rank = os.environ.get("PMI_RANK", "?")
print("ready", rank, flush=True)
for _ in range(600):
    if done:
        break
    time.sleep(0.1)
open(os.path.join(sys.argv[1], "stopped-" + rank), "w").write("by SIGTERM" if done else "")
"""


def test_the_time_limit_stops_every_rank_by_sigterm(tmp_path):
    # 6 s: every rank has its handler long before (a bare Python starts in well under
    # a second, even with both cores loaded)
    nranks = 3
    cmd = mpiexec_command(nranks, [sys.executable, "-c", WAITER, str(tmp_path)])
    start = time.monotonic()
    assert run_for(cmd, 6.0, grace_s=60) is True
    assert time.monotonic() - start < 50        # stopped by the signal, not its 60 s
    files = sorted(p.name for p in tmp_path.glob("stopped-*"))
    assert files == [f"stopped-{r}" for r in range(nranks)]
    assert all(p.read_text() == "by SIGTERM" for p in tmp_path.glob("stopped-*"))


def test_a_job_that_ends_first_or_fails_is_told_apart(tmp_path):
    assert run_for(mpiexec_command(2, [sys.executable, "-c", "pass"]), 60.0) is False
    with pytest.raises(RuntimeError, match="exit status 3 before the time limit"):
        run_for(mpiexec_command(2, [sys.executable, "-c", "raise SystemExit(3)"]), 60.0)


def test_a_job_ignoring_sigterm_is_killed_after_the_grace(tmp_path):
    deaf = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(120)")
    log = tmp_path / "out.log"
    start = time.monotonic()
    with open(log, "w") as out, pytest.raises(RuntimeError, match="no exit within 2 s"):
        # started with python directly (no mpiexec: MPICH's hydra ends its ranks on a
        # second SIGTERM by itself), so nothing but the group kill can end it
        run_for([sys.executable, "-c", deaf], 5.0, grace_s=2, stdout=out)
    assert time.monotonic() - start < 60
    assert "ready" in log.read_text()
