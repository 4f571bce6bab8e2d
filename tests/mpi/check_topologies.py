"""Checks topologies against MPI_Allreduce and the root's own data; run under mpiexec by
the tests.

Usage: mpiexec -n N python tests/mpi/check_topologies.py TOPOLOGY[,TOPOLOGY...] SEED [--large]
       mpiexec -n N python tests/mpi/check_topologies.py TOPOLOGY SEED --mismatch

Buffers small enough for the small-message path (topologies.persistent) are passed
three times as the same array: the first call is plain, the second is recorded and the
third replayed, and both must leave the first call's bytes.

Written in terms of rank and size only, so it passes at any rank count.  Sizes are drawn
from SEED (the same on every rank), and each rank's data from SEED and its rank.  The
topologies named are checked one after the other in one job (one launch per rank count
for the whole registry).  Each rank prints a line per case it found failed (rank 0 also
those where the ranks' results differ) and rank 0, per topology, a line
``NAME size=N seed=S cases=K failures=F``; the exit status is 1 when anything
failed.  ``--mismatch`` passes a longer buffer on the last rank and
expects a BufferMismatchError on some rank, which aborts the job with exit status 3.
"""

from __future__ import annotations

import hashlib
import sys

from mpirl.launch import abort_job, apply_mpi_defaults

apply_mpi_defaults()   # as every entry point of the project does, before MPI starts
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import topologies  # noqa: E402
from topologies import persistent  # noqa: E402

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def case_sizes(rng: np.random.Generator) -> list[int]:
    edge = [0, 1, 2, size - 1, size, size + 1, 7, 1023, 65537]
    return sorted({n for n in edge if n >= 0} | set(rng.integers(0, 300_000, size=3).tolist()))


def rank_data(seed: int, n: int, dtype, of: int | None = None) -> np.ndarray:
    """Rank ``of``'s data (this rank's by default): any rank can draw any rank's."""
    rng = np.random.default_rng([seed, rank if of is None else of, n])
    return rng.standard_normal(n).astype(dtype)


def digest(buf: np.ndarray) -> str:
    return hashlib.sha256(buf.tobytes()).hexdigest()


