"""The alpha-beta-gamma model: formulas, the fit, crossovers, and the command."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT
from mpirl.study.costmodel import (Params, coefficients, crossover, fit, link_bytes, predict,
                                   predict_levels)


def test_formulas_count_messages_bytes_and_reductions():
    n = 1000.0
    assert coefficients("allreduce", "butterfly", 4, n)[:3] == (2, 2 * n, 2 * n)
    # 5 ranks fold into 4: two extra steps (send in, send out), one extra reduction
    assert coefficients("allreduce", "butterfly", 5, n)[:3] == (4, 4 * n, 3 * n)
    assert coefficients("allreduce", "ring", 4, n)[:3] == (6, 1.5 * n, 0.75 * n)
    assert coefficients("allreduce", "star", 4, n)[:3] == (6, 6 * n, 3 * n)
    assert coefficients("allreduce", "tree", 5, n)[:3] == (6, 6 * n, 3 * n)
    assert coefficients("bcast", "tree", 8, n)[:3] == (3, 3 * n, 0.0)
    assert coefficients("allreduce", "native:ring", 4, n)[3] is False
    assert coefficients("allreduce", "ring", 4, n)[3] is True        # Python: delta applies


def synthetic(params: Params) -> pd.DataFrame:
    rows = []
    for ranks in (2, 3, 4, 8):
        for nbytes in (4, 1024, 8192, 65536, 1 << 20, 16 << 20):
            for op, names in (("allreduce", ["star", "tree", "butterfly", "ring",
                                             "native:recursive_doubling", "native:ring"]),
                              ("bcast", ["tree", "star", "native:binomial"])):
                for name in names:
                    rows.append({"op": op, "topology": name, "ranks": ranks, "bytes": nbytes,
                                 "avg_s": predict(params, op, name, ranks, nbytes)})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("truth", [
    Params(alpha=5e-6, beta=2e-10, gamma=3e-10, delta=2e-6),
    Params(alpha=5e-6, beta=2e-10, gamma=3e-10, delta=2e-6, rendezvous=4e-6,
           eager_bytes=16384.0),
])
def test_fit_recovers_the_parameters_that_made_the_data(truth):
    got, used = fit(synthetic(truth))
    assert used.all()
    for key, value in truth.as_dict().items():
        assert getattr(got, key) == pytest.approx(value, rel=1e-6), key


def test_link_bytes_of_a_token_bucket_link_by_hand():
    B = 100.0
    assert link_bytes(1000.0, 2, 0.0, 0.0) == 1000.0           # a plain link: all of them
    # star, idle links: each of 2 phases of 500 starts with a full bucket of 100
    assert link_bytes(1000.0, 2, B, B) == 800.0
    # back to back, nothing refilled: one direction still carries 500 per call
    assert link_bytes(1000.0, 2, B, 0.0) == 800.0
    assert link_bytes(300.0, 2, B, 0.0) == 150.0               # 2 x 50 < 150: the rate binds
    assert link_bytes(300.0, 2, B, 40.0) == 110.0
    assert link_bytes(300.0, 2, B, B) == 100.0
    # ring/butterfly (1 phase): back to back no credit; after idle one bucket
    assert link_bytes(1000.0, 1, B, 0.0) == 1000.0
    assert link_bytes(1000.0, 1, B, B) == 900.0
    assert link_bytes(50.0, 1, B, B) == 0.0                    # fits in the burst


def test_predict_on_a_token_bucket_link():
    plain = Params(alpha=1e-5, beta=1e-8, gamma=0.0, delta=0.0)
    bucket = Params(alpha=1e-5, beta=1e-8, gamma=0.0, delta=0.0, burst_bytes=1000.0,
                    refill_bytes=1000.0)
    n = 10_000.0                 # star at 3 ranks: 4 messages, 40,000 bytes in 2 phases
    assert predict(plain, "allreduce", "star", 3, n) == pytest.approx(4e-5 + 40_000e-8)
    assert predict(bucket, "allreduce", "star", 3, n) == pytest.approx(4e-5 + 38_000e-8)
    assert predict(bucket, "allreduce", "ring", 3, n) == \
        pytest.approx(4e-5 + (4 / 3 * n - 1000) * 1e-8)


def test_two_levels_price_the_node_and_the_link_each_with_their_own_fit():
    """hierarchical (ring among the leaders) at 4 nodes x 2 ranks, by hand: inside a node
    a binomial reduce and broadcast (2 messages of n, n added once, MPI's own: no
    delta); over the link the ring over 4 leaders (6 messages from Python, 1.5 n moved
    and 0.75 n added)."""
    node = Params(alpha=1e-6, beta=1e-10, gamma=1e-11, delta=5e-6)
    link = Params(alpha=1e-4, beta=1e-8, gamma=2e-11, delta=3e-6)
    n = 1 << 20
    inside = 2 * 1e-6 + 2 * n * 1e-10 + n * 1e-11
    across = 6 * (1e-4 + 3e-6) + 1.5 * n * 1e-8 + 0.75 * n * 2e-11
    assert predict_levels(node, link, "allreduce", "hierarchical", 4, 2, n) == \
        pytest.approx(inside + across)
    # the link level is the inner topology over the leaders, whichever one it is
    assert predict_levels(node, link, "allreduce", "hierarchical:butterfly", 4, 2, n) == \
        pytest.approx(inside + predict(link, "allreduce", "butterfly", 4, n))
    # one rank per node: no node level; one node: no link level
    assert predict_levels(node, link, "allreduce", "hierarchical", 4, 1, n) == \
        pytest.approx(across)
    assert predict_levels(node, link, "allreduce", "hierarchical", 1, 2, n) == \
        pytest.approx(inside)
    with pytest.raises(KeyError, match="one level"):
        predict_levels(node, link, "allreduce", "native", 4, 2, n)


def test_a_flat_exchange_over_nodes_pays_each_round_at_its_level():
    """butterfly at 4 nodes x 2 ranks, by hand: its first round inside a node (one
    message of n, n added), its two later rounds over the link, each with both ranks of
    a node sending n over it (2 messages, 4 n on the link, 2 n added); all from Python."""
    node = Params(alpha=1e-6, beta=1e-10, gamma=1e-11, delta=5e-6)
    link = Params(alpha=1e-4, beta=1e-8, gamma=2e-11, delta=3e-6)
    n = 1 << 20
    inside = (1e-6 + 5e-6) + n * 1e-10 + n * 1e-11
    across = 2 * (1e-4 + 3e-6) + 4 * n * 1e-8 + 2 * n * 2e-11
    assert predict_levels(node, link, "allreduce", "butterfly", 4, 2, n) == \
        pytest.approx(inside + across)
    # ring: every step waits for the message crossing a link
    assert predict_levels(node, link, "allreduce", "ring", 4, 2, n) == \
        pytest.approx(predict(link, "allreduce", "ring", 8, n))


def test_fit_with_a_held_beta_finds_the_buckets_refill():
    """Data made on token-bucket links (beta and burst known, refill 3/8 of the bucket)
    is fitted back, refill included, with beta and the burst held."""
    truth = Params(alpha=5e-5, beta=8e-9, gamma=3e-10, delta=2e-6, burst_bytes=125_000.0,
                   refill_bytes=0.375 * 125_000.0)
    table = synthetic(truth)
    table = table[table["bytes"] >= 8192]
    got, used = fit(table, beta=truth.beta, burst=truth.burst_bytes)
    assert used.all()
    for key, value in truth.as_dict().items():
        assert getattr(got, key) == pytest.approx(value, rel=1e-6), key


def test_fit_never_returns_negative_parameters():
    table = synthetic(Params(alpha=5e-6, beta=2e-10, gamma=0.0, delta=0.0))
    table["avg_s"] *= np.random.default_rng(0).uniform(0.7, 1.3, len(table))   # noise
    got, _ = fit(table)
    assert min(got.as_dict().values()) >= 0.0


def test_crossover_is_where_the_costs_meet():
    params = Params(alpha=5e-6, beta=2e-10, gamma=3e-10, delta=2e-6)
    n = crossover(params, "allreduce", "butterfly", "ring", 8)
    assert n and predict(params, "allreduce", "butterfly", 8, n) == pytest.approx(
        predict(params, "allreduce", "ring", 8, n), rel=1e-9)
    assert predict(params, "allreduce", "ring", 8, 2 * n) < \
        predict(params, "allreduce", "butterfly", 8, 2 * n)


def test_costmodel_command_fits_a_real_benchmark(bench_file, tmp_path):
    out = subprocess.run([sys.executable, "-m", "mpirl.costmodel", str(bench_file), "-o",
                          str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "alpha" in out.stdout and "crossovers" in out.stdout
    params = json.loads((tmp_path / "params.json").read_text())
    assert set(params) == {"alpha", "beta", "gamma", "delta", "rendezvous", "eager_bytes",
                           "burst_bytes", "refill_bytes", "duplex_links"}
    # one machine: no capped link, and shared memory rather than a network
    assert params["burst_bytes"] == 0.0 and params["duplex_links"] is False
    assert all(v >= 0 for v in params.values()) and params["alpha"] + params["delta"] > 0
    errors = pd.read_csv(tmp_path / "errors.csv")
    assert errors["rel_error"].abs().median() < 1.0     # within 2x on the median row
