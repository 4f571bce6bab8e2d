"""A compressed exchange's state survives a failure that only some survivors saw.

Usage (Open MPI with ULFM, ``make ulfm-env``; 4 ranks):
    mpiexec --with-ft ulfm ... -n 4 python tests/mpi/check_ulfm_state.py SPEC DIR

``SPEC`` is a stateful exchange over ``tree`` (``topk:0.25:tree``, ``powersgd:2:tree``),
averaged through :class:`mpirl.resilience.exchange.Exchange` under ``shrink``.  In the
third average rank 2 dies inside the tree's allreduce, after the sum came down to it
and before it passes it on (the tree at 4 ranks: 3 -> 2 -> 0 <- 1, then 0 -> 2 -> 3 and
0 -> 1): ranks 0 and 1 finish that allreduce (top-k's only one: they finish the average
and move their residuals and the leader's turn on; PowerSGD's first of two: they move
part of theirs), while rank 3 waits for rank 2's broadcast until the failure shows.
The survivors agree, shrink and redo the average; it must start from the same state on
all three.  Then six more averages: the survivors must hold the same averaged bytes
after each, and the same exchange state.

The small-message path is off here (``MPIRL_SMALL_PATH_BYTES=0``) so that the tree's
sends go through the method the dying rank replaces.  Rank 0 writes ``DIR/built`` once
every rank is past MPI_Init and ``DIR/verdict`` (``OK`` or ``FAIL: why``) at the end:
files, not stdout, since Open MPI's output forwarding loses lines of ranks that leave
with ``os._exit`` next to a dead one.  The exit status is 1 when anything failed (the
launcher's may be the dead rank's).
"""

from __future__ import annotations

import hashlib
import os
import sys
import traceback
from pathlib import Path

os.environ["MPIRL_SMALL_PATH_BYTES"] = "0"

from mpirl.launch import apply_mpi_defaults  # noqa: E402

apply_mpi_defaults()
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from mpirl.resilience.exchange import Exchange  # noqa: E402
from topologies import tree  # noqa: E402

N = 1000            # float32 gradient entries (PowerSGD: one 25 x 40 matrix)
DIES, AT = 2, 3     # rank 2 dies in the third average


def digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def state_digest(ex: Exchange) -> str:
    state = ex.topology.state()
    return digest([np.asarray(state[key]) for key in sorted(state)
                   if not key.startswith("residual_")])  # residuals are each rank's own


def die_in_the_broadcast(ex: Exchange) -> None:
    """Make this rank exit when, in the broadcast half of its tree's allreduce, it has
    received the sum from rank 0 and is to pass it on to rank 3."""
    inner = ex.topology.inner_topology
    send = inner._send

    def _send(buf, dest, tag):
        if tag == tree._TAG_REDUCE + 100:
            os._exit(17)
        return send(buf, dest, tag)

    inner._send = _send


def main() -> None:
    spec, out = sys.argv[1], Path(sys.argv[2])
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    if world.Get_size() != 4:
        sys.exit("check_ulfm_state needs 4 ranks")
    ex = Exchange(spec, world, "shrink")
    if spec.startswith("powersgd"):
        ex.describe([(25, 40)])
    ex.collective(lambda c: c.Barrier(), "starting")
    if rank == 0:
        write(out / "built", spec)       # past Open MPI's start-up (the test retries one)
    problems: list[str] = []
    for update in range(1, AT + 7):
        grad = np.random.default_rng([update, rank]).standard_normal(N).astype(np.float32)
        if update == AT and rank == DIES:
            die_in_the_broadcast(ex)
        ex.average(grad, update)
        mine = (digest([grad]), state_digest(ex))
        seen = ex.collective(lambda c, mine=mine: c.allgather(mine), "comparing the averages")
        if len({s[0] for s in seen}) != 1:
            problems.append(f"update {update}: the survivors' averages differ")
        if len({s[1] for s in seen}) != 1:
            problems.append(f"update {update}: the survivors' exchange states differ")
    if ex.size != 3 or ex.world != [0, 1, 3]:
        problems.append(f"rank {rank}: {ex.size} ranks {ex.world} after the failure, "
                        "not [0, 1, 3]")
    problems = [p for ps in ex.collective(lambda c: c.allgather(problems), "the verdict")
                for p in ps]
    if ex.rank == 0:
        write(out / "verdict", f"FAIL: {'; '.join(problems)}" if problems else "OK")
    os._exit(1 if problems else 0)     # Open MPI's ULFM MPI_Finalize hangs (mpirl.run)


def write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


if __name__ == "__main__":
    try:
        main()
    except BaseException:       # Open MPI's start-up failure, say: leave without Finalize
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
