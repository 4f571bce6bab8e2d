import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# Tests import the project from the checkout, installed or not.
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: the random sizes of this session (topologies, fuzzing, soak); MPIRL_TEST_SEED replays one
SEED = int(os.environ.get("MPIRL_TEST_SEED", random.randrange(2**31)))

#: the smallest batch of an ``mpirl.run``: 2 envs x 8 steps, 16 env steps per rank and update
BATCH = ["--num-envs", "2", "--rollout-steps", "8"]

#: a short run: 4000 env steps in BATCHes (83 updates at 3 ranks), ended early by faults
SHORT = ["--total-steps", "4000", *BATCH]

#: the designs' small runs (sync, async, quorum): BATCH, a progress line every 5 updates
SMALL = [*BATCH, "--log-every", "5"]

#: the book's five tricks and PPO's clipped objective, on 3000 env steps (sync and async)
TRICKS = ["--reward-scale", "--activation", "elu", "--layer-norm", "--action-repeat", "3",
          "--update-repeat", "3", "--clip-ratio", "0.2", "--total-steps", "3000"]

#: run settings small enough that a run is dominated by start-up (torch import)
TINY = {"env": "CartPole-v1", "num_envs": 2, "rollout_steps": 8, "log_every": 5,
        "log_flush_every": 7}

#: a sweep with every kind of run the analysis draws: sync at 1 and 2 ranks over two
#: topologies, and async with a straggler at 3 ranks (staleness, measured waits) on
#: Delay-v0 (simulator step times)
TINY_SWEEP = {
    "name": "tiny",
    "config": {**TINY, "total_steps": 1600},
    "grid": [{"ranks": [1, 2], "topology": ["native", "butterfly"], "mode": ["sync"]},
             {"ranks": [3], "topology": ["star"], "mode": ["async"], "straggler": [["1:2"]],
              "env": ["Delay-v0"], "env_arg": [["cost_s=0.001", "episode_steps=20"]]}],
    "timeout_s": 180,
}

#: the names of the tiny sweep's sync point at 2 ranks and of its async point (run directories)
TINY_SYNC_2R = "butterfly-sync-2r-s1"
TINY_ASYNC = "star-async-3r-s1-env_Delay_v0-env_arg_cost_s_0.001+episode_steps_20-straggler_1_2"


def require(why_not: str | None) -> None:
    """Skip a test whose outside tool is missing (saying why); under CI (MPIRL_CI=1, set by
    .ci/run, which installs the tools) fail instead, so a missing tool is never a pass."""
    if why_not is None:
        return
    if os.environ.get("MPIRL_CI") == "1":
        pytest.fail(f"MPIRL_CI=1 but {why_not}")
    pytest.skip(why_not)


def run_sweep(definition: dict, out: Path, *args: str, timeout_s: float = 600):
    """``python -m mpirl.sweep`` on ``definition`` (written to out/NAME.yaml), as users run it."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{definition['name']}.yaml"
    path.write_text(yaml.safe_dump(definition))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "mpirl.sweep", str(path), "--out", str(out),
                           *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout_s)


def train(tmp_path: Path, nranks: int, *args: str, name: str = "r", timeout_s: float = 180,
          env: dict | None = None):
    """``mpirl.run`` with SMALL and ``args`` under mpiexec into tmp_path/name (``env``:
    variables to set), which must succeed; returns the ended job and the run's summary."""
    from mpirun import run_mpi

    result = run_mpi(nranks, ["-m", "mpirl.run", *run_args(tmp_path, name, args)],
                     timeout_s=timeout_s, env=env)
    return result, json.loads((tmp_path / name / "summary.json").read_text())


def run_args(tmp_path: Path, name: str, args) -> list[str]:
    """``mpirl.run``'s arguments for a test's run ``name``: SMALL, ``args``, its place."""
    return [*SMALL, *args, "--run-dir", str(tmp_path), "--run-name", name]


