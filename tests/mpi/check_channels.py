"""Checks a channel server's progress thread (topologies.channels); run under mpiexec.

Usage: mpiexec -n N python tests/mpi/check_channels.py     (N >= 2)

Rank 0 serves, every other rank is a client.  Rank 0 prints ``OK CASE`` or
``FAIL CASE: why`` per case; exit status 1 on any failure.
"""

from __future__ import annotations

import sys
import time

from cases import cases, comm, rank, report, size  # first: it starts MPI

import numpy as np

from topologies.base import TopologyError
from topologies.channels import ChannelClient, ChannelServer

#: a reply far over any eager limit (MPICH's shared memory or TCP: a rendezvous)
REPLY = 8 * 2**20 + 12
ROUNDS = 6
#: how long the server goes on computing once its thread saw every reply finished (a
#: client that has its reply is scheduled to note the time within it, loaded or not)
AFTER_S = 5.0
TAG = 5


def reply_of(client: int, round_: int) -> np.ndarray:
    out = np.empty(REPLY, dtype=np.uint8)
    out[:] = (client * 31 + round_) % 251
    out[::4099] = round_
    return out


def check_replies_travel_while_the_server_stays_out_of_mpi() -> None:
    """The server replies, then computes without one MPI call of its own until its
    progress thread has seen every reply finished, and :data:`AFTER_S` longer; each client
    has its whole reply before that computing ends.  (Over TCP MPICH moves a large
    message only while its sender is in an MPI call: without the thread each reply
    would land after the computing.)"""
    problems: list[str] = []
    clients = list(range(1, size))
    ended = got_at = float("nan")
    if rank == 0:
        server = ChannelServer(comm, clients, 8, progress=True)
        replies = {c: reply_of(c, 0) for c in clients}
        for _ in clients:                               # every request taken first
            server.wait_any(timeout_s=60)
        for c in clients:
            server.reply(c, replies[c], tag=TAG, last=True)
        deadline = time.monotonic() + 60
        spins = 0
        while server.progressed < len(clients) and time.monotonic() < deadline:
            spins += 1                      # computing: Python only, no MPI call here
        calm = time.monotonic() + AFTER_S
        while time.monotonic() < calm:
            spins += 1
        ended = time.time()
        if server.progressed != len(clients):
            problems.append(f"the progress thread finished {server.progressed} of "
                            f"{len(clients)} replies in 60 s while the server computed")
        server.close(timeout_s=60)
        if server._progress.thread.is_alive():
            problems.append("the progress thread outlived the server's close")
    else:
        client, got = ChannelClient(comm, 0), np.zeros(REPLY, dtype=np.uint8)
        client.send(np.zeros(1, dtype=np.int64))
        tag, count = client.wait_reply(got, timeout_s=60)
        got_at = time.time()
        if (tag, count) != (TAG, REPLY) or got.tobytes() != reply_of(rank, 0).tobytes():
            problems.append(f"rank {rank}: reply tag {tag}, {count} bytes, or bytes differ")
    ended = comm.bcast(ended, root=0)
    if rank != 0 and not got_at < ended:
        problems.append(f"rank {rank}: its reply landed {got_at - ended:.3f} s after the "
                        "server's computing ended")
    report("progress thread: replies travel while the server makes no MPI call", problems)


def check_request_reply_rounds_with_the_thread(progress: bool) -> None:
    """Requests and replies, rounds of them, the server's own waits and the thread testing
    the same replies: every reply arrives whole, in order, and close completes."""
    problems: list[str] = []
    clients = list(range(1, size))
    if rank == 0:
        server = ChannelServer(comm, clients, 8, progress=progress)
        served = {c: 0 for c in clients}
        replies = {}
        while any(n < ROUNDS for n in served.values()):
            c = server.wait_any(timeout_s=60)
            got = int(server.buffers[c].view(np.int64)[0])
            if got != served[c]:
                problems.append(f"request {got} from rank {c}, expected {served[c]}")
            replies[c] = reply_of(c, served[c])     # kept until the next reply to c
            served[c] += 1
            server.reply(c, replies[c], tag=TAG, last=served[c] == ROUNDS)
            time.sleep(0.002 * (c % 3))             # some computing between replies
        server.close(timeout_s=60)
    else:
        client, got = ChannelClient(comm, 0), np.zeros(REPLY, dtype=np.uint8)
        for n in range(ROUNDS):
            client.send(np.array([n], dtype=np.int64))
            tag, count = client.wait_reply(got, timeout_s=60)
            if count != REPLY or got.tobytes() != reply_of(rank, n).tobytes():
                problems.append(f"rank {rank}: reply {n} has {count} bytes or differs")
    way = "a progress thread" if progress else "no progress thread"
    report(f"{ROUNDS} rounds of request and reply with {way}: whole and in order", problems)


#: the server's calls that must raise its dead progress thread's error
DEAD_THREAD_RAISES = {
    "reply": lambda server: server.reply(1, np.zeros(8, dtype=np.uint8), tag=TAG),
    "ready": lambda server: server.ready(),
    "close": lambda server: server.close(timeout_s=5)}


def check_a_failed_thread_is_raised_by_the_server() -> None:
    """An error in the progress thread ends it, and the server's next reply raises it, and
    so do its next look for requests and its close: a server whose thread died must not
    go on holding its replies, or missing its clients' requests, silently.  (Rank 0
    alone: the error is made by replacing the thread's poll.)"""
    problems: list[str] = []
    if rank == 0:
        for end, call in DEAD_THREAD_RAISES.items():
            server = ChannelServer(comm, [], 8, progress=True)

            def broken() -> None:
                raise RuntimeError("a poll that fails")

            server._progress._poll = broken
            server._progress.thread.join(timeout=30)
            if server._progress.thread.is_alive():
                problems.append("the progress thread outlived its failed poll by 30 s")
                continue
            try:
                call(server)
            except TopologyError as err:
                if "a poll that fails" not in str(err):
                    problems.append(f"the server's {end} raised {err}, not the thread's error")
            except Exception as err:                       # noqa: BLE001 (reported)
                problems.append(f"the server's {end} raised {err!r}, not the thread's error")
            else:
                problems.append(f"the server's {end} did not raise the thread's error")
    report("a failed progress thread: its error is raised by reply, ready and close",
           problems)


def main() -> None:
    if size < 2:
        sys.exit("check_channels needs at least 2 ranks")
    check_replies_travel_while_the_server_stays_out_of_mpi()
    for progress in (True, False):
        check_request_reply_rounds_with_the_thread(progress)
    check_a_failed_thread_is_raised_by_the_server()
    sys.exit(1 if cases.failed else 0)


if __name__ == "__main__":
    main()
