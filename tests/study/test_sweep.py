"""python -m mpirl.sweep: definitions checked up front, one run per point, resumable."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest
import yaml

from conftest import ROOT, TINY, TINY_ASYNC as ASYNC, TINY_SWEEP, run_sweep
from mpirl.study import sweep
from mpirun import start_mpi

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


@pytest.mark.parametrize("launcher", ["local", "slurm"])
@pytest.mark.parametrize("flag", [("--placement", "cyclic"), ("--ranks-per-node", "2")])
def test_cluster_flags_without_the_cluster_launcher_are_one_line(tmp_path, capsys, launcher,
                                                                  flag):
    code = sweep.main([write(tmp_path, {"name": "x", "grid": {"ranks": [2]}}), "--out",
                       str(tmp_path / "out"), "--launcher", launcher, *flag])
    err = capsys.readouterr().err
    assert code == 2 and err == (f"mpirl.sweep: error: {' '.join(flag)} with --launcher "
                                 f"{launcher}: only the cluster launcher places ranks (mpiexec "
                                 "here and Slurm place them themselves); allowed: --launcher "
                                 "cluster\n"), err
    assert not (tmp_path / "out").exists()


def test_a_cluster_that_is_not_up_stops_the_sweep_before_it_writes(tmp_path, capsys):
    code = sweep.main([write(tmp_path, {"name": "x", "grid": {"ranks": [2]}}), "--out",
                       str(tmp_path / "out"), "--launcher", "cluster", "--cluster-name",
                       "mpirlnone"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("mpirl.sweep: error: cluster 'mpirlnone' is not up")
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_resumed_points_link_bytes_add_up_over_its_attempts():
    """links.json after each attempt of a point on the emulated cluster: every attempt
    listed, their bytes summed per node (a node only one attempt used included), the cap
    named once, or "mixed"; a file from before ``attempts`` existed counts as one."""
    first = sweep.merge_links(None, "100mbit", {"node0": {"sent": 5, "received": 7}})
    assert first == {"rate": "100mbit", "nodes": {"node0": {"sent": 5, "received": 7}},
                     "attempts": [{"rate": "100mbit",
                                   "nodes": {"node0": {"sent": 5, "received": 7}}}]}
    second = sweep.merge_links(json.loads(json.dumps(first)), "100mbit",
                               {"node0": {"sent": 1, "received": 2},
                                "node1": {"sent": 3, "received": 4}})
    assert second["nodes"] == {"node0": {"sent": 6, "received": 9},
                               "node1": {"sent": 3, "received": 4}}
    assert second["rate"] == "100mbit" and len(second["attempts"]) == 2
    assert second["attempts"][0] == first["attempts"][0]
    third = sweep.merge_links(second, "1gbit", {"node1": {"sent": 10, "received": 0}})
    assert third["rate"] == "mixed" and third["nodes"]["node1"] == {"sent": 13, "received": 4}
    old = {"rate": "1gbit", "nodes": {"node0": {"sent": 8, "received": 8}}}
    merged = sweep.merge_links(old, "1gbit", {"node0": {"sent": 2, "received": 2}})
    assert merged["nodes"]["node0"] == {"sent": 10, "received": 10}
    assert [a["nodes"]["node0"]["sent"] for a in merged["attempts"]] == [8, 2]


def test_grid_union_names_and_validation(tmp_path):
    s = sweep.load(write(tmp_path, TINY_SWEEP))
    assert [p.name for p in s.points] == EXPECTED
    assert [p.ranks for p in s.points] == [1, 1, 2, 2, 3]
    async_point = s.points[-1]
    assert async_point.config["straggler"] == ["1:2"] and async_point.config["mode"] == "async"
    assert async_point.config["env"] == "Delay-v0"
    assert all(p.config["total_steps"] == 1600 for p in s.points)


def test_a_point_takes_its_designs_defaults_as_mpirl_run_does(tmp_path):
    """A field neither the sweep's config nor its grid sets starts from the design's own
    default (gorila's lr and pushes, sync-replay's updates and checkpoint interval), as
    ``mpirl.run --mode gorila`` does; a value the sweep sets wins."""
    s = sweep.load(write(tmp_path, {"name": "d", "config": {"total_steps": 1000},
                                    "grid": [{"ranks": [3], "mode": ["gorila", "sync-replay"]},
                                             {"ranks": [3], "mode": ["gorila"],
                                              "lr": [0.002]}]}))
    got = [(p.config["mode"], p.config["lr"], p.config["update_repeat"],
            p.config["checkpoint_every"]) for p in s.points]
    assert got == [("gorila", 5e-4, 2, 100), ("sync-replay", 1e-3, 8, 5000),
                   ("gorila", 0.002, 2, 100)]


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

    # a run killed half-way: its directory has no summary.json, and a checkpoint is missing,
    # so it cannot be resumed: it restarts, saying why in one line
    (copy / "native-sync-2r-s1" / "summary.json").unlink()
    (copy / "native-sync-2r-s1" / "checkpoints" / "rank0001.pt").unlink()
    stamp = (copy / "butterfly-sync-2r-s1" / "summary.json").stat().st_mtime
    resumed = run_sweep(TINY_SWEEP, tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "4 done, 1 to run (0 resuming" in resumed.stdout
    assert "[1/1] native-sync-2r-s1 ..." in resumed.stdout
    why = [line for line in resumed.stdout.splitlines() if "not resumed" in line]
    assert len(why) == 1 and why[0].startswith("sweep: native-sync-2r-s1: not resumed, cannot "
                                               "resume: ") and "no checkpoint for ranks [1]" \
        in why[0] and "restarting from scratch" in why[0], resumed.stdout
    assert "1 point(s) run, 0 of them resumed from checkpoints, 0 failed" in resumed.stdout
    assert (copy / "native-sync-2r-s1" / "summary.json").is_file()
    kept = list((copy / "incomplete").iterdir())
    assert len(kept) == 1 and kept[0].name.startswith("native-sync-2r-s1-")
    assert (kept[0] / "run.h5").is_file()          # nothing of the broken run is lost
    assert (copy / "butterfly-sync-2r-s1" / "summary.json").stat().st_mtime == stamp


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc): what the sweep launched."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue                               # the process ended meanwhile
        if ppid == pid:
            out.append(int(stat.parent.name))
    return out


def test_a_point_stopped_by_sigterm_is_resumed_by_the_next_sweep(tmp_path):
    """What Slurm's time limit does to a point (every process of the job gets SIGTERM),
    then the same sweep command again: the point continues from its checkpoint."""
    definition = {"name": "long", "config": {**TINY, "total_steps": 8000,
                                             "checkpoint_every": 1000},
                  "grid": {"ranks": [2], "topology": ["native"]}, "timeout_s": 120}
    (tmp_path / "long.yaml").write_text(yaml.safe_dump(definition))
    run_dir = tmp_path / "long" / "native-sync-2r-s1"
    job = start_mpi(2, [], command=[sys.executable, "-m", "mpirl.sweep",
                                    str(tmp_path / "long.yaml"), "--out", str(tmp_path)])
    launched = []                                  # the sweep's mpiexec, to kill on failure
    try:
        deadline = time.monotonic() + 90
        progress = run_dir / "progress.csv"
        while not (progress.is_file() and progress.read_text().count("\n") >= 3):
            assert time.monotonic() < deadline and job.poll() is None, "no progress in 90 s"
            time.sleep(0.2)
        launched = child_pids(job.pid)             # mpiexec, in a process group of its own
        (group,) = launched
        os.killpg(group, signal.SIGTERM)
        job.wait(60)
        launched = []                              # it ended before the sweep did
    finally:
        if job.poll() is None:
            launched += child_pids(job.pid)        # before the sweep dies and they are orphans
            job.kill()
            job.wait(30)
        for pid in launched:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    out = job.output
    assert job.returncode == 1 and "FAILED (exit 143" in out, out
    log = (tmp_path / "long" / "logs" / "native-sync-2r-s1.out").read_text()
    stopped_at = int(log.split("stopped by a signal after update ")[1].split(";")[0])
    assert 0 < stopped_at < 250

    dry = run_sweep(definition, tmp_path, "--dry-run")
    assert dry.returncode == 0 and "1 to run (1 resuming from checkpoints" in dry.stdout
    assert f"resume from update {stopped_at}" in dry.stdout, dry.stdout
    rerun_at = time.time()
    again = run_sweep(definition, tmp_path, timeout_s=180)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"native-sync-2r-s1 (resume from update {stopped_at}) ... done" in again.stdout
    assert "1 point(s) run, 1 of them resumed from checkpoints, 0 failed" in again.stdout
    assert not (tmp_path / "long" / "incomplete").exists()        # resumed in place

    log = (tmp_path / "long" / "logs" / "native-sync-2r-s1.out").read_text()
    assert log.index("stopped by a signal") < log.index(
        f"sweep: resume from update {stopped_at}: -m mpirl.run --resume ") < log.index("done:")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 8000 and summary["updates"] == 250
    for r in range(2):
        with h5py.File(run_dir / f"rank{r:04d}.h5", "r") as f:
            assert list(f["updates"]["update"]) == list(range(1, 251))  # none twice, none lost
            assert f.attrs["start_unix_s"] < rerun_at                   # the same log, continued
    rows = [int(line.split(",")[0]) for line in progress.read_text().splitlines()[1:]]
    assert rows == sorted(rows) and rows[-1] == 250 and min(rows) < stopped_at


def test_unusable_checkpoints_restart_saying_why(tiny_sweep, tmp_path):
    """The plan for every kind of unfinished run directory (no runs: --dry-run and the
    batch scripts' --prepare-point), on copies of real runs made unusable."""
    import torch

    copy = tmp_path / "tiny"
    shutil.copytree(tiny_sweep, copy)
    for name in EXPECTED:
        (copy / name / "summary.json").unlink()
    ckpt = {name: copy / name / "checkpoints" for name in EXPECTED}
    # butterfly-2r: rank 1's checkpoint cut short, as by a full disk
    data = (ckpt["butterfly-sync-2r-s1"] / "rank0001.pt").read_bytes()
    (ckpt["butterfly-sync-2r-s1"] / "rank0001.pt").write_bytes(data[:len(data) // 2])
    # native-1r: a checkpoint of the 2-rank run in its place
    shutil.copy(ckpt["native-sync-2r-s1"] / "rank0000.pt", ckpt["native-sync-1r-s1"])
    # butterfly-1r: the definition changed since the run started
    config = yaml.safe_load((copy / "butterfly-sync-1r-s1" / "config.yaml").read_text())
    (copy / "butterfly-sync-1r-s1" / "config.yaml").write_text(
        yaml.safe_dump({**config, "total_steps": 3200}))
    final_update = torch.load(ckpt["native-sync-2r-s1"] / "rank0000.pt")["update"]

    dry = run_sweep(TINY_SWEEP, tmp_path, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "0 done, 5 to run (1 resuming from checkpoints" in dry.stdout
    plan = {line.split()[0]: line.split("ranks", 1)[1].strip()
            for line in dry.stdout.splitlines()[1:]}
    assert plan["native-sync-2r-s1"] == f"resume from update {final_update}"
    assert plan["butterfly-sync-2r-s1"].startswith(
        "restart (cannot resume: rank0001.pt cannot be read (")
    assert plan["native-sync-1r-s1"] == ("restart (cannot resume: rank0000.pt was written by "
                                         "a run of 2 ranks, not 1)")
    assert plan["butterfly-sync-1r-s1"] == ("restart (cannot resume: its config.yaml differs "
                                            "from the point's (total_steps=3200 vs 1600))")
    assert plan[ASYNC] == "restart (no checkpoints to resume from)"
    assert not (copy / "incomplete").exists()        # a dry run moves nothing

    # what a batch script does as its job starts (with Slurm, test_slurm.py resumes)
    broken = subprocess.run([sys.executable, "-m", "mpirl.sweep", str(copy / "sweep.yaml"),
                             "--out", str(tmp_path), "--prepare-point", "butterfly-sync-2r-s1"],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True, timeout=60)
    assert broken.returncode == 0 and broken.stdout == "fresh\n", broken.stderr
    assert "butterfly-sync-2r-s1: not resumed, cannot resume: rank0001.pt cannot be read" \
        in broken.stderr and len(broken.stderr.strip().splitlines()) == 1
    assert not (copy / "butterfly-sync-2r-s1").exists()
    assert [p.name.rsplit("-", 2)[0] for p in (copy / "incomplete").iterdir()] == \
        ["butterfly-sync-2r-s1"]


def test_sync_checkpoints_of_different_updates_are_not_a_set(tiny_sweep, tmp_path):
    """A job killed while its ranks were writing leaves rank 0 a checkpoint ahead."""
    from mpirl.resilience import checkpoint

    run_dir = tmp_path / "run"
    shutil.copytree(tiny_sweep / "native-sync-2r-s1", run_dir)
    update = checkpoint.check_set(run_dir, 2, same_update=True)
    state = checkpoint.load(run_dir, 1)
    checkpoint.save(run_dir, 1, {**state, "update": update - 5})
    with pytest.raises(checkpoint.UnusableCheckpoints,
                       match=rf"different updates \(rank 0: update {update}, rank 1: "
                       rf"update {update - 5}\)"):
        checkpoint.check_set(run_dir, 2, same_update=True)
    assert checkpoint.check_set(run_dir, 2, same_update=False) == update
    # sync-replay's files record their rollout too: its warm-up rollouts all end at update 0
    for rank, rollouts in ((0, 150), (1, 180)):
        checkpoint.save(run_dir, rank, {**state, "update": 0, "rollouts": rollouts})
    with pytest.raises(checkpoint.UnusableCheckpoints, match=r"different updates \(rank 0: "
                       r"update 0 \(rollout 150\), rank 1: update 0 \(rollout 180\)\)"):
        checkpoint.check_set(run_dir, 2, same_update=True)


def test_checkpoints_an_async_run_cannot_use_restart_it_saying_so(tiny_sweep, tmp_path):
    """Sync checkpoint files in an async point's directory (async runs checkpoint in
    generations): the sweep restarts the point with mpirl.run's own reason."""
    shutil.copytree(tiny_sweep, tmp_path / "tiny")
    run_dir = tmp_path / "tiny" / ASYNC
    (run_dir / "summary.json").unlink()
    (run_dir / "checkpoints").mkdir()
    for r in range(3):
        shutil.copy(tiny_sweep / "native-sync-2r-s1" / "checkpoints" / "rank0000.pt",
                    run_dir / "checkpoints" / f"rank{r:04d}.pt")
    point = sweep.load(write(tmp_path, TINY_SWEEP)).points[-1]
    plan = sweep.plan_point(point, tmp_path / "tiny")
    assert plan.action == "restart", plan
    assert plan.why.startswith("cannot resume: ") and \
        "no checkpoint generation that all 3 ranks wrote" in plan.why, plan.why


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
    run_dir = tmp_path / "tiny" / "butterfly-sync-2r-s1"
    for line in ("#SBATCH --ntasks=2", "#SBATCH --time=00:05:00", "#SBATCH --partition=debug",
                 "#SBATCH --exclusive", "#SBATCH --nodes=1", '-n "$SLURM_NTASKS"',
                 "--run-name butterfly-sync-2r-s1", "# when written: resume from update ",
                 "--prepare-point butterfly-sync-2r-s1", f"resume) args=(--resume {run_dir})"):
        assert line in text, line
    assert "sbatch " in result.stdout
    assert "butterfly-sync-2r-s1: resume from update" in result.stdout
    assert "1 batch script(s) in" in result.stdout and "1 of them resuming" in result.stdout
