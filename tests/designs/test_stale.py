"""sync --one-step-stale (mpirl/designs/stale.py): the next rollout is collected while the
last gradient is averaged on the exchange's thread."""

from __future__ import annotations

import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import train_many
from mpirun import ROOT, run_mpi

#: 2 envs x 8 steps per rank and rollout; a checkpoint (a flush) every 4 rollouts
RUN = ["--total-steps", "1536", "--checkpoint-every", "4", "--checksum-every", "1"]


def staleness(run_dir, rank: int = 0) -> np.ndarray:
    with h5py.File(run_dir / f"rank{rank:04d}.h5", "r") as f:
        return f["updates"]["staleness"][:]


@pytest.mark.parametrize("nranks, topology", [(2, "butterfly"), (3, "native")])
def test_a_stale_run_keeps_replicas_identical_and_logs_one_update_of_staleness(
        tmp_path, nranks, topology):
    """Every update's replicas compared (--checksum-every 1); MPI's own allreduce on the
    exchange's thread while the loop's collectives run on the main one (native), and
    --overlap's buckets with it (ring)."""
    runs = train_many(tmp_path, nranks, {
        "plain": ["--topology", topology, *RUN],
        "stale": ["--topology", topology, *RUN, "--one-step-stale"],
        "buckets": ["--topology", "ring", *RUN, "--one-step-stale", "--overlap",
                    "--bucket-mb", "0.005"]})
    plain, stale = runs["plain"], runs["stale"]
    assert stale["updates"] == plain["updates"] == runs["buckets"]["updates"] > 8
    assert stale["env_steps"] == plain["env_steps"]
    assert stale["gradients_applied"] == stale["updates"] * nranks
    # the data is one update older than the step: another run, not the plain one
    assert stale["param_digest"] != plain["param_digest"]
    # fresh after each flush (the start, each checkpoint), one update stale otherwise
    expected = [0 if (u - 1) % 4 == 0 else 1 for u in range(1, stale["updates"] + 1)]
    for name in ("stale", "buckets"):
        for r in range(nranks):
            assert staleness(tmp_path / name, r).tolist() == expected, (name, r)
    assert not staleness(tmp_path / "plain").any()


def test_a_resumed_stale_run_ends_where_an_uninterrupted_one_does(tmp_path):
    """Both flush at the same rollouts (each checkpoint), so the resumed run's parameters
    are the uninterrupted run's, byte for byte."""
    runs = train_many(tmp_path, 2, {"full": [*RUN, "--one-step-stale"],
                                    "half": [*RUN, "--one-step-stale", "--total-steps", "768"]})
    run_mpi(2, ["-m", "mpirl.run", "--resume", str(tmp_path / "half"), "--total-steps",
                "1536"], timeout_s=120)
    resumed = (tmp_path / "half" / "summary.json").read_text()
    assert runs["full"]["param_digest"] in resumed
    assert runs["half"]["param_digest"] != runs["full"]["param_digest"]


@pytest.mark.parametrize("flags, fragment", [
    (["--minibatches", "2"], "one_step_stale with minibatches=2, update_repeat=1"),
    (["--update-repeat", "3"], "one_step_stale with minibatches=1, update_repeat=3"),
    (["--on-failure", "shrink"], "one_step_stale with on_failure='shrink' is not supported"),
    (["--compress", "topk"], "one_step_stale with compress='topk' is not supported"),
    (["--mode", "async", "--topology", "star"], "one_step_stale=True is not taken by "
                                                "mode='async'"),
])
def test_stale_refusals_are_one_line(flags, fragment):
    done = subprocess.run([sys.executable, "-m", "mpirl.run", "--one-step-stale", *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert fragment in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
