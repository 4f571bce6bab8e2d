"""Analysis never mixes runs: a real sweep of deliberately mixed runs (two envs, two
learning rates, two seeds of one experiment, two rank counts and no 1-rank run) is
grouped by everything that differs, labelled by what differs, and compared field by
field by ``python -m analysis.compare``."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis import figures  # noqa: E402
from analysis.load import group_labels, load_sweep, scaling  # noqa: E402
from conftest import ROOT, TINY, run_sweep  # noqa: E402

DELAY = {"env": ["Delay-v0"], "env_arg": [["cost_s=0.001", "episode_steps=20"]]}
MIXED = {
    "name": "mixed",
    "config": {**TINY, "total_steps": 1600, "topology": "butterfly", "mode": "sync"},
    "grid": [{"ranks": [2], "seed": [1, 2]},            # one experiment, two seeds
             {"ranks": [3], "seed": [1]},               # the same at 3 ranks
             {"ranks": [2], "lr": [0.003], "seed": [1]},
             {"ranks": [2], "seed": [1], **DELAY}],
    "timeout_s": 180,
}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    out = tmp_path_factory.mktemp("mixed")
    result = run_sweep(MIXED, out)
    assert result.returncode == 0, result.stdout + result.stderr
    sweep = load_sweep(out / "mixed")
    lr = {name: sweep.by_name[name].config["lr"] for name in sweep.runs["run"]}
    runs = sweep.runs.assign(lr=sweep.runs["run"].map(lr))
    cart = (runs["env"] == "CartPole-v1") & (runs["lr"] == 1e-3)
    named = {"base2": runs[cart & (runs["ranks"] == 2)], "base3": runs[cart & (runs["ranks"] == 3)],
             "lr": runs[runs["lr"] == 0.003], "delay": runs[runs["env"] == "Delay-v0"]}
    return sweep, named


def test_runs_are_grouped_by_everything_but_the_seed(mixed):
    sweep, named = mixed
    assert len(sweep.runs) == 5 and sweep.runs["finished"].all()
    assert sweep.runs["group"].nunique() == 3
    base = named["base2"]
    assert len(base) == 2 and base["group"].nunique() == 1        # two seeds, one group
    assert named["base3"]["group"].iloc[0] == base["group"].iloc[0]   # ranks: the axis
    assert named["lr"]["group"].iloc[0] != base["group"].iloc[0]
    assert named["delay"]["group"].iloc[0] not in {base["group"].iloc[0],
                                                   named["lr"]["group"].iloc[0]}
    table = scaling(sweep.runs)
    assert len(table) == 4                     # 3 groups; one of them at 2 and 3 ranks
    at2 = table[(table["group"] == base["group"].iloc[0]) & (table["ranks"] == 2)].iloc[0]
    assert at2["seeds"] == 2
    assert at2["env_steps_per_s"] == pytest.approx(base["env_steps_per_s"].mean())
    for _, rows in table.groupby("group"):     # no row mixes envs
        assert rows["env"].nunique() == 1


def test_labels_name_the_fields_that_differ(mixed):
    sweep, named = mixed
    label = {k: v["group_label"].iloc[0] for k, v in named.items()}
    assert label["base2"] == label["base3"]
    assert label["base2"].startswith("butterfly/sync, env=CartPole-v1")
    assert "lr=0.001" in label["base2"] and "lr=0.003" in label["lr"]
    assert label["delay"].startswith("butterfly/sync, env=Delay-v0")
    assert "lr=" not in label["delay"]         # no other group of its design and task
    assert len(set(label.values())) == 3
    # a field every group shares is never named
    assert "num_envs" not in " ".join(label.values())
    assert group_labels({"a": ("star/async", {"lr": 1.0, "seed": 1}),
                         "b": ("star/async", {"lr": 1.0, "seed": 2})}) == \
        {"a": "star/async", "b": "star/async"}


def test_efficiency_says_its_measured_base(mixed):
    sweep, named = mixed
    runs = sweep.runs
    assert set(runs["efficiency_base"]) == {"own 2 ranks"}     # no 1-rank run was made
    base = named["base2"]["env_steps_per_s"].mean() / 2
    three = named["base3"].iloc[0]
    assert three["efficiency"] == pytest.approx(three["env_steps_per_s"] / 3 / base)
    fig = figures.scaling_figure(runs)
    throughput, _, efficiency = fig.axes[:3]
    labels = throughput.get_legend_handles_labels()[1]
    assert sorted(labels) == sorted({*runs["group_label"],
                                     "ideal: linear from the measured base"})
    assert "own 2 ranks" in efficiency.get_title()
    plt.close(fig)


def test_learning_curves_of_two_envs_never_share_an_axis(mixed):
    sweep, _ = mixed
    fig = figures.learning_figure(list(sweep.by_name.values()))
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["CartPole-v1: vs experience", "CartPole-v1: vs time",
                      "Delay-v0: vs experience", "Delay-v0: vs time"]
    assert len(fig.axes[2].get_lines()) == 1 and len(fig.axes[0].get_lines()) == 4
    plt.close(fig)


def test_an_env_whose_runs_finished_no_episode_says_so(mixed):
    sweep, named = mixed
    delay = sweep.by_name[named["delay"]["run"].iloc[0]]
    short = dataclasses.replace(delay, episodes=delay.episodes.iloc[:0])
    others = [r for r in sweep.by_name.values() if r is not delay]
    fig = figures.learning_figure([*others, short])
    empty = fig.axes[2:]
    assert [len(ax.get_lines()) for ax in empty] == [0, 0]
    assert [[t.get_text() for t in ax.texts] for ax in empty] == [["no episode finished"]] * 2
    assert all(ax.get_legend() is None and not len(ax.get_xticks()) for ax in empty)
    assert fig.axes[1].get_legend() is not None
    plt.close(fig)


def _compare(*paths) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analysis.compare", *map(str, paths)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_compare_prints_every_difference_of_two_runs(mixed, tmp_path):
    sweep, named = mixed
    path = {k: sweep.by_name[v["run"].iloc[0]].path for k, v in named.items()}
    result = _compare(path["base2"], path["lr"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "configuration: 1 field differs" in lines
    assert any(line.split() == ["lr", "0.001", "->", "0.003"] for line in lines)
    steps = next(line for line in lines if line.strip().startswith("env steps/s"))
    assert len(steps.split()) == 5             # name (2 words), A, B, B/A
    seeds = [sweep.by_name[n].path for n in named["base2"]["run"]]
    result = _compare(*seeds)
    assert "configuration: 1 field differs" in result.stdout and " seed " in result.stdout
    result = _compare(path["base2"], path["base3"])
    assert any(line.split() == ["ranks", "2", "->", "3"] for line in result.stdout.splitlines())
    result = _compare(path["base2"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == f"analysis.compare: error: {tmp_path}: not a run " \
                                    "directory (no run.h5)"
