"""The scale simulator: closed-form sync, discrete-event parameter server, the command."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT
from mpirl.study.costmodel import Params
from mpirl.study.simulate import Compute, simulate

FREE = Params(alpha=0.0, beta=0.0, gamma=0.0, delta=0.0)


def test_sync_waits_for_the_slowest_rank():
    fixed = simulate(FREE, "butterfly", "sync", 8, 1e6, Compute(mean_s=0.01), 100)
    assert fixed.update_s == pytest.approx(0.01) and fixed.idle_share == pytest.approx(0)
    slow = simulate(FREE, "butterfly", "sync", 8, 1e6,
                    Compute(mean_s=0.01, stragglers={3: 3.0}), 100)
    assert slow.update_s == pytest.approx(0.03)
    assert slow.idle_share == pytest.approx(1 - (7 * 0.01 + 0.03) / 8 / 0.03)
    costly = Params(alpha=1e-5, beta=1e-9, gamma=0.0, delta=0.0)
    with_exchange = simulate(costly, "ring", "sync", 4, 1e6, Compute(mean_s=0.01), 100)
    assert with_exchange.update_s == pytest.approx(0.01 + 6 * 1e-5 + 1.5e6 * 1e-9)


def test_async_server_applies_every_push_and_counts_staleness():
    p = simulate(FREE, "star", "async", 5, 1e6, Compute(mean_s=0.01), 100)
    assert p.updates_per_s == pytest.approx(4 / 0.01, rel=0.05)    # 4 workers, no waiting
    assert np.mean(p.staleness) == pytest.approx(3, abs=0.2)        # the other 3 went first
    assert p.idle_share < 0.05


def test_quorum_of_all_workers_is_sync_and_never_stale():
    p = simulate(FREE, "star", "quorum", 5, 1e6, Compute(mean_s=0.01), 100, quorum=4)
    assert p.updates_per_s == pytest.approx(100, rel=0.05) and not p.staleness.any()


def test_the_server_saturates_as_workers_grow():
    """The seed's weakness of the parameter server: its link and its optimizer step."""
    params = Params(alpha=1e-5, beta=1e-9, gamma=1e-9, delta=0.0)
    rates = [simulate(params, "star", "async", p, 1e5, Compute(mean_s=0.01), 100).updates_per_s
             for p in (8, 64, 512)]
    per_push = 2 * (1e-5 + 1e5 * 1e-9) + 4 * 1e5 * 1e-9
    assert rates[0] < rates[1] <= rates[2] <= 1 / per_push * 1.01
    assert rates[2] == pytest.approx(1 / per_push, rel=0.05)


def test_sharded_servers_divide_the_bottleneck():
    """Gorila's answer to the star's weakness: S shard servers, n / S bytes each."""
    params = Params(alpha=1e-5, beta=1e-9, gamma=1e-9, delta=0.0)
    one, four = (simulate(params, "star", "async", 512, 1e6, Compute(mean_s=0.01), 100,
                          servers=s) for s in (1, 4))
    per_push = 2 * (1e-5 + 1e6 * 1e-9) + 4 * 1e6 * 1e-9
    assert one.updates_per_s == pytest.approx(1 / per_push, rel=0.05)
    shard = 2 * (1e-5 + 0.25e6 * 1e-9) + 4 * 0.25e6 * 1e-9
    assert four.updates_per_s == pytest.approx(1 / shard, rel=0.05)
    assert four.topology == "4 shards" and four.updates_per_s > 3.5 * one.updates_per_s


def test_designs_it_does_not_model_are_refused():
    with pytest.raises(ValueError, match="mode='apex' is not simulated"):
        simulate(FREE, "butterfly", "apex", 4, 1e6, Compute(mean_s=0.01), 100)


def test_simulate_command_predicts_to_4096_and_validates_against_runs(tiny_sweep, bench_file,
                                                                     tmp_path):
    fitted = tmp_path / "cm"
    subprocess.run([sys.executable, "-m", "mpirl.costmodel", str(bench_file), "-o",
                    str(fitted)], cwd=ROOT, check=True, capture_output=True, timeout=120)
    out = subprocess.run(
        [sys.executable, "-m", "mpirl.simulate", "--params", str(fitted / "params.json"),
         "--compute-from", str(tiny_sweep / "butterfly-sync-2r-s1"), "--measured",
         str(tiny_sweep), "-o", str(tmp_path / "sim")], cwd=ROOT, capture_output=True,
        text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    table = pd.read_csv(tmp_path / "sim" / "predictions.csv")
    assert table["ranks"].max() == 4096
    assert set(zip(table["topology"], table["mode"], strict=True)) >= {
        ("butterfly", "sync"), ("ring", "sync"), ("star", "async"), ("star", "quorum")}
    checks = pd.read_csv(tmp_path / "sim" / "validation.csv")
    assert len(checks) == 5 and checks["error"].notna().all()
    assert (tmp_path / "sim" / "predicted_scaling.png").stat().st_size > 10000
