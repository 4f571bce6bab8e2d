"""Elastic training: commits held in node memory, and a restart on the nodes that are left.

MPICH ends a job when one of its nodes dies, and no MPI runtime released today keeps a
job alive across a lost node's daemon (docs/cluster.md).  Practitioners survive a lost
node the way Horovod Elastic (``state.commit()`` / ``state.restore()``) and
TorchElastic do: keep a recent copy of the training state in memory, and when a node
goes, start again on the nodes that are left from that copy, with fewer ranks.

- **Commit.** Every ``--commit-every`` rollouts (at a rollout's end, where every rank
  holds the same replica) the lowest rank on each node writes the replicated state
  (parameters, Adam, observation statistics, where the run is: update, rollouts, env
  steps) to the node's memory: ``$MPIRL_COMMIT_DIR`` (default ``/dev/shm/mpirl-commits``)
  ``/<job>/<hostname>/commit.pt``, to a temporary name renamed over the last, so a
  node dying mid-write leaves the previous commit whole.  Every node holds a whole
  copy, so any one surviving node is enough.  A stop by signal commits too.
- **Restart.** A driver (``python -m mpirl.cluster exec --elastic``, the sbatch template
  ``experiments/slurm/elastic.sbatch``) launches attempt 0, 1, ... with
  ``MPIRL_ELASTIC_JOB`` (one id per elastic job) and ``MPIRL_ELASTIC_ATTEMPT``.  At the
  start of attempt N >= 1 each rank reads its own node's commit, the ranks agree on the
  newest (an allreduce MAXLOC over the update), and its owner broadcasts it; every rank
  loads it, so a node that rejoined (it holds no commit) starts from the same state.
- **What is not kept.** What each rank holds alone: its envs' episodes in progress (the
  envs are reset, seeded afresh for the attempt), its episode statistics and its log
  (each attempt writes its own run directory ``RUN_DIR/NAME/attemptN``).  Work lost to a
  node's death is what was learnt since the last commit: at most ``--commit-every``
  rollouts.

The commit is a file in tmpfs rather than a Python object because the process that
made it does not survive: MPICH's launcher kills every rank when a node dies.
"""

from __future__ import annotations

import io
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

#: where the driver's environment names the job and the attempt
JOB_VAR, ATTEMPT_VAR, DIR_VAR = "MPIRL_ELASTIC_JOB", "MPIRL_ELASTIC_ATTEMPT", "MPIRL_COMMIT_DIR"
DEFAULT_DIR = "/dev/shm/mpirl-commits"
COMMIT_FILE = "commit.pt"
#: the run directory of one attempt, under the job's
ATTEMPT_DIR = "attempt{}"


def commit_root() -> Path:
    """The directory of every elastic job's commits on this node (node memory)."""
    return Path(os.environ.get(DIR_VAR) or DEFAULT_DIR)


def job_dir(job: str, root: Path | None = None) -> Path:
    return (root or commit_root()) / job


def host_dir(job: str, host: str, root: Path | None = None) -> Path:
    """What node ``host`` holds of ``job``: a dead node's is gone (the driver drops it)."""
    return job_dir(job, root) / host


@dataclass(frozen=True)
class Launch:
    """This launch of an elastic job, as its driver named it (None: no driver)."""

    job: str
    attempt: int

    @classmethod
    def from_env(cls) -> "Launch | None":
        job = os.environ.get(JOB_VAR, "")
        if not job:
            return None
        raw = os.environ.get(ATTEMPT_VAR, "0")
        if not raw.isdigit():
            raise ConfigError(f"{ATTEMPT_VAR}={raw!r}; allowed: 0, 1, 2, ...")
        return cls(job, int(raw))

    def run_name(self, name: str) -> str:
        """The attempt's run directory under the job's: ``NAME/attemptN``."""
        return f"{name or self.job}/{ATTEMPT_DIR.format(self.attempt)}"


