"""``python -m analysis.what_travels``: the study's figures and results table, from a
real sweep (the tiny sweep: sync at 1 and 2 ranks, async with a straggler on Delay-v0)."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd

from conftest import ROOT
from analysis.load import load_sweep
from analysis.what_travels import results_table


def test_the_table_has_one_row_per_env_design_and_rank_count(tiny_sweep):
    table = results_table(load_sweep(tiny_sweep).runs)
    keys = set(zip(table["env"], table["design"], table["ranks"], strict=True))
    assert ("CartPole-v1", "butterfly/sync", 2) in keys and ("Delay-v0", "star/async", 3) in keys
    assert len(keys) == len(table)
    assert (table["steps_per_s"] > 0).all()
    assert (table[table["ranks"] > 1]["bytes_per_step"] > 0).all()   # 1 rank sends nothing
    assert (table[table["ranks"] == 1]["bytes_per_step"] == 0).all()
    async_row = table[table["design"] == "star/async"].iloc[0]
    assert not pd.isna(async_row["lag"])            # the async run's mean staleness


def test_the_command_writes_every_figure_and_the_table(tiny_sweep, tmp_path):
    out = tmp_path / "wt"
    result = subprocess.run([sys.executable, "-m", "analysis.what_travels", str(tiny_sweep),
                             "-o", str(out)], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    made = {p.name for p in out.iterdir()}
    assert {"cartpole-scaling.png", "cartpole-bytes.png", "cartpole-roles.png",
            "delay-lag.png", "results.md"} <= made, made
    assert "| 2 | butterfly/sync |" in (out / "results.md").read_text()


def test_a_missing_directory_is_one_line_and_exit_2(tmp_path):
    result = subprocess.run([sys.executable, "-m", "analysis.what_travels",
                             str(tmp_path / "nope"), "-o", str(tmp_path / "o")], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "no such directory" in result.stderr