def reference_sums(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MPI_Allreduce's sum of ``x`` and of ``|x|`` over the ranks, in one call."""
    both = np.stack([x, np.abs(x)])
    comm.Allreduce(MPI.IN_PLACE, both, op=MPI.SUM)
    return both[0], both[1]


def sent(topo) -> tuple[int, int]:
    return topo.stats.messages_sent, topo.stats.bytes_sent


def check_rounds(topo, op: str, nbytes: int, itemsize: int, root: int,
                 before: tuple[int, int]) -> list[str]:
    """What this rank sent in one call against the topology's stated schedule
    (``rounds``, which its two-level cost model splits): the same number of messages,
    and the same bytes but for the chunks' rounding to whole elements (under one
    element per message).  Nothing to check where it states none."""
    try:
        schedule = type(topo).rounds(op, size, float(nbytes), root)
    except KeyError:
        return []
    mine = [m[2] for messages in schedule for m in messages if m[0] == rank]
    messages, nbytes_sent = (now - then for now, then in zip(sent(topo), before, strict=True))
    if messages != len(mine) or abs(nbytes_sent - sum(mine)) >= max(1, messages) * itemsize:
        return [f"{op} sent {messages} messages of {nbytes_sent} B; its rounds say "
                f"{len(mine)} of {sum(mine):.1f} B"]
    return []


def check_allreduce(topo, x: np.ndarray, average: bool, sums) -> tuple[list[str], str]:
    """The topology's allreduce of ``x`` against MPI_Allreduce's ``sums`` (of ``x`` and
    ``|x|``); the problems found and the result's digest (to compare across ranks)."""
    problems = []
    ref, abs_sum = sums
    if average:
        ref = ref / size
    # Any summation order is within n_ranks * eps * sum|x| of any other.
    tol = 4 * size * np.finfo(x.dtype).eps * abs_sum / (size if average else 1) + 1e-30
    half = getattr(topo, "half", None)
    if half is not None:     # a compression wrapper: each input and each partial sum rounded
        import ml_dtypes    # here: its import is 0.7 s per rank, and most jobs need none

        info = ml_dtypes.finfo(half)
        tol = 2 * (size + 1) * float(info.eps) * abs_sum / (size if average else 1) \
            + size * float(info.smallest_subnormal)

    y = x.copy()
    before = sent(topo)
    out = topo.allreduce(y, average=average)
    if out is not y:
        problems.append("allreduce did not return its buffer")
    problems += check_rounds(topo, "allreduce", y.nbytes, y.itemsize, topo.root, before)
    if y.nbytes <= persistent.MAX_BYTES:   # the same array again: recorded, then replayed
        first = y.copy()
        for call in ("recorded", "replayed"):
            y[:] = x
            topo.allreduce(y, average=average)
            if y.tobytes() != first.tobytes():
                problems.append(f"the {call} call's bytes differ from the first call's")
    err = np.abs(y.astype(np.float64) - ref)
    if not np.all(err <= tol):
        worst = int(np.argmax(err - tol))
        problems.append(f"differs from MPI_Allreduce at [{worst}]: {y[worst]!r} vs {ref[worst]!r}")
    return problems, digest(y)


def check_bcast(topo, x: np.ndarray, root: int, root_x: np.ndarray) -> tuple[list[str], None]:
    """The topology's bcast from ``root`` against the root's own data (``root_x``, drawn
    here as the root draws it); no digest (the bytes are checked against the root's)."""
    problems = []
    y = np.empty_like(x)
    # the same array three times (plain, recorded, replayed) with new data each time
    for k in range(3 if x.nbytes <= persistent.MAX_BYTES else 1):
        y[:] = x * (k + 1)
        before = sent(topo)
        topo.bcast(y, root=root)
        problems += check_rounds(topo, "bcast", y.nbytes, y.itemsize, root, before)
        if not np.array_equal(y, root_x * (k + 1)):
            problems.append(f"bcast from root {root} differs from the root's data at call "
                            f"{k + 1}")
    return problems, None


def run_cases(name: str, seed: int, large: bool) -> int:
    rng = np.random.default_rng(seed)
    failures = cases = 0
    if large:   # 16 Mi elements: the size of a mid-sized network's gradient
        plan = [(16 * 1024 * 1024, np.float32)]
    else:
        plan = [(n, dt) for n in case_sizes(rng) for dt in (np.float32, np.float64)]
    for n, dtype in plan:
        topo = topologies.get(name)(comm, root=int(rng.integers(size)))
        x = rank_data(seed, n, dtype)
        sums = reference_sums(x)
        checks = [(f"allreduce avg={avg}", check_allreduce, (avg, sums))
                  for avg in (False, True)]
        # roots 0, 1 and the last, and one drawn per case (24 draws per topology): every
        # root of 8 ranks is likely drawn, at a third of the cost of all of them each time
        roots = sorted({0, 1 % size, size - 1, int(rng.integers(size))}) if n < 100_000 \
            else [size - 1]
        checks += [(f"bcast root={r}", check_bcast, (r, rank_data(seed, n, dtype, of=r)))
                   for r in roots]
        # the checks of one (n, dtype) share one verdict collective: what each rank found
        # and its results' digests, gathered (the collectives under test are the job's time)
        found = [check(topo, x, *args) for _, check, args in checks]
        verdicts = comm.allgather([(len(problems), d) for problems, d in found])
        for i, ((label, _, _), (problems, d)) in enumerate(zip(checks, found, strict=True)):
            cases += 1
            flagged = any(v[i][0] for v in verdicts)
            differ = [r for r, v in enumerate(verdicts) if v[i][1] != verdicts[0][i][1]]
            if d is not None and differ:
                flagged = True
                if rank == 0:
                    problems = [*problems, f"result not byte-identical on all ranks (ranks "
                                           f"{differ} differ from rank 0)"]
            if flagged:
                failures += 1
                if problems:
                    print(f"FAIL {name} n={n} {np.dtype(dtype).name} {label} rank {rank}: "
                          f"{'; '.join(problems)}", flush=True)
    if rank == 0:
        print(f"{name} size={size} seed={seed} cases={cases} failures={failures}", flush=True)
    return failures


def run_mismatch(name: str) -> None:
    n = 1000 + (17 if rank == size - 1 else 0)
    buf = np.ones(n, dtype=np.float32)
    try:
        topologies.get(name)(comm).allreduce(buf)
    except topologies.BufferMismatchError as err:
        abort_job(comm, f"rank {rank}: BufferMismatchError: {err}", 3)
    except MPI.Exception as err:       # MPI's own check (hierarchical's MPI_Reduce)
        if err.Get_error_class() != MPI.ERR_TRUNCATE:
            raise
        abort_job(comm, f"rank {rank}: MPI: Message truncated: {err}", 3)
    comm.Barrier()
    print(f"rank {rank}: mismatched lengths went unnoticed", flush=True)
    sys.exit(1)


def main() -> None:
    names, seed = sys.argv[1].split(","), int(sys.argv[2])
    if "--mismatch" in sys.argv:
        run_mismatch(names[0])
    failures = sum(run_cases(name, seed, large="--large" in sys.argv) for name in names)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
