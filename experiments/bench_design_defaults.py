"""Every design as a user first runs it (``--mode M`` and nothing else but the seed), on
CartPole-v1; a design with registry ``defaults`` of its own also beside the same run with
the shared defaults put back.

    python experiments/bench_design_defaults.py [--seeds 1 2 3 23] [--ranks 4]
                                                [--total-steps 500000] [--out DIR]
                                                [--modes sync impala ...]

Each run stops when every experience rank's last 20 episodes average 400
(``--target-return 400``) or at the budget.  Prints a markdown table: per mode, setting
and seed, whether it reached 400, the env steps it ran, its final mean return and its
wall time.  Runs one after another (each with a time cap).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpirl import registry  # noqa: E402
from mpirl.config import Config  # noqa: E402
from mpirl.launch import mpi_env, mpiexec_command  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 23])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--total-steps", type=int, default=500_000)
    parser.add_argument("--out", type=Path, default=Path("runs/design_defaults"))
    parser.add_argument("--timeout-s", type=float, default=1800)
    parser.add_argument("--modes", nargs="+", default=list(registry.MODES),
                        choices=registry.MODES, help="the designs to run (default: all)")
    args = parser.parse_args()
    shared = Config()
    rows = []
    for design in (registry.design(mode) for mode in args.modes):
        own = " ".join(f"{name}={value}" for name, value in design.defaults)
        back = [a for name, _ in design.defaults
                for a in (f"--{name.replace('_', '-')}", str(getattr(shared, name)))]
        theirs = " ".join(f"{name}={getattr(shared, name)}" for name, _ in design.defaults)
        settings = [(f"{own} (its defaults)", []), (f"{theirs} (shared)", back)] \
            if design.defaults else [("the shared defaults (it has none of its own)", [])]
        for label, extra in settings:
            for seed in args.seeds:
                run = f"{design.name}-{'own' if not extra else 'shared'}-s{seed}"
                argv = ["-m", "mpirl.run", "--mode", design.name, "--seed", str(seed),
                        "--total-steps", str(args.total_steps), "--target-return", "400",
                        "--run-dir", str(args.out), "--run-name",
                        f"{run}-{time.strftime('%H%M%S')}", *extra]
                started = time.time()
                done = subprocess.run(mpiexec_command(args.ranks, [sys.executable, *argv]),
                                      cwd=ROOT, env=mpi_env(), capture_output=True,
                                      text=True, timeout=args.timeout_s)
                wall = time.time() - started
                summary_line = next((ln for ln in done.stdout.splitlines()
                                     if ln.startswith("run files: ")), "")
                run_dir = Path(summary_line.split()[2]) if summary_line else None
                summary = json.loads((run_dir / "summary.json").read_text()) \
                    if run_dir and (run_dir / "summary.json").is_file() else {}
                rows.append((design.name, label, seed, done.returncode,
                             summary.get("reached_target"), summary.get("env_steps"),
                             summary.get("final_mean_return"), wall))
                print(rows[-1], flush=True)
    print("\n| mode | setting | seed | exit | reached 400 | env steps | final mean | wall (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, label, seed, code, reached, steps, final, wall in rows:
        cells = ("-", "-", "-") if steps is None else (
            "yes" if reached else "no", f"{steps:,}", f"{final:.1f}")
        print(f"| {mode} | {label} | {seed} | {code} | {' | '.join(cells)} | {wall:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
