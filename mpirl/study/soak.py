"""``mpiexec -n 8 python -m mpirl.soak --exchanges 5000``: long runs of checked exchanges.

Every registered topology (and the parameter server) runs thousands of exchanges in a
row: allreduce (sum and average) and bcast from every root, on buffers of 0 elements to
``--max-bytes``, float32 and float64, with the topology's own root varied too.  Each
exchange's case is drawn from ``--seed`` (broadcast from rank 0, printed), so every rank
draws the same case and any failure can be replayed.  What is checked, and why:

* **Every result, exactly.**  Rank r fills element i with the integer
  ``((A*i + B*r + key) mod M) - M//2`` (M prime, ``|value| * ranks < 2**24``), so every
  partial sum in any order is an integer that float32 holds exactly: the expected sum is
  known on every rank without communication (a table over ``(A*i + key) mod M``) and is
  compared bit for bit.  An average is the exact sum divided once, so it may differ from
  ``sum / N`` by rounding only (4 float eps, relative); that it is byte-identical on
  every rank is checked at the end of each topology from a CRC-32 of every result.
  Bcast: non-roots start from NaN, so an element nobody wrote cannot pass.  Buffers are
  views into a larger arena whose guard elements on both sides must survive.
* **Memory.**  Each rank's resident set (``/proc/self/statm``, after a garbage
  collection and glibc's ``malloc_trim``, so that memory freed but kept by the allocator
  does not count) is sampled after the topology's warm-up (which runs the largest
  buffer of every op and dtype, and of each topology root, so scratch buffers and MPI's
  pools are at full size) and at its end, and from the first warm-up to the end of the
  run; growth must stay under ``--rss-limit-mib`` (16 MiB by default: several times what
  MPICH's own pools grow by, small enough to catch a leak of one buffer per exchange;
  the growth measured per topology: docs/topologies.md).  Python objects tracked by the
  garbage collector must not grow by more than ``--objects-limit``.
* **Nothing left in flight.**  After each topology, every rank sends every other rank a
  probe message on each tag the topologies use (:func:`topology_tags`), then a
  sentinel; the receiver takes everything from that rank with ``ANY_TAG`` up to the
  sentinel.  Messages from one sender arrive in order, so anything before the probes is
  a message the topology sent and nobody received (a stray send), and a probe that never
  arrives was taken by a receive the topology left posted (a leaked request); after
  that ``Iprobe(ANY_SOURCE, ANY_TAG)`` must find nothing.  MPICH's MPI_T performance
  variables would count queues directly, but the PyPI build exposes none.

Every blocking wait has a deadline (``--deadline-s``): the checks' own waits poll with
one, the parameter server takes it as its timeout, and a watchdog thread ends the job
(exit 4) naming topology, exchange and case when a collective stalls.  A mismatch
prints one line naming topology, op, size, dtype, rank and exchange; the run goes on
through every topology and exits 1.  An exception inside a topology ends the job
at once (MPI_Abort, exit 1).  ``--corrupt`` injects each kind of fault for the tests.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import zlib
from dataclasses import dataclass, field

from ..launch import abort_job, apply_mpi_defaults

apply_mpi_defaults()
from mpi4py import MPI  # noqa: E402

import numpy as np  # noqa: E402

import topologies  # noqa: E402
from topologies.paramserver import ParameterServer  # noqa: E402

from .bench import human, parse_size  # noqa: E402
from ..resilience.watchdog import Watchdog  # noqa: E402

PROG = "mpirl.soak"
OPS = ("allreduce-sum", "allreduce-avg", "bcast")
DTYPES = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64)}
PARAMSERVER = "paramserver"
CORRUPT_KINDS = ("value", "ulp", "stray", "stale", "leak", "hang")
SENTINEL_TAG = 999
PROBE_MAGIC = 0x50524F4245
GUARD = 16               # guard elements on each side of every buffer
GUARD_VALUE = 7.25       # not an integer: no pattern value equals it
#: the pattern's multipliers (any two not divisible by the modulus)
A_MULT, B_MULT = 7919, 104729


class SoakError(ValueError):
    """A bad command-line value; reported once, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise SoakError(f"{message} (see --help)")