def launch_runs(nranks: int, argvs: list[list[str]], timeout_s: float = 300,
                env: dict | None = None):
    """Several ``mpirl.run`` runs (each its full argument list) one after another in one
    mpiexec launch, in the same processes (tests/mpi/runs.py: a launch costs a torch
    import per rank); returns the finished job."""
    from mpirun import run_mpi

    return run_mpi(nranks, ["tests/mpi/runs.py", json.dumps(argvs)], timeout_s=timeout_s,
                   env=env)


def train_many(tmp_path: Path, nranks: int, runs: dict[str, list[str]],
               timeout_s: float = 300, env: dict | None = None) -> dict[str, dict]:
    """Like :func:`train`, for several runs (name -> args) in one launch
    (:func:`launch_runs`); returns each run's summary."""
    launch_runs(nranks, [run_args(tmp_path, name, args) for name, args in runs.items()],
                timeout_s, env)
    return {name: json.loads((tmp_path / name / "summary.json").read_text()) for name in runs}


def assert_rows_tile_time(run_dir: Path) -> None:
    """Every rank's update rows hold only their own time (``RunLogger.record``: rows tile
    a rank's time): a row's start plus the seconds it holds (phases and other) comes no
    later than the next row's start.  A row holding time from before its start (a first
    wait for parameters, timed before the log's clock started) would overlap the next
    one, and a trace viewer (Perfetto) drops such a span."""
    from mpirl.telemetry.read import load_run

    for rank, rows in load_run(run_dir).updates.groupby("rank"):
        start = rows["t_unix_s"].to_numpy()
        ends = start[:-1] + rows["busy_s"].to_numpy()[:-1]
        over = ends - start[1:]
        assert (over <= 1e-6).all(), \
            f"rank {rank}: row {int(over.argmax())} ends {over.max() * 1e3:.3f} ms into the next"


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory) -> Path:
    """The tiny sweep, run once per test session; returns its directory."""
    out = tmp_path_factory.mktemp("sweeps")
    result = run_sweep(TINY_SWEEP, out)
    assert result.returncode == 0, result.stdout + result.stderr
    return out / "tiny"


@pytest.fixture(scope="session")
def bench_file(tmp_path_factory) -> Path:
    """A small ``mpirl.bench --out`` result at 2 ranks."""
    from mpirun import run_mpi

    path = tmp_path_factory.mktemp("bench") / "allreduce-2r.h5"
    run_mpi(2, ["-m", "mpirl.bench", "--sizes", "4", "1K", "64K", "--iters", "20",
                "--rounds", "1", "--out", str(path)], timeout_s=120)
    return path


def kill_an_actor(tmp_path: Path, mode: str, nranks: int, *extra: str) -> None:
    """SIGKILL the last rank, an actor, of a running ``mode`` job once it has logged 5
    rows: the job must end within 15 s, the sentinel naming that rank and its pid."""
    import signal
    import time

    from mpirl.resilience.sentinel import read_status, status_dir
    from mpirun import start_mpi

    victim, run_dir = nranks - 1, tmp_path / "k"
    args = ["-m", "mpirl.run", "--mode", mode, "--env", "Delay-v0", "--env-arg",
            "cost_s=0.002", *BATCH, "--total-steps", "10000000", "--run-dir", str(tmp_path),
            "--run-name", "k", *extra]
    with start_mpi(nranks, args) as job:
        status = job.reached(run_dir, victim, 5)
        os.kill(read_status(status_dir(run_dir) / f"rank{victim:04d}")["pid"], signal.SIGKILL)
        killed = time.monotonic()
        job.wait(60, what="the job did not end within 60 s of an actor's SIGKILL")
    took = time.monotonic() - killed
    assert job.returncode != 0 and took < 15, (took, job.tail())
    line = next(s for s in job.output.splitlines() if "died without a word" in s)
    assert line.startswith(f"mpirl: rank {victim} (pid {status['pid']} on "), line


#: seconds spent per test file (setup, call and teardown), for the summary below
_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """The suite's time by test file, slowest first: where the suite's budget goes."""
    if not _FILE_SECONDS:
        return
    total = sum(_FILE_SECONDS.values())
    terminalreporter.write_sep("=", f"time by test file ({total:.0f} s in tests)")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:15]:
        terminalreporter.write_line(f"{seconds:8.1f} s {100 * seconds / total:5.1f}%  {path}")
