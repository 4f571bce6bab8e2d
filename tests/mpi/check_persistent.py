"""Checks the small-message path (topologies.persistent); run under mpiexec by the tests.

Usage: mpiexec -n N python tests/mpi/check_persistent.py

Rank 0 prints ``OK CASE`` or ``FAIL CASE: why`` per case, for every topology that plans
persistent requests; the exit status is 1 when anything failed.  The mismatch cases
need 2 ranks and run only there: rank 0 replays a butterfly's schedule while rank 1
answers with a raw message one element too long, then one too short.
"""

from __future__ import annotations

import sys

from cases import cases, comm, rank, report, size  # first: it starts MPI

import numpy as np

import topologies
from topologies import butterfly, persistent


def stats_delta(topo, call) -> tuple[int, int, int]:
    before = (topo.stats.messages_sent, topo.stats.bytes_sent, topo.stats.bytes_recv)
    call()
    return tuple(now - was for now, was in zip(
        (topo.stats.messages_sent, topo.stats.bytes_sent, topo.stats.bytes_recv), before,
        strict=True))


def check_replays(name: str) -> None:
    """The third call on one array replays a schedule: same bytes and counters as plain."""
    topo = topologies.get(name)(comm)
    x = np.random.default_rng([5, rank]).standard_normal(1000).astype(np.float32)
    y = x.copy()
    plain_stats = stats_delta(topo, lambda: topo.allreduce(y))
    plain = y.tobytes()
    problems = []
    for call in ("recorded", "replayed"):
        y[:] = x
        got = stats_delta(topo, lambda: topo.allreduce(y))
        if y.tobytes() != plain:
            problems.append(f"rank {rank}: the {call} call's bytes differ from the plain call's")
        if got != plain_stats:
            problems.append(f"rank {rank}: {call} counters {got} != plain {plain_stats}")
    if len(topo._schedules.kept) != 1:
        problems.append(f"rank {rank}: {len(topo._schedules.kept)} schedules kept, not 1")
    elif persistent.NATIVE is not None:
        if next(iter(topo._schedules.kept.values())).native is None:
            problems.append(f"rank {rank}: the C replay is loaded but the schedule is "
                            "not compiled for it")
    report(f"{name} replays", problems)


def check_modes(name: str) -> None:
    """small_path: "off" plans nothing, "python" replays in Python, "c" in C (where
    built); the same bytes in every mode."""
    x = np.random.default_rng([6, rank]).standard_normal(300).astype(np.float32)
    results, problems = {}, []
    for mode in topologies.SMALL_PATHS:
        topo = topologies.get(name)(comm).small_path(mode)
        y = x.copy()
        for _ in range(3):
            y[:] = x
            topo.allreduce(y)
        results[mode] = y.tobytes()
        kept = list(topo._schedules.kept.values())
        native = [s.native is not None for s in kept]
        want = {"off": [], "python": [False],
                "c": [persistent.NATIVE is not None]}[mode]
        if native != want:
            problems.append(f"rank {rank}: mode {mode}: schedules compiled for C {native}, "
                            f"not {want}")
    if len(set(results.values())) != 1:
        problems.append(f"rank {rank}: the modes' bytes differ")
    try:
        topologies.get(name)(comm).small_path("fast")
        problems.append(f"rank {rank}: small_path('fast') was taken")
    except ValueError as err:
        if "allowed: c, python, off" not in str(err):
            problems.append(f"rank {rank}: {err}")
    report(f"{name} small_path modes", problems)


def check_waits_let_threads_run() -> None:
    """While a replay waits for a late peer, this rank's other Python threads run (the
    watchdog's, the progress thread's): the C replay releases the GIL, as mpi4py does."""
    import threading
    import time

    topo = butterfly.Butterfly(comm)
    a = np.ones(500, np.float32)
    topo.allreduce(a)
    topo.allreduce(a)                      # planned now, on every rank
    ticks, done = [0], threading.Event()

    def tick():
        while not done.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    comm.Barrier()
    problems = []
    if rank == 0:
        thread = threading.Thread(target=tick)
        thread.start()
        time.sleep(0.01)
        before = ticks[0]
        topo.allreduce(a)                  # the others come 0.5 s late
        waited = ticks[0] - before
        done.set()
        thread.join()
        if waited < 50:
            problems.append(f"rank 0: another thread ticked {waited} times in a 0.5 s wait")
    else:
        time.sleep(0.5)
        topo.allreduce(a)
    report("a replay's wait lets other threads run", problems)


