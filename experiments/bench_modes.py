"""Head-to-head benchmarks of the training designs (a script, not a test).

    python experiments/bench_modes.py solve      [--ranks 4] [--designs sync:butterfly ...]
    python experiments/bench_modes.py straggler  [--ranks 4] [--factor 3]

``solve``: trains CartPole-v1 until the mean over ranks of each rank's last-20-episode
return reaches 475 (``--target-return``), once per design, and prints env steps and
wall-clock to get there, side by side.

``straggler``: the seed's picture, measured.  Each mode runs the same budget twice,
without and with one rank slowed down by ``--factor`` (it idles factor-1 times as
long as its rollout took), and the table gives env steps/s and the slowdown ratio.
Sync ranks wait for the slowest every update; async ranks do not.

Every run goes through ``mpiexec ... python -m mpirl.run`` exactly as a user launches
it, into ``--out`` (default runs/bench_modes), and its summary.json is read back.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpirl.launch import mpi_env, mpiexec_command  # noqa: E402

DEFAULT_DESIGNS = ["sync:native", "sync:star", "sync:tree", "sync:butterfly", "sync:ring",
                   "async:star", "quorum:star"]


def launch(nranks: int, out: Path, name: str, args: list[str], timeout_s: float) -> dict:
    cmd = mpiexec_command(nranks, [sys.executable, "-m", "mpirl.run", *args,
                                   "--run-dir", str(out), "--run-name", name])
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, cwd=ROOT, env=mpi_env({"PYTHONPATH": str(ROOT)}), check=True,
                   timeout=timeout_s, stdout=subprocess.DEVNULL)
    return json.loads((out / name / "summary.json").read_text())


def solve(opts) -> None:
    rows = []
    for design in opts.designs:
        mode, topo = design.split(":")
        s = launch(opts.ranks, opts.out, f"solve-{mode}-{topo}-{opts.ranks}r",
                   ["--mode", mode, "--topology", topo, "--target-return", str(opts.target),
                    "--total-steps", str(opts.max_steps), "--seed", str(opts.seed)],
                   opts.timeout)
        rows.append((mode, topo, s))
    print(f"\nCartPole-v1 to mean return >= {opts.target} (last 20 episodes per rank), "
          f"{opts.ranks} ranks, seed {opts.seed}")
    print(f"{'mode':8} {'topology':10} {'solved':>6} {'env steps':>10} {'wall s':>8} "
          f"{'steps/s':>8} {'updates':>8} {'comm %':>7} {'staleness':>9}")
    for mode, topo, s in rows:
        print(f"{mode:8} {topo:10} {str(s['reached_target']):>6} {s['env_steps']:>10} "
              f"{s['wall_s']:>8.1f} {s['env_steps'] / s['wall_s']:>8.0f} {s['updates']:>8} "
              f"{100 * s['comm_share']:>7.1f} {s['mean_staleness']:>9.2f}")


def straggler(opts) -> None:
    rows = []
    for mode in ("sync", "async"):
        topo = "butterfly" if mode == "sync" else "star"
        rate = {}
        for slow in (False, True):
            extra = ["--straggler", f"{opts.ranks - 1}:{opts.factor}"] if slow else []
            s = launch(opts.ranks, opts.out, f"straggle-{mode}-{int(slow)}-{opts.ranks}r",
                       ["--mode", mode, "--topology", topo, "--total-steps", str(opts.steps),
                        "--seed", str(opts.seed), *extra], opts.timeout)
            rate[slow] = s["env_steps"] / s["wall_s"]
        rows.append((mode, topo, rate[False], rate[True]))
    print(f"\nOne straggler (rank {opts.ranks - 1}, factor {opts.factor}), {opts.ranks} ranks, "
          f"{opts.steps} env steps")
    print(f"{'mode':6} {'topology':10} {'steps/s':>9} {'w/ straggler':>13} {'kept':>6}")
    for mode, topo, fast, slow in rows:
        print(f"{mode:6} {topo:10} {fast:>9.0f} {slow:>13.0f} {slow / fast:>6.2f}")
    sync_kept, async_kept = rows[0][3] / rows[0][2], rows[1][3] / rows[1][2]
    print(f"async keeps {async_kept / sync_kept:.2f}x the share of its throughput that sync "
          f"keeps; with the straggler async runs at {rows[1][3] / rows[0][3]:.2f}x sync's "
          "steps/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("solve", "straggler"))
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--designs", nargs="+", default=DEFAULT_DESIGNS,
                        help="MODE:TOPOLOGY pairs for 'solve'")
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--max-steps", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=60_000, help="budget for 'straggler'")
    parser.add_argument("--factor", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_modes")
    opts = parser.parse_args()
    {"solve": solve, "straggler": straggler}[opts.what](opts)


if __name__ == "__main__":
    main()
