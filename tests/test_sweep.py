"""python -m mpirl.sweep: definitions checked up front, one run per point, resumable."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from conftest import TINY, TINY_SWEEP, run_sweep
from mpirl import sweep

ASYNC = "star-async-3r-s1-env_Delay_v0-env_arg_cost_s_0.001+episode_steps_20-straggler_1_2"
EXPECTED = ["native-sync-1r-s1", "butterfly-sync-1r-s1", "native-sync-2r-s1",
            "butterfly-sync-2r-s1", ASYNC]


def write(tmp_path, data) -> str:
    path = tmp_path / "def.yaml"
    path.write_text(yaml.safe_dump(data) if isinstance(data, dict) else data)
    return str(path)


@pytest.mark.parametrize("definition, message", [
    ({"name": "x", "grid": {"ranks": [1]}, "colour": 1}, "unknown key(s) colour"),
    ({"name": "bad name!", "grid": {"ranks": [1]}}, "name='bad name!'"),
    ({"name": "x"}, "grid must be a mapping"),
    ({"name": "x", "grid": {"ranks": [0]}}, "grid.ranks value 0"),
    ({"name": "x", "grid": {"topology": "tree"}}, "grid.topology must be a non-empty list"),
    ({"name": "x", "grid": {"ranks": [4], "topology": ["tree"], "mode": ["async"]}},
     "mode='async' runs a parameter server"),
    ({"name": "x", "grid": {"ranks": [2], "topology": ["hypercube"]}}, "topology='hypercube'"),
    ({"name": "x", "config": {"run_dir": "elsewhere"}, "grid": {"ranks": [1]}},
     "config.run_dir is set by the sweep"),
    ({"name": "x", "grid": {"ranks": [1]}, "slurm": {"launcher": "aprun"}},
     "slurm.launcher='aprun'"),
    ({"name": "x", "grid": {"ranks": [1]}, "timeout_s": -1}, "timeout_s=-1"),
    ("name: x\ngrid: {ranks: [1]\n", "not valid YAML"),
])
def test_bad_definitions_stop_before_anything_runs(tmp_path, capsys, definition, message):
    code = sweep.main([write(tmp_path, definition), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.startswith("mpirl.sweep: error:"), err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_grid_union_names_and_validation(tmp_path):
    s = sweep.load(write(tmp_path, TINY_SWEEP))
    assert [p.name for p in s.points] == EXPECTED
    assert [p.ranks for p in s.points] == [1, 1, 2, 2, 3]
    async_point = s.points[-1]
    assert async_point.config["straggler"] == ["1:2"] and async_point.config["mode"] == "async"
    assert async_point.config["env"] == "Delay-v0"
    assert all(p.config["total_steps"] == 1600 for p in s.points)


def test_local_sweep_runs_every_point_once_and_resumes(tiny_sweep, tmp_path):
    for name in EXPECTED:
        summary = json.loads((tiny_sweep / name / "summary.json").read_text())
        assert summary["env_steps"] >= 1600 - 16 * 3
        assert (tiny_sweep / name / "run.h5").is_file()
    assert json.loads((tiny_sweep / "sweep.json").read_text())["points"] == {
        "native-sync-1r-s1": 1, "butterfly-sync-1r-s1": 1, "native-sync-2r-s1": 2,
        "butterfly-sync-2r-s1": 2, ASYNC: 3}

    # a copy, so the session's tiny sweep stays intact for the analysis tests
    copy = tmp_path / "tiny"
    shutil.copytree(tiny_sweep, copy)
    again = run_sweep(TINY_SWEEP, tmp_path)
    assert again.returncode == 0 and "5 points, 5 done, 0 to run" in again.stdout, again.stdout

    # a run killed half-way: its directory has no summary.json
    (copy / "native-sync-2r-s1" / "summary.json").unlink()
    stamp = (copy / "butterfly-sync-2r-s1" / "summary.json").stat().st_mtime
    resumed = run_sweep(TINY_SWEEP, tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "4 done, 1 to run" in resumed.stdout and "[1/1] native-sync-2r-s1" in resumed.stdout
    assert (copy / "native-sync-2r-s1" / "summary.json").is_file()
    kept = list((copy / "incomplete").iterdir())
    assert len(kept) == 1 and kept[0].name.startswith("native-sync-2r-s1-")
    assert (kept[0] / "run.h5").is_file()          # nothing of the broken run is lost
    assert (copy / "butterfly-sync-2r-s1" / "summary.json").stat().st_mtime == stamp


def test_a_point_past_its_time_limit_is_killed_named_and_exit_1(tmp_path):
    definition = {"name": "slow", "config": {**TINY, "total_steps": 64},
                  "grid": {"ranks": [2], "topology": ["native"]}, "timeout_s": 0.5}
    dry = run_sweep(definition, tmp_path, "--dry-run")
    assert dry.returncode == 0 and "native-sync-2r-s1" in dry.stdout and "to run" in dry.stdout
    result = run_sweep(definition, tmp_path)      # torch alone takes longer than 0.5 s
    assert result.returncode == 1
    assert "FAILED (no result within 0.5 s" in result.stdout
    assert "1 point(s) failed: native-sync-2r-s1" in result.stderr
    assert not (tmp_path / "slow" / "native-sync-2r-s1" / "summary.json").exists()


def test_slurm_scripts_are_written_for_each_point_to_run(tiny_sweep, tmp_path):
    definition = {**TINY_SWEEP, "slurm": {"time": "00:05:00", "partition": "debug",
                                          "sbatch": ["--exclusive"]}}
    shutil.copytree(tiny_sweep, tmp_path / "tiny")
    (tmp_path / "tiny" / "butterfly-sync-2r-s1" / "summary.json").unlink()
    result = run_sweep(definition, tmp_path, "--launcher", "slurm")
    assert result.returncode == 0, result.stderr
    scripts = sorted((tmp_path / "tiny" / "slurm").glob("*.sbatch"))
    assert [s.name for s in scripts] == ["butterfly-sync-2r-s1.sbatch"]
    text = scripts[0].read_text()
    for line in ("#SBATCH --ntasks=2", "#SBATCH --time=00:05:00", "#SBATCH --partition=debug",
                 "#SBATCH --exclusive", "#SBATCH --nodes=1", '-n "$SLURM_NTASKS"',
                 "--run-name butterfly-sync-2r-s1"):
        assert line in text, line
    assert "sbatch " in result.stdout
