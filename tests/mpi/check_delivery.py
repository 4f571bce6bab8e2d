"""Checks parameter delivery by broadcast (mpirl.kit.delivery); run under mpiexec.

Usage: mpiexec -n N python tests/mpi/check_delivery.py     (N >= 2)

Rank 0 publishes, every other rank subscribes, each at its own pace (random pauses, as
actors between unrolls).  Rank 0 prints ``OK CASE`` or ``FAIL CASE: why`` per case;
exit status 1 on any failure.
"""

from __future__ import annotations

import sys
import time

from cases import cases, comm, rank, report, size  # first: it starts MPI

import numpy as np

from mpirl.kit.delivery import Publisher, Subscriber
from topologies.paramserver import DeadlineExceeded

#: odd, and over ring's 256 KiB segment: a pipelined chain of several segments
N = 300_007
VERSIONS = 15


def params_of(version: int) -> np.ndarray:
    return np.random.default_rng(version).standard_normal(N).astype(np.float32)


def publish(spec: str) -> tuple[list[str], dict]:
    publisher, pause = Publisher(comm, spec, N), np.random.default_rng(1)
    accepted = []
    for version in range(1, VERSIONS + 1):
        time.sleep(pause.uniform(0, 0.004))         # an update
        if publisher.offer(params_of(version), version):
            accepted.append(version)
    publisher.close(timeout_s=60)
    return [], {"broadcasts": publisher.broadcasts, "last": accepted[-1],
                "accepted": len(accepted)}


def subscribe(spec: str) -> tuple[list[str], dict]:
    subscriber, pause = Subscriber(comm, spec, N), np.random.default_rng(100 + rank)
    held, problems, taken = np.zeros(N, np.float32), [], []

    def take() -> None:
        version = subscriber.take(held)
        if version is None:
            return
        if taken and version <= taken[-1]:
            problems.append(f"rank {rank}: version {version} after {taken[-1]}")
        if held.tobytes() != params_of(version).tobytes():
            problems.append(f"rank {rank}: version {version}'s bytes differ")
        taken.append(version)

    while subscriber.thread.is_alive():
        time.sleep(pause.uniform(0, 0.01))          # an unroll
        take()
    subscriber.close(timeout_s=60)
    take()                                          # what landed after the last look
    return problems, {"received": subscriber.received, "last": taken[-1] if taken else None}


def check_every_actor_ends_with_the_last_broadcast(spec: str) -> None:
    problems, mine = (publish if rank == 0 else subscribe)(spec)
    every = comm.allgather(mine)
    first = every[0]
    for r, theirs in enumerate(every[1:], start=1):
        if theirs["received"] != first["broadcasts"]:
            problems.append(f"rank {r} joined {theirs['received']} broadcasts of "
                            f"{first['broadcasts']}")
        if theirs["last"] != first["last"]:
            problems.append(f"rank {r} ends with version {theirs['last']}, the last "
                            f"broadcast was {first['last']}")
    if rank == 0 and first["broadcasts"] != first["accepted"]:
        problems.append(f"{first['accepted']} offers accepted, {first['broadcasts']} sent")
    report(f"{spec}: every actor takes versions in order, bit-exact, and ends with the "
           "last one", problems)


def check_no_stop_is_a_deadline() -> None:
    """A subscriber whose publisher never rings STOP fails its close at the deadline."""
    problems = []
    if rank == 0:
        publisher = Publisher(comm, "ring", 16)
        comm.Barrier()                              # the subscribers gave up
        publisher.close(timeout_s=30)
    else:
        subscriber = Subscriber(comm, "ring", 16)
        try:
            subscriber.close(timeout_s=0.2)
            problems.append(f"rank {rank}: close returned without a STOP")
        except DeadlineExceeded as err:
            if "no STOP from the learner within 0.2 s" not in str(err):
                problems.append(f"rank {rank}: {err}")
        comm.Barrier()
        subscriber.close(timeout_s=30)              # the STOP has come now
    report("no STOP from the publisher: the subscriber's close is deadline-bound", problems)


def main() -> None:
    if size < 2:
        sys.exit("check_delivery needs at least 2 ranks")
    specs = sys.argv[1:] or ["ring", "tree", "native", "star", "hierarchical:ring:2"]
    for spec in specs:
        check_every_actor_ends_with_the_last_broadcast(spec)
    check_no_stop_is_a_deadline()
    sys.exit(1 if cases.failed else 0)


if __name__ == "__main__":
    main()
