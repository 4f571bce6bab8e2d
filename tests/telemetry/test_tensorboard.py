"""--tensorboard: the progress scalars and rank 0's losses as TensorBoard event files,
read back with TensorBoard's own reader and compared with progress.csv and the log."""

from __future__ import annotations

import csv

import h5py
import pytest

from conftest import require
from mpirun import run_mpi


def events(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return acc


def progress(run_dir) -> list[dict]:
    with open(run_dir / "progress.csv") as f:
        return list(csv.DictReader(f))


@pytest.fixture(autouse=True)
def _tensorboard():
    from mpirl.telemetry.tensorboard import missing

    require(missing())


def test_a_sync_run_writes_its_progress_and_losses(tmp_path):
    run_mpi(2, ["-m", "mpirl.run", "--total-steps", "4096", "--log-every", "8",
                "--tensorboard", "--run-dir", str(tmp_path), "--run-name", "s"], timeout_s=180)
    acc = events(tmp_path / "s")
    tags = set(acc.Tags()["scalars"])
    assert {"return/mean", "throughput/env_steps_per_s", "exchange/comm_share",
            "loss/policy", "loss/value", "loss/entropy"} <= tags
    assert "loss/approx_kl" not in tags           # A2C: no clipped objective, NaN: left out
    rows = progress(tmp_path / "s")
    returns = acc.Scalars("return/mean")
    assert [e.step for e in returns] == [int(r["env_steps"]) for r in rows]
    for event, row in zip(returns, rows, strict=True):
        assert event.value == pytest.approx(float(row["mean_return"]), abs=1e-3)
    share = acc.Scalars("exchange/comm_share")[-1].value
    assert share == pytest.approx(float(rows[-1]["comm_share"]), abs=1e-4)
    with h5py.File(tmp_path / "s" / "rank0000.h5", "r") as f:
        u = f["updates"][...]
    losses = acc.Scalars("loss/policy")
    assert [e.step for e in losses] == list(u["update"])
    assert [e.value for e in losses] == pytest.approx(list(u["policy_loss"]), rel=1e-5)


def test_an_impala_run_writes_its_learners_waiting_and_lag(tmp_path):
    run_mpi(3, ["-m", "mpirl.run", "--mode", "impala", "--total-steps", "3000",
                "--log-every", "10", "--tensorboard", "--run-dir", str(tmp_path),
                "--run-name", "i"], timeout_s=180)
    acc = events(tmp_path / "i")
    tags = set(acc.Tags()["scalars"])
    assert {"wait/learner", "lag/mean", "return/mean", "loss/policy"} <= tags
    assert "exchange/comm_share" not in tags
    rows = progress(tmp_path / "i")
    waits = [e.value for e in acc.Scalars("wait/learner")]
    assert waits == pytest.approx([float(r["wait_share"]) for r in rows], abs=1e-4)
