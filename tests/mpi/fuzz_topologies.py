"""Runs the topology cases a hypothesis test drew; run under mpiexec by
tests/topologies/test_fuzz_topologies.py.

Usage: mpiexec -n N python tests/mpi/fuzz_topologies.py SEED CASES_JSON

CASES_JSON is a list of cases, each a dict with ``topology``, ``op`` (``sum``, ``avg``
or ``bcast``), ``n``, ``dtype``, ``root`` (of the bcast), ``topo_root`` (the
topology's own), ``offset`` (bytes from an allocation's start: odd ones give an
unaligned buffer), ``rows`` (0: a flat buffer, else a 2-D one of that many rows when
they divide ``n``), ``segment_bytes`` (ring's bcast pipeline; 0 = default) and
``special`` (0: normal numbers; else that many +-inf, NaN and -0.0 put in at random
places on random ranks).  Every rank gets the same cases and fills its buffer from SEED,
its rank and the case's index.  Each result is compared with MPI's own collective
(allreduce: within float rounding, with NaN and infinities where MPI has them; bcast:
the root's bytes exactly) and must be byte-identical on every rank.  Rank 0 prints one
line per failed case and ``cases=K failures=F``; the exit status is 1 on any failure.
"""

from __future__ import annotations

import hashlib
import json
import sys

from mpirl.launch import apply_mpi_defaults

apply_mpi_defaults()
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import topologies  # noqa: E402

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def make_buffer(case: dict) -> np.ndarray:
    """A writable, C-contiguous buffer of the case's length, at the case's byte offset."""
    dtype = np.dtype(case["dtype"])
    raw = bytearray(case["n"] * dtype.itemsize + case["offset"])
    buf = np.frombuffer(raw, dtype=dtype, count=case["n"], offset=case["offset"])
    rows = case["rows"]
    if rows and case["n"] % rows == 0:
        buf = buf.reshape(rows, case["n"] // rows)
    return buf


def fill(buf: np.ndarray, seed: int, index: int, special: int) -> None:
    rng = np.random.default_rng([seed, rank, index])
    flat = buf.reshape(-1)
    flat[:] = rng.standard_normal(flat.size)
    if special and flat.size:
        # the same draw on every rank decides where specials go and on which rank
        shared = np.random.default_rng([seed, index, 7])
        for _ in range(special):
            where, who = int(shared.integers(flat.size)), int(shared.integers(size))
            value = [np.inf, -np.inf, np.nan, -0.0][int(shared.integers(4))]
            if who == rank:
                flat[where] = value


def digest(buf: np.ndarray) -> str:
    """SHA-256 of the bytes, every NaN made the same NaN: IEEE addition is commutative
    except in which of two NaN operands it returns, so butterfly's (and MPICH's) rounds
    may leave NaN on one partner and -NaN on the other; where NaNs are must agree (see
    topologies/butterfly.py)."""
    return hashlib.sha256(np.where(np.isnan(buf), np.nan, buf).astype(buf.dtype).tobytes()
                          ).hexdigest()


def check(topo, case: dict, seed: int, index: int) -> list[str]:
    buf = make_buffer(case)
    fill(buf, seed, index, case["special"])
    flat = buf.reshape(-1)
    original = flat.copy()
    problems = []
    if case["op"] == "bcast":
        ref = original.copy()
        comm.Bcast(ref, root=case["root"])
        out = topo.bcast(buf, root=case["root"])
        if ref.tobytes() != flat.tobytes():
            problems.append(f"bcast from root {case['root']} differs from MPI_Bcast")
    else:
        average = case["op"] == "avg"
        ref = original.astype(np.float64)
        comm.Allreduce(MPI.IN_PLACE, ref, op=MPI.SUM)
        scale = np.abs(np.nan_to_num(original.astype(np.float64), posinf=0, neginf=0))
        comm.Allreduce(MPI.IN_PLACE, scale, op=MPI.SUM)
        if average:
            ref /= size
            scale /= size
        out = topo.allreduce(buf, average=average)
        got = flat.astype(np.float64)
        tol = 4 * size * np.finfo(flat.dtype).eps * scale + 1e-30
        if not np.array_equal(np.isnan(got), np.isnan(ref)):
            problems.append("NaN where MPI_Allreduce has none, or none where it has one")
        elif not np.array_equal(got[np.isinf(ref)], ref[np.isinf(ref)]):
            problems.append("infinities differ from MPI_Allreduce's")
        else:
            finite = np.isfinite(ref)
            err = np.abs(got[finite] - ref[finite])
            if np.any(np.isinf(got[finite])) or not np.all(err <= tol[finite]):
                worst = int(np.flatnonzero(finite)[np.argmax(err - tol[finite])])
                problems.append(f"differs from MPI_Allreduce at [{worst}]: "
                                f"{float(got[worst])!r} vs {float(ref[worst])!r}")
    if out is not buf:
        problems.append("did not return its buffer")
    if buf.shape != make_buffer(case).shape:
        problems.append(f"changed the buffer's shape to {buf.shape}")
    if len(set(comm.allgather(digest(flat)))) != 1:
        problems.append("result not byte-identical on all ranks")
    return problems


def main() -> None:
    seed, cases = int(sys.argv[1]), json.loads(sys.argv[2])
    failures = 0
    for index, case in enumerate(cases):
        kwargs = {"root": case["topo_root"] % size}
        if case["topology"] == "ring" and case["segment_bytes"]:
            kwargs["segment_bytes"] = case["segment_bytes"]
        case = {**case, "root": case["root"] % size}
        topo = topologies.get(case["topology"])(comm, **kwargs)
        everyone = comm.gather(check(topo, case, seed, index), root=0)
        failed = comm.bcast(rank == 0 and any(everyone), root=0)
        failures += failed
        if failed and rank == 0:     # rank 0 prints for all: lines from many ranks mix
            for r, problems in enumerate(everyone):
                if problems:
                    print(f"FAIL case {index} {json.dumps(case)} rank {r}: "
                          f"{'; '.join(problems)}", flush=True)
    if rank == 0:
        print(f"size={size} seed={seed} cases={len(cases)} failures={failures}", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