def check_what_is_planned(name: str) -> None:
    """Fresh arrays and large ones are never planned; at most KEPT schedules are kept."""
    topo = topologies.get(name)(comm)
    problems = []
    for _ in range(3):
        topo.allreduce(np.ones(100, np.float32))
    if topo._schedules.kept:
        problems.append(f"rank {rank}: a fresh array per call was planned")
    big = np.ones(persistent.MAX_BYTES // 4 + 1, np.float32)
    for _ in range(3):
        topo.allreduce(big)
    if topo._schedules.kept:
        problems.append(f"rank {rank}: an array over MAX_BYTES was planned")
    arrays = [np.ones(10 + i, np.float32) for i in range(persistent.KEPT + 2)]
    for a in arrays:
        topo.allreduce(a)
        topo.allreduce(a)
    if len(topo._schedules.kept) != persistent.KEPT:
        problems.append(f"rank {rank}: {len(topo._schedules.kept)} schedules kept, "
                        f"not {persistent.KEPT}")
    if any(not np.all(a == size ** 2) for a in arrays):
        problems.append(f"rank {rank}: a twice-summed array is not size**2")
    check_turns(topo, problems)
    report(f"{name} plans only repeated small arrays", problems)


def check_nested(spec: str) -> None:
    """A topology running another inside it (hierarchical's leaders, a cast's half
    buffer) plans the inner calls too, counts each call once, and gives the bytes of the
    inner topology alone (node size 1: every rank a leader, nothing reduced per node)."""
    topo = topologies.get(spec)(comm)
    alone = topologies.get("butterfly")(comm)
    x = np.random.default_rng([6, rank]).standard_normal(1000).astype(np.float32)
    y, z = x.copy(), x.copy()
    problems = []
    for _ in range(3):
        y[:], z[:] = x, x
        topo.allreduce(y, average=True)
        if spec.startswith("hierarchical"):
            alone.allreduce(z, average=True)
            if y.tobytes() != z.tobytes():
                problems.append(f"rank {rank}: {spec}'s bytes differ from butterfly's")
    if topo.stats.calls != 3:
        problems.append(f"rank {rank}: {topo.stats.calls} calls counted for 3")
    if len(topo.inner_topology._schedules.kept) != 1:
        problems.append(f"rank {rank}: the inner topology kept "
                        f"{len(topo.inner_topology._schedules.kept)} schedules, not 1")
    report(f"{spec} plans its inner calls", problems)


def check_turns(topo, problems: list[str]) -> None:
    """Arrays that take turns (--overlap's buckets) are each planned."""
    topo._schedules.clear()
    turns = [np.ones(20 + i, np.float32) for i in range(3)]
    for _ in range(3):
        for a in turns:
            topo.allreduce(a)
    if len(topo._schedules.kept) != 3 or any(not np.all(a == size ** 3) for a in turns):
        problems.append(f"rank {rank}: 3 arrays taking turns gave "
                        f"{len(topo._schedules.kept)} schedules, not 3")


def check_churn(name: str) -> None:
    """More arrays taking turns than schedules are kept: each is recorded at most once,
    those dropped for room take the blocking path, and the sums stay right."""
    topo = topologies.get(name)(comm)
    turns = [np.ones(30 + i, np.float32) for i in range(persistent.KEPT + 2)]
    problems, recorded = [], []
    for _ in range(8):
        for a in turns:
            a.fill(1.0)
            topo.allreduce(a)
            if not np.all(a == size):
                problems.append(f"rank {rank}: a sum of ones is not {size}")
        recorded.append(topo._schedules.recorded)
    if recorded[-1] > len(turns) or recorded[3] != recorded[-1]:
        problems.append(f"rank {rank}: schedules recorded after each round {recorded}: "
                        f"still recording, or more than one per array")
    if len(topo._schedules.kept) != persistent.KEPT:
        problems.append(f"rank {rank}: {len(topo._schedules.kept)} schedules kept, "
                        f"not {persistent.KEPT}")
    report(f"{name} records each of more turns than it keeps once", problems)


def check_replay_sees_mismatch(extra: int) -> None:
    """Rank 0 replays; rank 1 answers with ``1000 + extra`` elements on the round's tag."""
    topo = butterfly.Butterfly(comm)
    a = np.ones(1000, np.float32)
    topo.allreduce(a)
    topo.allreduce(a)                      # planned now, on both ranks
    problems = []
    if rank == 0:
        try:
            topo.allreduce(a)
            problems.append("rank 0: the replay took a message of the wrong length")
        except topologies.BufferMismatchError as err:
            words = "longer than" if extra > 0 else f"received {1000 + extra}"
            if words not in str(err):
                problems.append(f"rank 0: {err}")
        if topo._schedules.kept:
            problems.append("rank 0: a schedule that failed was kept")
    else:
        theirs = np.empty(1000, np.float32)
        comm.Sendrecv(np.ones(1000 + extra, np.float32), 0, butterfly._TAG_ROUND,
                      theirs, 0, butterfly._TAG_ROUND)
    report(f"a replay sees a message {abs(extra)} element "
           f"{'too long' if extra > 0 else 'too short'}", problems)


def main() -> None:
    if size < 2:
        sys.exit("check_persistent needs at least 2 ranks: one rank exchanges nothing")
    for name in topologies.names():
        if topologies.get(name).persistent:
            check_replays(name)
            check_modes(name)
            check_what_is_planned(name)
            check_churn(name)
    for spec in ("hierarchical:butterfly:1", "fp16:butterfly"):
        check_nested(spec)
    if rank == 0:
        print(f"replayed in {'C' if persistent.NATIVE is not None else 'Python'}",
              flush=True)
    check_waits_let_threads_run()
    if size == 2:
        check_replay_sees_mismatch(+1)
        check_replay_sees_mismatch(-1)
    sys.exit(1 if cases.failed else 0)


if __name__ == "__main__":
    main()
