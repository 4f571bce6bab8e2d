"""What Learning to Run costs here, and what a bounded budget of training does with it.

    python experiments/bench_l2run.py [--budget-s 240] [--steps 1500]

1. Raw simulator: one process, one L2Run-v0 env, uniform random excitations, ``--steps``
   steps (resetting at each fall): steps/s and the step-time distribution (median, p90,
   p99, max) -- OpenSim's integrator takes more sub-steps when contacts are stiff, so
   the tail is long.
2. Training at 1 and 2 ranks with experiments/l2run_a2c.yaml (sync, butterfly, the
   book's five tricks), each for about ``--budget-s`` seconds of env steps, launched as
   users launch it (``mpiexec ... python -m mpirl.run``): env steps/s per rank and in
   total, the mean return of the first and last 20 episodes, and the step-time
   distribution read back from the runs' HDF5 logs (``sim_steps``: one row per action,
   i.e. 3 simulator steps with action repeat 3).

It will not learn to run in minutes on two cores; the table shows what it does.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis import load_run  # noqa: E402
from mpirl.launch import mpi_env, mpiexec_command  # noqa: E402


def quantiles(times: np.ndarray) -> str:
    q = np.quantile(times, [0.5, 0.9, 0.99]) * 1e3
    return (f"median {q[0]:.1f} ms, p90 {q[1]:.1f} ms, p99 {q[2]:.1f} ms, "
            f"max {times.max() * 1e3:.1f} ms (n={len(times)})")


def raw_steps(n: int) -> np.ndarray:
    import gymnasium

    import mpirl.parts.envs  # noqa: F401
    env = gymnasium.make("L2Run-v0").unwrapped
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    times = []
    for _ in range(n):
        _, _, terminated, truncated, info = env.step(rng.random(18))
        times.append(info["sim_s"])
        if terminated or truncated:
            env.reset()
    return np.asarray(times)


def train(ranks: int, steps: int, out: Path) -> dict:
    name = f"l2run-{ranks}r"
    cmd = mpiexec_command(ranks, [sys.executable, "-m", "mpirl.run", "--config",
                                  str(ROOT / "experiments" / "l2run_a2c.yaml"),
                                  "--total-steps", str(steps), "--run-dir", str(out),
                                  "--run-name", name])
    subprocess.run(cmd, cwd=ROOT, env=mpi_env({"PYTHONPATH": str(ROOT)}), check=True,
                   stdout=subprocess.DEVNULL, timeout=7200)
    run = load_run(out / name)
    s = run.summary
    eps = run.episodes["return"].to_numpy()
    k = min(20, len(eps) // 2)
    times = run.sim_steps["sim_s"].to_numpy()
    return {"ranks": ranks, "env_steps": s["env_steps"], "wall_s": s["wall_s"],
            "steps_per_s": s["env_steps"] / s["wall_s"],
            "per_rank": s["env_steps"] / s["wall_s"] / ranks, "episodes": len(eps),
            "first": float(np.mean(eps[:k])) if k else float("nan"),
            "last": float(np.mean(eps[-k:])) if k else float("nan"),
            "comm": s["comm_share"], "times": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1500, help="raw simulator steps")
    parser.add_argument("--budget-s", type=float, default=240,
                        help="approximate seconds of training per rank count")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_l2run")
    opts = parser.parse_args()

    t0 = time.perf_counter()
    times = raw_steps(opts.steps)
    rate = len(times) / (time.perf_counter() - t0)
    print(f"raw L2Run-v0, 1 process: {rate:.0f} steps/s wall ({len(times) / times.sum():.0f} "
          f"in the simulator); step time {quantiles(times)}", flush=True)
    rows = []
    for ranks in (1, 2):
        budget = int(opts.budget_s * rate * ranks * 0.8) // 192 * 192 or 192
        rows.append(train(ranks, budget, opts.out))
        shown = {k: v for k, v in rows[-1].items() if k != "times"}
        print(f"trained {ranks} rank(s): {json.dumps(shown)}", flush=True)
    print("\nL2Run-v0 training, experiments/l2run_a2c.yaml (sync, butterfly, five tricks)")
    print(f"{'ranks':>5} {'env steps':>9} {'wall s':>7} {'steps/s':>8} {'per rank':>8} "
          f"{'episodes':>8} {'first-20 ret':>12} {'last-20 ret':>11} {'comm %':>6}")
    for r in rows:
        print(f"{r['ranks']:>5} {r['env_steps']:>9} {r['wall_s']:>7.0f} "
              f"{r['steps_per_s']:>8.1f} {r['per_rank']:>8.1f} {r['episodes']:>8} "
              f"{r['first']:>12.3f} {r['last']:>11.3f} {100 * r['comm']:>6.1f}")
    for r in rows:
        print(f"{r['ranks']} rank(s), per action (3 simulator steps): {quantiles(r['times'])}")


if __name__ == "__main__":
    main()
