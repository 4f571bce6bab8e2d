"""The scale simulator: closed-form sync, discrete-event parameter server, the command."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT
from mpirl.study.costmodel import Params
from mpirl.study.simulate import Compute, _SharedLink, simulate

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


def test_sync_with_joint_samples_waits_for_each_updates_slowest():
    """Two ranks measured side by side, slow by turns (0.01/0.03 s, then 0.03/0.01 s):
    drawn whole updates at a time every update waits 0.03 s; drawn independently a
    quarter of the updates would wait only 0.01 s."""
    joint = np.array([[0.01, 0.03], [0.03, 0.01]])
    together = simulate(FREE, "ring", "sync", 2, 1e6, Compute(joint=joint), 100)
    assert together.update_s == pytest.approx(0.03)
    apart = simulate(FREE, "ring", "sync", 2, 1e6,
                     Compute(per_rank={0: joint[:, 0], 1: joint[:, 1]}), 100)
    assert apart.update_s == pytest.approx(0.025, abs=0.002)


def test_async_server_applies_every_push_and_counts_staleness():
    p = simulate(FREE, "star", "async", 5, 1e6, Compute(mean_s=0.01), 100)
    assert p.updates_per_s == pytest.approx(4 / 0.01, rel=0.05)    # 4 workers, no waiting
    assert np.mean(p.staleness) == pytest.approx(3, abs=0.2)        # the other 3 went first
    assert p.idle_share < 0.05


def test_a_server_on_a_network_link_receives_while_it_replies():
    """1 MB each way at 1 GB/s (1 ms per message), a 0.2 ms step: on shared memory the
    server's CPU copies every push in and every reply out, so a saturated server manages
    one update per 2.2 ms (and the worker's own copy-out comes on top for a lone
    worker); over a network (duplex_links) its link takes one push in while it sends
    another reply out: one update per 1 ms, the link's busier direction.  Messages on
    one direction share it: two pushes at once each take twice as long."""
    cpu = Params(alpha=0.0, beta=1e-9, gamma=0.05e-9, delta=0.0)    # step: 4 gamma n
    net = Params(alpha=0.0, beta=1e-9, gamma=0.05e-9, delta=0.0, duplex_links=True)
    lone = Compute(mean_s=0.01)
    assert simulate(cpu, "star", "async", 2, 1e6, lone, 1).update_s == \
        pytest.approx(0.01 + 3e-3 + 0.2e-3, rel=0.02)
    assert simulate(net, "star", "async", 2, 1e6, lone, 1).update_s == \
        pytest.approx(0.01 + 2e-3 + 0.2e-3, rel=0.02)
    crowd = Compute(mean_s=1e-4)                                    # 63 eager workers
    assert simulate(cpu, "star", "async", 64, 1e6, crowd, 1).update_s == \
        pytest.approx(2.2e-3, rel=0.02)
    # (within 5%: at the start all 63 pushes share the link in and land together)
    assert simulate(net, "star", "async", 64, 1e6, crowd, 1).update_s == \
        pytest.approx(1e-3, rel=0.05)
    # a token bucket on the links: each message after an idle link leaves 1 bucket free
    bucket = Params(alpha=0.0, beta=1e-9, gamma=0.05e-9, delta=0.0, duplex_links=True,
                    burst_bytes=2e5)
    assert simulate(bucket, "star", "async", 2, 1e6, lone, 1).update_s == \
        pytest.approx(0.01 + 1.6e-3 + 0.2e-3, rel=0.02)


def test_messages_on_one_link_direction_share_it():
    """Two 1 s messages started together both end at 2 s; one started 0.5 s later than
    the other: the first ends at 1.5 s (0.5 alone, then half the rate), the second at
    2.0 s."""
    link = _SharedLink()
    link.start(1.0, 0, 0)
    link.start(1.0, 1, 0)
    assert link.next_end() == pytest.approx(2.0)
    link = _SharedLink()
    link.start(1.0, 0, 7)
    link.advance(0.5)
    link.start(1.0, 1, 8)
    assert link.next_end() == pytest.approx(1.5)
    link.advance(1.5)
    assert link.finish() == (0, 7)
    assert link.next_end() == pytest.approx(2.0)
    link.advance(2.0)
    assert link.finish() == (1, 8) and link.next_end() == math.inf


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


def test_a_runs_rounds_are_read_with_their_allreduces(tmp_path):
    """--compute-from reads rounds, not rows: a sync PPO run at 3 ranks with 3 update
    repeats of 2 minibatches takes 6 allreduces per rollout, and each round's compute
    is the sum of its 6 rows'."""
    from mpirun import run_mpi

    from conftest import BATCH
    from mpirl.study.simulate import compute_from_run, simulate_sync
    from mpirl.telemetry.read import load_run

    run_mpi(3, ["-m", "mpirl.run", *BATCH, "--update-repeat", "3", "--minibatches", "2",
                "--total-steps", "480", "--run-dir", str(tmp_path), "--run-name", "r"],
            timeout_s=120)
    found = compute_from_run(tmp_path / "r")
    run = load_run(tmp_path / "r")
    u = run.updates[run.updates["role"] == "worker"].sort_values(["rank", "update"])
    per_rank = run.config["num_envs"] * run.config["rollout_steps"]
    rounds = len(u) // 6
    assert len(u) == 6 * rounds and rounds >= 6                 # 3 ranks x >= 2 rollouts
    assert found.exchanges == 6.0 and found.steps == per_rank
    assert found.nbytes == run.summary["gradient_bytes"]
    assert len(found.samples) == rounds - 1                     # the last one left out
    first = u[u["rank"] == 0]["compute_s"].to_numpy()[:6].sum()
    assert found.samples[0] == pytest.approx(first)
    # six allreduces a round cost more than one
    compute = Compute(samples=found.samples, seed=0)
    params = Params(alpha=1e-3, beta=1e-8, gamma=0.0, delta=0.0)
    six = simulate_sync(params, "ring", 8, found.nbytes, compute, found.steps, exchanges=6)
    one = simulate_sync(params, "ring", 8, found.nbytes, Compute(samples=found.samples,
                                                                seed=0), found.steps)
    assert six.update_s > one.update_s
