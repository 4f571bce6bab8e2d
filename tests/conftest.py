import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# Tests import the project from the checkout, installed or not.
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

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
