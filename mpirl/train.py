"""The sync training loop: rollout, backward, one allreduce, the same step on every rank."""

from __future__ import annotations

import csv
import hashlib
import os
import time
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

import topologies

from .a2c import Roller, a2c_loss, make_envs
from .config import Config
from .flat import FlatParams
from .model import ActorCritic
from .timing import PhaseTimer

PHASES = ("env_s", "forward_s", "backward_s", "exchange_s", "optimizer_s")


class ReplicaDivergence(RuntimeError):
    """Ranks hold different parameters or optimizer state: the comparison is void."""


def local_rank_count(comm: MPI.Comm) -> int:
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_size()
    finally:
        node.Free()


def make_run_dir(cfg: Config, comm: MPI.Comm) -> Path:
    """Rank 0 creates the run directory; every rank learns its path."""
    path = None
    if comm.Get_rank() == 0:
        name = cfg.run_name or (f"{cfg.topology}-{cfg.mode}-{comm.Get_size()}r-"
                                f"{time.strftime('%Y%m%d-%H%M%S')}")
        path = Path(cfg.run_dir) / name
        path.mkdir(parents=True, exist_ok=True)
        cfg.save(path / "config.yaml")
    return Path(comm.bcast(str(path) if path else None, root=0))


def replica_digest(flat: FlatParams, opt: torch.optim.Optimizer) -> str:
    """SHA-256 over the parameters and every tensor of the optimizer state."""
    h = hashlib.sha256(flat.param_np.tobytes())
    for state in opt.state.values():
        for key in sorted(state):
            value = state[key]
            h.update(value.numpy().tobytes() if torch.is_tensor(value) else repr(value).encode())
    return h.hexdigest()


def check_replicas(flat: FlatParams, opt: torch.optim.Optimizer, comm: MPI.Comm,
                   update: int) -> None:
    digests = comm.allgather(replica_digest(flat, opt))
    if len(set(digests)) != 1:
        odd = [r for r, d in enumerate(digests) if d != digests[0]]
        raise ReplicaDivergence(
            f"replicas diverged by update {update}: ranks {odd} differ from rank 0 in "
            "parameters or optimizer state")


def train(cfg: Config, comm: MPI.Comm) -> int:
    rank, size = comm.Get_rank(), comm.Get_size()
    torch.set_num_threads(cfg.torch_threads or
                          max(1, (os.cpu_count() or 1) // local_rank_count(comm)))
    run_dir = make_run_dir(cfg, comm)

    torch.manual_seed(cfg.seed)                  # same initial replica everywhere...
    envs = make_envs(cfg.env, cfg.num_envs, cfg.seed + 10000 * rank)
    model = ActorCritic(envs.single_observation_space, envs.single_action_space,
                        cfg.hidden, cfg.activation, cfg.layer_norm)
    flat = FlatParams(model)
    topo = topologies.get(cfg.topology)(comm)
    topo.bcast(flat.param_np, root=0)            # ...and made so, whatever torch does
    opt = torch.optim.Adam([flat.flat], lr=cfg.lr)
    torch.manual_seed(cfg.seed + 10000 * rank)   # each rank samples its own actions
    roller = Roller(envs, cfg.gamma, cfg.gae_lambda)
    roller.start(cfg.seed + 10000 * rank)

    steps_per_update = size * cfg.num_envs * cfg.rollout_steps
    n_updates = cfg.total_steps // steps_per_update
    timer = PhaseTimer()
    phase_sums = dict.fromkeys(PHASES, 0.0)
    recent: list[float] = []
    progress_path = run_dir / "progress.csv"
    writer = None
    if rank == 0:
        progress_file = open(progress_path, "w", newline="")
        writer = csv.writer(progress_file)
        writer.writerow(["update", "env_steps", "wall_s", "episodes", "mean_return", *PHASES])
        print(f"mpirl: {size} ranks, topology={cfg.topology}, mode={cfg.mode}, env={cfg.env}, "
              f"{flat.count} parameters, {n_updates} updates of {steps_per_update} steps",
              flush=True)
    start = time.perf_counter()
    for update in range(1, n_updates + 1):
        batch = roller.collect(model, cfg.rollout_steps, timer)
        with timer("backward_s"):
            flat.zero_grad()
            loss, _ = a2c_loss(model, batch, cfg.value_coef, cfg.entropy_coef)
            loss.backward()
        with timer("exchange_s"):
            topo.allreduce(flat.grad_np, average=True)
        with timer("optimizer_s"):
            if cfg.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_([flat.flat], cfg.max_grad_norm)
            opt.step()
        for phase, seconds in timer.take().items():
            phase_sums[phase] += seconds
        recent.extend(r for r, _ in roller.drain_episodes())
        if cfg.checksum_every and update % cfg.checksum_every == 0:
            flat.check_views()
            check_replicas(flat, opt, comm, update)
        if update % cfg.log_every == 0 or update == n_updates:
            totals = np.array([sum(recent), len(recent)], dtype=np.float64)
            comm.Reduce(MPI.IN_PLACE if rank == 0 else totals, totals, op=MPI.SUM, root=0)
            recent.clear()
            if rank == 0:
                wall = time.perf_counter() - start
                mean = totals[0] / totals[1] if totals[1] else float("nan")
                writer.writerow([update, update * steps_per_update, f"{wall:.3f}",
                                 int(totals[1]), f"{mean:.3f}",
                                 *(f"{phase_sums[p]:.4f}" for p in PHASES)])
                progress_file.flush()
                print(f"update {update:5d}  steps {update * steps_per_update:8d}  "
                      f"return {mean:8.2f}  ({int(totals[1])} episodes)  "
                      f"{update * steps_per_update / wall:7.0f} steps/s", flush=True)
    if cfg.checksum_every:
        check_replicas(flat, opt, comm, n_updates)
    if rank == 0:
        progress_file.close()
        spent = sum(phase_sums.values()) or 1.0
        shares = ", ".join(f"{p[:-2]} {100 * phase_sums[p] / spent:.0f}%" for p in PHASES)
        print(f"rank 0 time: {shares}")
        print(f"run files: {run_dir}/ (config.yaml, progress.csv)", flush=True)
    return 0

