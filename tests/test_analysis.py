"""analysis: the tidy tables, the figures command and the notebooks, on a real tiny sweep."""

from __future__ import annotations

import os
import subprocess
import sys

import matplotlib.image
import nbclient
import nbformat
import numpy as np
import pytest

import analysis
from conftest import ROOT
from mpirl.telemetry.schema import PHASES

SYNC_2R = "butterfly-sync-2r-s1"
ASYNC = "star-async-3r-s1-env_Delay_v0-env_arg_cost_s_0.001+episode_steps_20-straggler_1_2"


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


def test_plot_command_writes_every_figure(tiny_sweep, bench_file, tmp_path):
    out = tmp_path / "figs"
    result = subprocess.run([sys.executable, "-m", "analysis.plot", str(tiny_sweep),
                             str(bench_file), "-o", str(out)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stdout + result.stderr
    names = ["scaling", "breakdown", "staleness", "learning", "latency", "sim_steps",
             f"timeline-{SYNC_2R}", f"timeline-{ASYNC}"]
    for name in names:
        for fmt in ("png", "pdf"):
            path = out / f"{name}.{fmt}"
            assert path.is_file() and path.stat().st_size > 5000, path
        image = matplotlib.image.imread(out / f"{name}.png")
        assert image.shape[0] > 300 and image.shape[1] > 500
        assert image[..., :3].std() > 0.05          # not a blank canvas
    assert "skipped" not in result.stdout
    assert (out / "runs.csv").read_text().count("\n") == 6


def test_plot_command_rejects_a_missing_path(tmp_path):
    result = subprocess.run([sys.executable, "-m", "analysis.plot", str(tmp_path / "nope"),
                             "-o", str(tmp_path / "o")], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 2 and "no such file or directory" in result.stderr


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


@pytest.mark.parametrize("notebook", ["scaling_curves", "run_timeline"])
def test_notebook_runs_top_to_bottom(tiny_sweep, notebook, monkeypatch):
    path = ROOT / "analysis" / "notebooks" / f"{notebook}.ipynb"
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        "notebooks are committed without outputs"
    monkeypatch.setenv("MPIRL_SWEEP", str(tiny_sweep))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if "image/png" in o.get("data", {})]
    assert len(images) >= 2
