"""Run under mpiexec: one worker pushes a fixed sequence of gradients through
``--servers S`` sharded parameter servers (each stepping its shard with Adam or SGD);
rank 0 prints the SHA-256 of the parameters the worker holds at the end, and of the
servers' shards concatenated.  The same sequence must end identical for every S.

    mpiexec -n S+1 python tests/mpi/check_sharded.py CASE [CASE ...]

CASE is ``S:adam|sgd:PUSHES[:leave]`` (every case of a launch with the same S); the
cases run one after another in the same processes (a launch costs a torch import per
rank), each over sharded servers of its own, and every line a case prints starts with
``[CASE]``: ``[1:adam:25] worker HEX``, ``[1:adam:25] servers HEX``.

Every shard answers the push after the last one with STOP; with ``leave`` only shard 0
does, the others apply it and are then left by the worker's leaving push (so their
shards end one push ahead, and each server prints how many pushes it applied:
``[3:adam:10:leave] shard 1 applied 11``).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mpirl.parts.server import ShardOptimizer  # noqa: E402
from topologies.shardedps import ShardedParameterServer  # noqa: E402

COUNT = 4099            # a prime: no shard boundary falls on a nice number


def main(servers: int, kind: str, pushes: int, leave_mode: bool = False,
         prefix: str = "") -> None:
    """One case; every line it prints starts with ``prefix``."""
    comm = MPI.COMM_WORLD
    params = np.random.default_rng(0).standard_normal(COUNT).astype(np.float32)
    leave = np.ones(1)
    sps = ShardedParameterServer(comm, servers, COUNT, meta_len=1, leave_meta=leave)
    if sps.is_server:
        shard = sps.slice(params, sps.shard)
        opt, ps = ShardOptimizer(shard, lr=1e-2, kind=kind), sps.server
        ps.open(shard.size)
        ps.reply(1, shard)
        applied = 0
        while True:
            worker, buf, meta = ps.wait_push(timeout_s=60)
            last = applied == pushes and (sps.shard == 0 or not leave_mode)
            if meta[0] or last:            # the leaving push, or the last one: STOP
                ps.stop(worker)
                break
            opt.step(buf)
            applied += 1
            ps.reply(worker, shard)
        ps.close(timeout_s=60)
        print(f"{prefix}shard {sps.shard} applied {applied}", flush=True)
    else:
        rng = np.random.default_rng(1)
        meta = np.zeros(1)
        assert sps.pull(params, timeout_s=60)
        for k in range(pushes + 1):
            grad = rng.standard_normal(COUNT).astype(np.float32)
            sps.push(grad, meta)
            alive = sps.pull(params, timeout_s=60)
            assert alive == (k < pushes), (k, alive)
    held = comm.bcast(params if not sps.is_server else None, root=servers)
    shards = comm.gather(sps.slice(params, sps.shard) if sps.is_server else None, root=0)
    if comm.Get_rank() == 0:
        print(f"{prefix}worker", hashlib.sha256(held.tobytes()).hexdigest(), flush=True)
        print(f"{prefix}servers",
              hashlib.sha256(np.concatenate(shards[:servers]).tobytes()).hexdigest(),
              flush=True)
    sps.free()


def parse_case(case: str) -> tuple[int, str, int, bool]:
    """``S:adam|sgd:PUSHES[:leave]`` -> (S, kind, pushes, leave)."""
    servers, kind, pushes, *rest = case.split(":")
    if kind not in ("adam", "sgd") or rest not in ([], ["leave"]):
        raise SystemExit(f"check_sharded.py: bad case {case!r}; expected S:adam|sgd:PUSHES"
                         "[:leave]")
    return int(servers), kind, int(pushes), rest == ["leave"]


if __name__ == "__main__":
    cases = sys.argv[1:]
    if not cases:
        raise SystemExit(__doc__)
    parsed = [parse_case(case) for case in cases]      # every case checked before any runs
    for case, (servers, kind, pushes, leave_mode) in zip(cases, parsed, strict=True):
        main(servers, kind, pushes, leave_mode, prefix=f"[{case}] ")
        MPI.COMM_WORLD.Barrier()       # every rank done with this case before the next
