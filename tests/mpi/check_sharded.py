"""Run under mpiexec: one worker pushes a fixed sequence of gradients through
``--servers S`` sharded parameter servers (each stepping its shard with Adam or SGD);
rank 0 prints the SHA-256 of the parameters the worker holds at the end, and of the
servers' shards concatenated.  The same sequence must end identical for every S.

    mpiexec -n S+1 python tests/mpi/check_sharded.py S adam|sgd PUSHES [leave]

Every shard answers the push after the last one with STOP; with ``leave`` only shard 0
does, the others apply it and are then left by the worker's leaving push (so their
shards end one push ahead, and each server prints how many pushes it applied).
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


def main(servers: int, kind: str, pushes: int, leave_mode: bool = False) -> None:
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
        print(f"shard {sps.shard} applied {applied}", flush=True)
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
        print("worker", hashlib.sha256(held.tobytes()).hexdigest())
        print("servers", hashlib.sha256(np.concatenate(shards[:servers]).tobytes()).hexdigest())
    sps.free()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), "leave" in sys.argv[4:])