class NodeCommits:
    """The commits of one elastic job on this rank's node; the lowest rank on each node
    writes them (collective to build: every rank learns its node's ranks)."""

    def __init__(self, comm, job: str) -> None:
        hosts = comm.allgather(socket.gethostname())
        self.comm, self.job = comm, job
        self.host = hosts[comm.Get_rank()]
        self.hosts = hosts
        self.writer = hosts.index(self.host) == comm.Get_rank()
        self.path = host_dir(job, self.host) / COMMIT_FILE
        self.count = 0
        self.seconds = 0.0
        self.nbytes = 0
        self.record: dict = {}    # what the attempt's elastic.json says of it

    def commit(self, update: int, env_steps: int, payload: dict) -> None:
        """Write the design's ``payload`` (what its replicas share) of ``update`` to this
        node's memory (its lowest rank only), atomically."""
        if not self.writer:
            return
        import torch

        state = {**payload, "update": update, "env_steps": env_steps,
                 "ranks": self.comm.Get_size(), "unix_s": time.time(),
                 "job_started_unix_s": self.record["job_started_unix_s"]}
        started = time.perf_counter()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:           # tmpfs: no fsync, the node's memory is it
            torch.save(state, f)
            self.nbytes = f.tell()
        os.replace(tmp, self.path)
        self.count += 1
        self.seconds += time.perf_counter() - started

    def newest(self) -> tuple[dict | None, dict]:
        """The newest commit any node holds, on every rank (collective), and where it
        came from: ``{"update", "host", "rank", "seconds"}`` (update -1: no node holds one)."""
        import numpy as np
        import torch
        from mpi4py import MPI

        started = time.perf_counter()
        rank = self.comm.Get_rank()
        mine, update = None, -1
        if self.writer and self.path.is_file():
            try:
                mine = torch.load(self.path, weights_only=True)
                update = int(mine["update"])
            except Exception:        # not a whole commit: this node has none
                mine, update = None, -1
        best, owner = self.comm.allreduce((update, rank), op=MPI.MAXLOC)
        where = {"update": best, "host": self.hosts[owner], "rank": owner, "seconds": 0.0}
        if best < 0:
            return None, where
        payload = None
        if rank == owner:
            buf = io.BytesIO()
            torch.save(mine, buf)
            payload = np.frombuffer(buf.getbuffer(), dtype=np.uint8)
        size = self.comm.bcast(payload.size if payload is not None else None, root=owner)
        data = payload if payload is not None else np.empty(size, dtype=np.uint8)
        self.comm.Bcast(data, root=owner)     # once per start: the commit's bytes as one buffer
        state = mine if rank == owner else torch.load(io.BytesIO(data.tobytes()),
                                                      weights_only=True)
        where["seconds"] = time.perf_counter() - started
        return state, where


    def discard(self) -> None:
        """The job is done: this node's commits are freed (its lowest rank; the driver
        can only reach its own node's memory)."""
        if self.writer:
            import shutil

            shutil.rmtree(self.path.parent, ignore_errors=True)

    def job_wall_s(self) -> float:
        """Seconds since the elastic job's first attempt started."""
        return time.time() - self.record["job_started_unix_s"]

    def write_record(self, run_dir: Path, rank: int, ended: bool = True) -> None:
        """RUN_DIR/elastic.json (rank 0): the attempt, what it continued from, and once it
        ended, its commits (those of rank 0's node)."""
        if rank != 0:
            return
        import json

        out = dict(self.record)
        if ended:                 # what a killed attempt did after its start is not known
            out.update(commits=self.count, commit_s=self.seconds, commit_bytes=self.nbytes,
                       ended_unix_s=time.time())
        (Path(run_dir) / "elastic.json").write_text(json.dumps(out, indent=1) + "\n")


def start(cfg, comm, run_dir: Path, elapsed_s: float, *, restore, reseed) -> NodeCommits | None:
    """With ``--commit-every``, this rank's node's commits (collective, every rank).  On
    an elastic driver's attempt N >= 1: the newest commit any node holds handed to
    ``restore(state)`` (the design loads its replica and counters), then
    ``reseed(seed)`` with the attempt's seed; the wall clock then counts from the job's
    first start (so steps/s are the whole job's, lost work and restarts included):
    ``elapsed_s`` is the run's so far; the design's clock takes :meth:`job_wall_s`
    back.  None without ``--commit-every``."""
    if not cfg.commit_every:
        return None
    launch = Launch.from_env()
    commits = NodeCommits(comm, launch.job if launch else Path(run_dir).name)
    rank, now = comm.Get_rank(), time.time()
    commits.record = {"job": commits.job, "attempt": launch.attempt if launch else 0,
                      "ranks": comm.Get_size(), "hosts": sorted(set(commits.hosts)),
                      "commit_every": cfg.commit_every, "started_unix_s": now,
                      "job_started_unix_s": now - elapsed_s, "restored": None}
    if launch is not None and launch.attempt > 0:
        state, where = commits.newest()
        if state is not None:
            restore(state)
            commits.record["job_started_unix_s"] = float(state["job_started_unix_s"])
            commits.record["restored"] = {**where, "env_steps": int(state["env_steps"]),
                                          "committed_by_ranks": int(state["ranks"])}
        reseed(attempt_seed(cfg.seed, launch.attempt))
        if rank == 0:
            print(f"mpirl: elastic job {commits.job}, attempt {launch.attempt}: "
                  f"{comm.Get_size()} ranks on {', '.join(commits.record['hosts'])}; "
                  + (f"continuing from update {where['update']} ({state['env_steps']} env "
                     f"steps), committed on {where['host']}, restored in "
                     f"{where['seconds']:.2f} s" if state is not None
                     else "no node holds a commit: starting afresh"), flush=True)
    commits.write_record(run_dir, rank, ended=False)     # a killed attempt keeps this
    return commits


def attempt_seed(seed: int, attempt: int) -> int:
    """The seed of attempt ``attempt``'s envs and action sampling (attempt 0: ``seed``),
    so that a restart does not replay the first attempt's episodes."""
    return seed + 1_000_003 * attempt
