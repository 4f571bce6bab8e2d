"""A cluster's name is claimed by whoever runs it (``mpirl.cluster.lifecycle.claimed``):
a second test session or benchmark script of the same name waits for the first instead
of taking its cluster down under its jobs.  Needs no root: the lock lives under
``MPIRL_CLUSTER_STATE_ROOT``, here a temporary directory, and no cluster is built."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from mpirl.cluster import lifecycle, net
from mpirl.cluster.net import ClusterError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = "mpirlclaim"
#: a process that claims NAME, says so, and holds it until stdin closes or it is killed
HOLDER = ("import sys; from mpirl.cluster import lifecycle\n"
          f"with lifecycle.claimed({NAME!r}):\n"
          "    print('held', flush=True); sys.stdin.read()\n")


@pytest.fixture
def state_root(tmp_path, monkeypatch):
    monkeypatch.setattr(net, "STATE_ROOT", tmp_path)
    return tmp_path


def holder(state_root) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": ROOT,
                                 "MPIRL_CLUSTER_STATE_ROOT": str(state_root)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_claimed_name_makes_the_next_user_wait_and_name_the_holder(state_root, capsys):
    proc = holder(state_root)
    try:
        with pytest.raises(ClusterError) as err, lifecycle.claimed(NAME, wait_s=0.2):
            pass
        assert f"claimed by pid {proc.pid}" in str(err.value)
        assert "waiting for it to end" in capsys.readouterr().err
        got = threading.Event()

        def wait_for_it():
            with lifecycle.claimed(NAME, wait_s=120):
                got.set()

        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        assert not got.wait(0.5)          # still held: the waiter waits
        proc.stdin.close()                # the holder's block ends
        assert proc.wait(60) == 0
        waiter.join(120)
        assert got.is_set()
    finally:
        proc.kill()
        proc.wait()


def test_a_second_claim_in_the_holding_process_is_refused_at_once(state_root):
    with lifecycle.claimed(NAME, wait_s=0):
        with pytest.raises(ClusterError, match="already claimed by this process"):
            with lifecycle.claimed(NAME, wait_s=3600):
                pass
    with lifecycle.claimed(NAME, wait_s=0):       # and the name is free again after
        pass


def test_a_killed_holder_leaves_no_claim(state_root):
    proc = holder(state_root)
    proc.send_signal(signal.SIGKILL)
    proc.wait(60)
    with lifecycle.claimed(NAME, wait_s=0):
        assert lifecycle.claim_path(NAME).read_text().strip() == str(os.getpid())
    with lifecycle.claimed(NAME, wait_s=0):       # released at the block's end
        pass
