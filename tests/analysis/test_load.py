"""analysis.load: the tidy tables of a real tiny sweep and of a benchmark file."""

from __future__ import annotations

import numpy as np
import pytest

import analysis
from conftest import TINY_ASYNC as ASYNC, TINY_SYNC_2R as SYNC_2R
from mpirl.telemetry.schema import PHASES


@pytest.fixture(scope="module")
def sweep(tiny_sweep):
    return analysis.load_sweep(tiny_sweep)


def test_runs_table_has_one_row_per_run_with_its_design(sweep):
    runs = sweep.runs.set_index("run")
    assert len(runs) == 5 and runs["finished"].all()
    assert runs.loc[ASYNC, ["topology", "mode", "ranks", "workers", "straggler"]].tolist() == \
        ["star", "async", 3, 2, "1:2"]
    assert (runs["env_steps_per_s"] > 0).all()
    shares = runs[["compute_share", "wait_share", "transfer_share"]].sum(axis=1)
    assert np.allclose(shares, 1.0)
    # 1-rank sync runs are the reference: their mean efficiency is 1 by construction
    assert runs[runs["ranks"] == 1]["efficiency"].mean() == pytest.approx(1.0)
    table = analysis.scaling(sweep.runs)
    assert set(table["ranks"]) == {1, 2, 3} and (table["seeds"] == 1).all()


def test_every_second_of_a_rank_is_in_exactly_one_column(sweep):
    for run in sweep.by_name.values():
        for _, u in run.updates.groupby("rank"):
            u = u.sort_values("t_s")
            period = u["t_s"].diff().iloc[1:].to_numpy()
            accounted = u[list(PHASES)].sum(axis=1).iloc[:-1].to_numpy() + \
                u["log_s"].iloc[1:].to_numpy()
            assert np.allclose(period, accounted, atol=2e-4), run.name


def test_sync_waiting_is_derived_from_when_ranks_entered(sweep):
    u = sweep.by_name[SYNC_2R].updates
    assert u["wait_s"].notna().all()
    assert np.allclose(u["wait_s"] + u["transfer_s"], u["exchange_s"])
    assert (u["wait_s"] >= 0).all() and (u["transfer_s"] >= 0).all()
    # the last rank to enter an update's allreduce waits for nobody
    assert (u.groupby("update")["wait_s"].min() == 0).all()
    assert (u.groupby("update")["wait_s"].max() > 0).mean() > 0.5


def test_parameter_server_measures_its_own_waiting(sweep):
    run = sweep.by_name[ASYNC]
    u = run.updates
    assert (u["wait_s"] <= u["exchange_s"] + 1e-9).all() and (u["wait_s"] >= 0).all()
    server = u[u["role"] == "server"]
    assert server["wait_s"].sum() > 0.5 * server["exchange_s"].sum()   # mostly idle
    assert len(run.staleness) == run.summary["gradients_applied"]
    e = run.episodes
    assert (np.diff(e["env_steps"]) >= 0).all() and e["env_steps"].iloc[-1] <= \
        run.summary["env_steps"]


def test_bench_file_loads_as_a_table(bench_file):
    bench = analysis.load_bench(bench_file.parent)
    assert set(bench["topology"]) >= {"native", "star", "tree", "butterfly", "ring",
                                      "native:recursive_doubling", "native:binomial"}
    assert set(bench["op"]) == {"allreduce", "bcast"}
    assert sorted(bench["bytes"].unique()) == [4, 1024, 65536]
    refused = bench[bench["avg_s"].isna()]          # MPICH refused a forced algorithm
    assert refused["topology"].str.startswith("native:").all()
    timed = bench.dropna()
    assert (timed["min_s"] <= timed["avg_s"]).all() and (timed["avg_s"] <= timed["max_s"]).all()
    assert (bench["ranks"] == 2).all()


def test_every_gradient_logs_its_losses(sweep):
    """A worker's row carries the losses of the gradient it computed (A2C: no KL); a
    server's row, which computes none, carries NaN."""
    for run in sweep.by_name.values():
        u = run.updates
        workers, server = u[u["role"] == "worker"], u[u["role"] == "server"]
        assert np.isfinite(workers[["policy_loss", "value_loss", "entropy"]]).all().all()
        assert (workers["value_loss"] >= 0).all() and (workers["entropy"] > 0).all()
        assert workers["approx_kl"].isna().all()           # no --clip-ratio in the sweep
        assert server[["policy_loss", "value_loss", "entropy", "approx_kl"]].isna().all().all()