@dataclass
class Corruption:
    """``KIND:RANK@EXCHANGE``: make ``rank`` misbehave at (or from) its exchange ``at``."""

    kind: str
    rank: int
    at: int
    done: bool = False
    kept: list = field(default_factory=list)     # what stale/leak hold on to

    @classmethod
    def parse(cls, text: str) -> Corruption:
        kind, _, where = text.partition(":")
        try:
            rank_text, at_text = where.split("@")
            rank, at = int(rank_text), int(at_text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}; expected KIND:RANK@EXCHANGE, e.g. "
                                             "value:1@10") from None
        if kind not in CORRUPT_KINDS or rank < 0 or at < 0:
            raise argparse.ArgumentTypeError(f"{text!r}; KIND is one of "
                                             f"{', '.join(CORRUPT_KINDS)}, RANK >= 0, "
                                             "EXCHANGE >= 0")
        return cls(kind, rank, at)


def prime_at_most(n: int) -> int:
    """The largest prime <= n (n >= 2)."""
    for m in range(n, 1, -1):
        if all(m % d for d in range(2, int(m ** 0.5) + 1)):
            return m
    raise ValueError(f"no prime <= {n}")


class Pattern:
    """Integer test data whose sum over ranks is known exactly on every rank.

    ``value(i, r) = ((A*i + B*r + key) mod M) - M//2``.  Sums over any subset of ranks
    stay below 2**24 in magnitude, so float32 and float64 hold every partial sum
    exactly whatever order a topology adds in; the sum over all ranks depends on i
    only through ``(A*i + key) mod M``, so it is one lookup in a table of M entries."""

    def __init__(self, size: int, max_count: int) -> None:
        self.size = size
        self.mod = prime_at_most(min(65521, (1 << 24) // size))
        self.half = self.mod // 2
        self.a = A_MULT % self.mod or 1
        self.b = B_MULT % self.mod or 1
        self.ai = (self.a * np.arange(max_count, dtype=np.int64)) % self.mod
        j = np.arange(self.mod, dtype=np.int64)
        self.total = sum((j + self.b * r) % self.mod - self.half for r in range(size))
        self._work = np.empty(max_count, dtype=np.int64)

    def fill(self, out: np.ndarray, rank: int, key: int) -> None:
        """Write rank ``rank``'s values into ``out``."""
        w = self._work[:out.size]
        np.add(self.ai[:out.size], (self.b * rank + key) % self.mod, out=w)
        np.remainder(w, self.mod, out=w)
        np.subtract(w, self.half, out=out, casting="unsafe")

    def sum(self, count: int, key: int) -> np.ndarray:
        """The exact sum over all ranks of ``count`` elements, as float64."""
        w = self._work[:count]
        np.add(self.ai[:count], key % self.mod, out=w)
        np.remainder(w, self.mod, out=w)
        return self.total[w].astype(np.float64)

    def own(self, count: int, rank: int, key: int) -> np.ndarray:
        out = np.empty(count, dtype=np.float64)
        self.fill(out, rank, key)
        return out


@dataclass
class Case:
    """One exchange: what every rank does, drawn identically on every rank."""

    op: str
    dtype: np.dtype
    count: int
    root: int          # bcast root
    topo_root: int     # the topology's own root (star and tree reduce to it)
    key: int

    def describe(self) -> str:
        root = f" root={self.root}" if self.op == "bcast" else ""
        return f"{self.op}{root} n={self.count} {self.dtype.name} topology-root={self.topo_root}"


def draw_case(rng: np.random.Generator, args, size: int) -> Case:
    """Sizes: one in ten from the edge cases 0..2*size (fewer elements than ranks, empty
    ring chunks), the rest log-uniform from 1 element to ``--max-bytes``."""
    op = args.ops[int(rng.integers(len(args.ops)))]
    dtype = DTYPES[args.dtypes[int(rng.integers(len(args.dtypes)))]]
    max_count = max(1, args.max_bytes // dtype.itemsize)
    if rng.random() < 0.1:
        count = int(rng.integers(0, 2 * size + 1))
    else:
        count = int(np.exp(rng.uniform(0.0, np.log(max_count + 1))))
    roots = topology_roots(size)
    return Case(op, dtype, min(count, max_count), int(rng.integers(size)),
                roots[int(rng.integers(len(roots)))], int(rng.integers(1 << 30)))


def topology_roots(size: int) -> list[int]:
    """The topology roots soaked: the first, middle and last rank.  Each root is one more
    topology instance with its own scratch buffers to warm up; bcast roots, which cost
    nothing extra, range over every rank."""
    return sorted({0, size // 2, size - 1})


def topology_tags() -> list[int]:
    """Every message tag the topologies use: each module's ``*TAG*`` constants and, for the
    star's and tree's allreduce, whose broadcast half sends on its reduce tag + 100, those
    plus 100; and tag 0, MPI's usual default."""
    import importlib
    import pkgutil

    tags = {0}
    for module in pkgutil.iter_modules(topologies.__path__):
        mod = importlib.import_module(f"topologies.{module.name}")
        for name, value in vars(mod).items():
            if "TAG" in name and isinstance(value, int):
                tags |= {value, value + 100}
    return sorted(tags)


def rss_bytes() -> int | None:
    """This process's resident set size after a garbage collection and ``malloc_trim``
    (glibc keeps freed memory mapped otherwise), or None where /proc is missing."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def object_count() -> int:
    """Objects the garbage collector tracks, after two collections: a tuple of tuples is
    untracked only one collection after the tuples it holds."""
    gc.collect()
    gc.collect()
    return len(gc.get_objects())


def wait_deadline(test, deadline_s: float, what: str):
    """Poll ``test`` (returns a value or None/False) until it succeeds; raise TimeoutError
    after ``deadline_s``.  Sleeps up to 1 ms between polls: ranks share cores."""
    end = time.monotonic() + deadline_s
    pause = 0.0
    while True:
        result = test()
        if result is not None and result is not False:
            return result
        if time.monotonic() > end:
            raise TimeoutError(f"{what}: nothing within {deadline_s:g} s")
        if pause:
            time.sleep(pause)
        pause = min(1e-3, pause * 2 or 1e-5)


def barrier(comm, deadline_s: float, what: str) -> None:
    req = comm.Ibarrier()
    wait_deadline(req.Test, deadline_s, f"barrier {what}")


class Phase:
    """One topology's soak on one rank: its exchanges, their checks and its totals."""

    def __init__(self, name: str, comm, args, pattern: Pattern, corruptions) -> None:
        self.name, self.comm, self.args, self.pattern = name, comm, args, pattern
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.corruptions = corruptions
        self.failures: list[str] = []
        self.failure_count = 0
        self.exchanges = 0
        self.buffer_bytes = 0
        self.bytes_sent = 0
        self.digests = np.zeros(args.exchanges, dtype=np.uint32)

    def fail(self, message: str) -> None:
        self.failure_count += 1
        if len(self.failures) < 20:
            self.failures.append(f"{PROG}: FAIL {self.name} {message}")

    # -- corruption hooks, for the tests of the checks themselves ---------------------
    def corrupt(self, index: int, case: Case | None, buf: np.ndarray | None) -> None:
        for c in self.corruptions:
            if c.done or c.rank != self.rank or index < c.at:
                continue
            if c.kind == "value" and buf is not None and buf.size:
                buf[buf.size // 2] += 1
            elif c.kind == "ulp" and case is not None and case.op == "allreduce-avg" \
                    and buf is not None and buf.size:
                where = int(np.argmax(np.abs(buf)))
                buf[where] = np.nextafter(buf[where], np.inf)
            elif c.kind == "stray":
                self.comm.Send([np.ones(4), MPI.DOUBLE], (self.rank + 1) % self.size, 11)
            elif c.kind == "stale":
                scratch = np.empty(4)
                c.kept.append((scratch, self.comm.Irecv([scratch, MPI.DOUBLE],
                                                        (self.rank + 1) % self.size, 12)))
            elif c.kind == "leak":
                c.kept.append(np.ones((self.args.rss_limit_mib + 8) << 17))   # touched
            elif c.kind == "hang":             # the watchdog must end the job
                while True:
                    time.sleep(3600)
            else:
                continue
            c.done = True


class TopologyPhase(Phase):
    """Allreduce and bcast of a registered topology, checked against :class:`Pattern`."""

    def __init__(self, name, comm, args, pattern, corruptions) -> None:
        super().__init__(name, comm, args, pattern, corruptions)
        self.cls = topologies.get(name)
        self.instances: dict[int, topologies.Topology] = {}
        self.max_count = max(1, args.max_bytes // min(DTYPES[d].itemsize for d in args.dtypes))
        self.arenas = {DTYPES[d]: np.full(self.max_count + 2 * GUARD, GUARD_VALUE,
                                          dtype=DTYPES[d]) for d in args.dtypes}

    def topology(self, root: int) -> topologies.Topology:
        topo = self.instances.get(root)
        if topo is None:
            topo = self.instances[root] = self.cls(self.comm, root=root)
        return topo

    def run(self, case: Case, index: int, watchdog: Watchdog, label: str) -> None:
        arena = self.arenas[case.dtype]
        buf = arena[GUARD:GUARD + case.count]
        arena[GUARD + case.count:2 * GUARD + case.count] = GUARD_VALUE
        if case.op == "bcast" and self.rank != case.root:
            buf[:] = np.nan
        else:
            self.pattern.fill(buf, self.rank, case.key)
        topo = self.topology(case.topo_root)
        watchdog.at(f"in {self.name} {label} ({case.describe()})")
        try:
            if case.op == "bcast":
                out = topo.bcast(buf, root=case.root)
            else:
                out = topo.allreduce(buf, average=case.op == "allreduce-avg")
        except Exception as err:    # this rank alone: the others would wait forever
            abort_job(MPI.COMM_WORLD, f"{PROG}: error: {self.name} {case.describe()} rank "
                      f"{self.rank} {label}: {type(err).__name__}: {err}", 1)
        self.corrupt(index, case, buf)
        problem = self.check(case, buf, arena)
        if out is not buf:
            problem = problem or "the call did not return its buffer"
        if problem:
            self.fail(f"{case.describe()} rank {self.rank} {label}: {problem}")

    def check(self, case: Case, buf: np.ndarray, arena: np.ndarray) -> str:
        n = case.count
        if not (np.all(arena[:GUARD] == GUARD_VALUE)
                and np.all(arena[GUARD + n:2 * GUARD + n] == GUARD_VALUE)):
            return "wrote outside its buffer (guard elements changed)"
        if case.op == "bcast":
            expected = self.pattern.own(n, case.root, case.key)
        else:
            expected = self.pattern.sum(n, case.key)
        if case.op == "allreduce-avg":
            expected /= self.size
            tol = 4 * np.finfo(case.dtype).eps * np.abs(expected)
            bad = ~(np.abs(buf - expected) <= tol)
        else:
            bad = buf != expected
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            return (f"element {i} is {float(buf[i])!r}, expected {float(expected[i])!r} "
                    f"({int(bad.sum())} of {n} elements wrong)")
        return ""

    def soak(self, seed: int, watchdog: Watchdog, rss: dict) -> float:
        """Warm-up, then ``--exchanges`` checked exchanges; returns the latter's seconds."""
        args, size = self.args, self.size
        largest = {d: max(1, args.max_bytes // DTYPES[d].itemsize) for d in args.dtypes}
        warm = [Case(op, DTYPES[d], largest[d], size - 1, root, 1) for d in args.dtypes
                for op, root in [(op, 0) for op in args.ops]
                + [(args.ops[0], r) for r in topology_roots(size)[1:]]]
        rng = np.random.default_rng([seed, zlib.crc32(self.name.encode()), 0])
        warm += [draw_case(rng, args, size) for _ in range(args.warmup)]
        for k, case in enumerate(warm):
            self.run(case, -1, watchdog, f"warm-up {k}")
            watchdog.beat(k, f"after warm-up {k} of {self.name}")
        rss.setdefault("first", rss_bytes())
        rss_start, objects_start = rss_bytes(), object_count()
        for topo in self.instances.values():
            topo.stats.reset()
        rng = self.rng(seed)
        started = time.perf_counter()
        for index in range(args.exchanges):
            case = draw_case(rng, args, size)
            self.run(case, index, watchdog, f"exchange {index}")
            arena = self.arenas[case.dtype]
            self.digests[index] = zlib.crc32(arena[GUARD:GUARD + case.count])
            self.exchanges += 1
            self.buffer_bytes += case.count * case.dtype.itemsize
            watchdog.beat(index, f"after {self.name} exchange {index}")
        elapsed = time.perf_counter() - started
        self.bytes_sent = sum(t.stats.bytes_sent for t in self.instances.values())
        self.rss_growth = _growth(rss_start, rss_bytes())
        self.object_growth = object_count() - objects_start
        return elapsed

    def rng(self, seed: int) -> np.random.Generator:
        """The generator of this topology's exchanges (its warm-up has its own)."""
        return np.random.default_rng([seed, zlib.crc32(self.name.encode()), 1])

    def check_identical(self, seed: int) -> None:
        """Every rank's CRC of every result must match rank 0's (collective)."""
        everyone = np.empty((self.size, self.args.exchanges), dtype=np.uint32)
        self.comm.Allgather(self.digests, everyone)
        differs = np.flatnonzero(np.any(everyone != everyone[0], axis=0))
        rng = self.rng(seed)                     # replay the draws to name each case
        cases = [draw_case(rng, self.args, self.size) for _ in range(int(differs[-1]) + 1)] \
            if differs.size else []
        for i in differs[:5].tolist():
            ranks = [int(r) for r in np.flatnonzero(everyone[:, i] != everyone[0, i])]
            if self.rank in ranks:
                self.fail(f"{cases[i].describe()} rank {self.rank} exchange {i}: result "
                          f"not byte-identical to rank 0's (ranks {ranks} differ; "
                          f"{differs.size} exchanges differ in all)")


class ServerPhase(Phase):
    """The parameter server (async/quorum modes): sessions of pushes and replies.

    Each session draws a buffer length and dtype; every worker pushes its pattern (and
    meta ``[worker, round]``) ``rounds`` times, the server checks each push exactly and
    replies with a pattern keyed by worker and round, which the worker checks; a last
    push is answered with STOP and the server closes, as the modes do.  An exchange is
    one round of every worker."""

    def soak(self, seed: int, watchdog: Watchdog, rss: dict) -> float:
        args = self.args
        rng = np.random.default_rng([seed, zlib.crc32(self.name.encode()), 0])
        self.session(rng, 0, watchdog, warm=True, rounds=4, count_of=lambda d: max(
            1, args.max_bytes // d.itemsize))
        rss.setdefault("first", rss_bytes())
        rss_start, objects_start = rss_bytes(), object_count()
        started = time.perf_counter()
        session = 1
        while self.exchanges < args.exchanges:
            rounds = min(int(rng.integers(1, 41)), args.exchanges - self.exchanges)
            self.session(rng, session, watchdog, warm=False, rounds=rounds)
            session += 1
        elapsed = time.perf_counter() - started
        self.rss_growth = _growth(rss_start, rss_bytes())
        self.object_growth = object_count() - objects_start
        return elapsed

    def session(self, rng, session: int, watchdog: Watchdog, *, warm: bool, rounds: int,
                count_of=None) -> None:
        args = self.args
        case = draw_case(rng, args, self.size)
        count = count_of(case.dtype) if count_of else case.count
        ps = ParameterServer(self.comm, root=0, meta_len=2)
        label = f"session {session}{' (warm-up)' if warm else ''}"
        what = f"n={count} {case.dtype.name} {label}"
        watchdog.at(f"in {self.name} {what}")
        first = -1 if warm else self.exchanges     # no corruption during the warm-up
        try:
            if ps.is_server:
                self.serve(ps, case, count, rounds, what, first, watchdog)
            else:
                self.work(ps, case, count, rounds, what, first, watchdog)
        except Exception as err:
            abort_job(MPI.COMM_WORLD, f"{PROG}: error: {self.name} {what} rank {self.rank}: "
                      f"{type(err).__name__}: {err}", 1)
        if not warm:
            self.exchanges += rounds
            self.buffer_bytes += 2 * rounds * (self.size - 1) * count * case.dtype.itemsize
            self.bytes_sent += ps.stats.bytes_sent
        watchdog.beat(self.exchanges, f"after {self.name} {label}")

    def key(self, case: Case, worker: int, round_: int, reply: bool) -> int:
        return (case.key + 1009 * worker + 7 * round_ + (3 if reply else 0)) % (1 << 30)

    def work(self, ps, case, count, rounds, what, first, watchdog) -> None:
        buf = np.empty(count, dtype=case.dtype)
        params = np.empty(count, dtype=case.dtype)
        for r in range(rounds + 1):              # the last push is answered with STOP
            self.pattern.fill(buf, self.rank, self.key(case, self.rank, r, False))
            ps.push(buf, np.array([self.rank, r], dtype=np.float64))
            params[:] = np.nan
            alive = ps.pull(params, timeout_s=self.args.deadline_s)
            if alive != (r < rounds):
                self.fail(f"{what} rank {self.rank} round {r}: "
                          f"{'STOP' if not alive else 'parameters'} arrived, expected "
                          f"{'parameters' if r < rounds else 'STOP'}")
                return
            if not alive:
                break
            self.corrupt(first + r if first >= 0 else -1, None, params)
            expected = self.pattern.own(count, 0, self.key(case, self.rank, r, True))
            bad = params != expected
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                self.fail(f"{what} rank {self.rank} round {r}: reply element {i} is "
                          f"{float(params[i])!r}, expected {float(expected[i])!r}")
            watchdog.beat(self.exchanges + r, f"after {self.name} {what} round {r}")

    def serve(self, ps, case, count, rounds, what, first, watchdog) -> None:
        ps.open(count, case.dtype)
        params = np.empty(count, dtype=case.dtype)
        taken = dict.fromkeys(ps.workers, 0)
        handled = 0
        while any(n <= rounds for n in taken.values()):
            worker, buf, meta = ps.wait_push(timeout_s=self.args.deadline_s)
            r = taken[worker]
            taken[worker] += 1
            self.corrupt(first + r if first >= 0 else -1, None, buf)
            handled += 1
            expected = self.pattern.own(count, worker, self.key(case, worker, r, False))
            bad = buf != expected
            if bad.any() or list(meta) != [worker, r]:
                i = int(np.flatnonzero(bad)[0]) if bad.any() else -1
                self.fail(f"{what} rank {self.rank} (server) push {r} of worker {worker}: "
                          + (f"element {i} is {float(buf[i])!r}, expected "
                             f"{float(expected[i])!r}" if i >= 0
                             else f"meta {list(meta)}, expected {[worker, r]}"))
            if r < rounds:
                self.pattern.fill(params, 0, self.key(case, worker, r, True))
                ps.reply(worker, params)
            else:
                ps.stop(worker)
            watchdog.beat(self.exchanges + r, f"after {self.name} {what} push {handled}")
        ps.close(timeout_s=self.args.deadline_s)


def check_quiet(comm, deadline_s: float) -> list[str]:
    """Nothing of the phase left in flight: no stray message, no receive left posted.

    Collective.  Returns this rank's problems (one line each)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    barrier(comm, deadline_s, "before the quiescence check")
    tags = topology_tags()
    payloads = [np.array([PROBE_MAGIC + tag], dtype=np.int64) for tag in tags]
    sentinel = np.array([PROBE_MAGIC], dtype=np.int64)
    requests = []
    for dst in range(size):
        if dst != rank:
            requests += [comm.Isend([payload, MPI.INT64_T], dst, tag)
                         for tag, payload in zip(tags, payloads, strict=True)]
            requests.append(comm.Isend([sentinel, MPI.INT64_T], dst, SENTINEL_TAG))
    problems = []
    status = MPI.Status()
    for src in range(size):
        if src == rank:
            continue
        seen = []
        while True:
            wait_deadline(lambda s=src: comm.Iprobe(s, MPI.ANY_TAG, status), deadline_s,
                          f"rank {rank}: quiescence probes from rank {src}")
            nbytes, tag = status.Get_count(MPI.BYTE), status.Get_tag()
            data = bytearray(max(nbytes, 1))
            comm.Recv([data, nbytes, MPI.BYTE], src, tag)
            if tag == SENTINEL_TAG and nbytes == 8:
                break
            value = int(np.frombuffer(bytes(data[:8]), dtype=np.int64)[0]) \
                if nbytes == 8 else None
            if value == PROBE_MAGIC + tag and tag not in seen:
                seen.append(tag)
            else:
                problems.append(f"rank {rank}: a stray message from rank {src} (tag {tag}, "
                                f"{nbytes} bytes) was sent but never received")
        missing = sorted(set(tags) - set(seen))
        if missing:
            problems.append(f"rank {rank}: a receive from rank {src} was left posted (it took "
                            f"the probe with tag {', '.join(map(str, missing[:5]))})")
    wait_deadline(lambda: MPI.Request.Testall(requests), deadline_s,
                  f"rank {rank}: quiescence probes not delivered")
    barrier(comm, deadline_s, "after the quiescence check")
    if comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
        problems.append(f"rank {rank}: a message from rank {status.Get_source()} (tag "
                        f"{status.Get_tag()}) is pending after every rank finished")
    return problems


def _load_libc():
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim   # noqa: B018 (glibc only)
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _load_libc()


def _growth(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else after - before


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=f"mpiexec -n N python -m {PROG}", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    everything = [*topologies.names(), PARAMSERVER]
    parser.add_argument("--exchanges", type=int, default=1000,
                        help="checked exchanges per topology, after the warm-up")
    parser.add_argument("--topologies", nargs="+", default=None, choices=everything,
                        metavar="NAME", help=f"default: all of {', '.join(everything)} "
                                             f"({PARAMSERVER} only from 2 ranks)")
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--max-bytes", type=parse_size, default=parse_size("512K"),
                        help="largest buffer (suffix K, M); sizes are log-uniform up to it")
    parser.add_argument("--seed", type=int, default=None,
                        help="default: drawn by rank 0 and printed")
    parser.add_argument("--warmup", type=int, default=20,
                        help="random exchanges per topology before memory is first sampled "
                             "(after one of the largest size per op and dtype)")
    parser.add_argument("--rss-limit-mib", type=int, default=16,
                        help="largest resident-set growth allowed per rank after warm-up")
    parser.add_argument("--objects-limit", type=int, default=200,
                        help="largest growth allowed in gc-tracked Python objects per rank "
                             "and topology")
    parser.add_argument("--deadline-s", type=float, default=120.0,
                        help="the longest any wait may take (watchdog and polls)")
    parser.add_argument("--corrupt", action="append", default=[], type=Corruption.parse,
                        metavar="KIND:RANK@EXCHANGE",
                        help=f"tests only: inject a fault on RANK in every topology: "
                             f"{', '.join(CORRUPT_KINDS)}")
    return parser


def parse(argv: list[str] | None, size: int) -> argparse.Namespace:
    """The checked arguments for a run at ``size`` ranks (SoakError says what is wrong)."""
    args = build_parser().parse_args(argv)
    if args.topologies is None:
        args.topologies = [*topologies.names(), *([PARAMSERVER] if size > 1 else [])]
    if PARAMSERVER in args.topologies and size < 2:
        raise SoakError(f"{PARAMSERVER} needs at least 2 ranks; leave it out with "
                        "--topologies")
    for name in ("exchanges", "rss_limit_mib", "objects_limit", "warmup"):
        low = 1 if name == "exchanges" else 0
        if getattr(args, name) < low:
            raise SoakError(f"--{name.replace('_', '-')}={getattr(args, name)}; "
                            f"allowed: >= {low}")
    if not args.deadline_s > 0:
        raise SoakError(f"--deadline-s={args.deadline_s}; allowed: > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        if rank == 0:
            build_parser().print_help()
        return 0
    try:
        args = parse(argv, size)
    except SoakError as err:
        if rank == 0:
            print(f"{PROG}: error: {err}", file=sys.stderr, flush=True)
        return 2
    seed = world.bcast(args.seed if args.seed is not None else
                       int.from_bytes(os.urandom(4), "little") >> 1, root=0)
    max_count = max(1, args.max_bytes // min(DTYPES[d].itemsize for d in args.dtypes))
    pattern = Pattern(size, max_count)
    watchdog = Watchdog(world, args.deadline_s, rank, prog=PROG, unit="exchange",
                        option="--deadline-s")
    if rank == 0:
        print_header(args, size, seed)
    rss: dict = {}
    failed = 0
    started = time.perf_counter()
    for name in args.topologies:
        comm = world.Dup()
        kind = ServerPhase if name == PARAMSERVER else TopologyPhase
        corruptions = [Corruption(c.kind, c.rank, c.at) for c in args.corrupt]  # fresh
        phase = kind(name, comm, args, pattern, corruptions)
        elapsed = phase.soak(seed, watchdog, rss)
        watchdog.at(f"checking {name}")
        check_after(phase, seed, args, world)
        report = world.gather((phase.failures, phase.failure_count, phase.rss_growth,
                               phase.object_growth, phase.bytes_sent, elapsed), root=0)
        watchdog.beat(phase.exchanges, f"after checking {name}")
        comm.Free()
        if rank == 0:
            failed += print_phase(phase, report)
    growth = world.gather(_growth(rss.get("first"), rss_bytes()), root=0)
    if rank == 0:          # rank 0 prints everything: no mixed lines
        failed += print_end(args, growth, seed, time.perf_counter() - started)
    failed = world.bcast(failed, root=0)
    watchdog.stop()
    return 1 if failed else 0


def print_header(args, size: int, seed: int) -> None:
    print(f"# {PROG}: {size} ranks, seed {seed}, {args.exchanges} exchanges per topology "
          f"({', '.join(args.ops)}; {', '.join(args.dtypes)}; 0 B to "
          f"{human(args.max_bytes)}); RSS limit {args.rss_limit_mib} MiB", flush=True)
    print(f"# buffer_mib: the exchanged buffers' bytes; sent_mib: what the topology sent, "
          f"all ranks; rss_growth_kib: per rank after the warm-up, min..max; objects: "
          f"gc-tracked objects, the largest growth over ranks\n"
          f"{'topology':<12} {'exchanges':>9} {'buffer_mib':>10} {'sent_mib':>9} "
          f"{'time_s':>7} {'exch/s':>7} {'rss_growth_kib':>15} {'objects':>7} "
          f"{'failures':>8}", flush=True)


def check_after(phase: Phase, seed: int, args, world) -> None:
    """A phase's checks once its exchanges are done: identical results on every rank,
    nothing left in flight, no leak (each problem becomes one of its failures)."""
    rank = world.Get_rank()
    if isinstance(phase, TopologyPhase):
        phase.check_identical(seed)
    try:
        quiet = check_quiet(phase.comm, args.deadline_s)
    except TimeoutError as err:
        abort_job(world, f"{PROG}: error: {phase.name}: {err}", 1)
    for problem in quiet:
        phase.fail(f"after {phase.exchanges} exchanges: {problem}")
    if phase.rss_growth is not None and phase.rss_growth > args.rss_limit_mib << 20:
        phase.fail(f"rank {rank}: resident memory grew by {phase.rss_growth >> 10} KiB "
                   f"over {phase.exchanges} exchanges (limit {args.rss_limit_mib} MiB)")
    if phase.object_growth > args.objects_limit:
        phase.fail(f"rank {rank}: {phase.object_growth} more Python objects after "
                   f"{phase.exchanges} exchanges (limit {args.objects_limit})")


def print_end(args, growth: list, seed: int, seconds: float) -> int:
    """Rank 0: every rank's memory growth over the whole run, the verdict; the failures."""
    failed = 0
    for r, g in enumerate(growth):
        if g is not None and g > args.rss_limit_mib << 20:
            failed += 1
            print(f"{PROG}: FAIL rank {r}: resident memory grew by {g >> 10} KiB from the "
                  f"first warm-up to the end (limit {args.rss_limit_mib} MiB)", flush=True)
    cells = " ".join("n/a" if g is None else f"{g >> 10:+d}" for g in growth)
    print(f"# rss growth per rank over the whole run (KiB): {cells}")
    print(f"# {PROG}: {'FAILED' if failed else 'ok'}: {len(args.topologies)} topologies, "
          f"{seconds:.1f} s, seed {seed}", flush=True)
    return failed


def print_phase(phase: Phase, report: list) -> int:
    """Rank 0: the failure lines of every rank, then the topology's summary row."""
    for lines, _, _, _, _, _ in report:
        for line in lines:
            print(line, flush=True)
    count = sum(r[1] for r in report)
    growths = [r[2] for r in report if r[2] is not None]
    rss = f"{min(growths) >> 10:+d}..{max(growths) >> 10:+d}" if growths else "n/a"
    elapsed = max(r[5] for r in report)
    print(f"{phase.name:<12} {phase.exchanges:>9} {phase.buffer_bytes / 2**20:>10.1f} "
          f"{sum(r[4] for r in report) / 2**20:>9.1f} {elapsed:>7.1f} "
          f"{phase.exchanges / elapsed if elapsed else 0:>7.0f} {rss:>15} "
          f"{max(r[3] for r in report):>7} {count:>8}", flush=True)
    return count


if __name__ == "__main__":
    sys.exit(main())
