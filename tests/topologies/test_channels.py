"""Request/reply channels (topologies.channels) under a real mpiexec: a server's
progress thread finishes its replies while the server makes no MPI call, and rounds of
requests and replies arrive whole and in order with and without it.  Across the links
of the emulated cluster (where the thread is needed): tests/cluster/test_cluster.py."""

from __future__ import annotations

import pytest

from mpirun import run_mpi

SCRIPT = "tests/mpi/check_channels.py"
CASES = ("progress thread: replies travel while the server makes no MPI call",
         "6 rounds of request and reply with a progress thread: whole and in order",
         "6 rounds of request and reply with no progress thread: whole and in order",
         "a failed progress thread: its error is raised by reply, ready and close")


def check_channel_cases(result) -> None:
    lines = result.output.splitlines()
    for case in CASES:
        assert f"OK {case}" in lines, result.tail()
    assert result.returncode == 0, result.tail()


@pytest.mark.parametrize("nranks", [2, 3, 5])
def test_replies_progress_on_the_servers_thread(nranks):
    check_channel_cases(run_mpi(nranks, [SCRIPT], timeout_s=180, check=False))
