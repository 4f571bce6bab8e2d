"""What should travel?  Gradients (sync A2C, async A3C), unrolls (impala) or one
observation per env step (seed, ga3c), measured side by side in one run of this script.

    python experiments/bench_designs.py cartpole [--ranks 2 4 8]
    python experiments/bench_designs.py delay    [--ranks 8] [--cost-s 0.01]

``cartpole``: every design at every rank count, CartPole-v1 until the mean of every
experience rank's last-20-episode return reaches 450 (``--target-return``) or the
budget ends.  The table gives env steps/s, env steps and seconds to 450, mean and p95
policy lag (async: staleness) and bytes sent per env step (every rank's bytes, from the
logs' ``bytes_sent`` columns, over the run's env steps).  Each design runs with the
defaults documented for it (``experiments/cartpole_<mode>.yaml``; sync and async with
the global defaults).

``delay``: Delay-v0 with a *sleeping* step cost (``--cost-s``, default 10 ms): the env
dominates and ranks do not compete for the cores, so the question is what share of an
actor's time goes to stepping its envs (``env_s`` over its logged wall time, summed over
the actors: workers in sync/async, actors in impala/seed/ga3c).

Every run goes through ``mpiexec ... python -m mpirl.run`` as a user launches it, into
``--out`` (default runs/bench_designs); summary.json and the rank files are read back.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_modes import launch  # noqa: E402  (experiments/: this script's folder)

from mpirl.telemetry.schema import PHASES  # noqa: E402

DESIGNS = {   # name -> (min ranks, flags)
    "sync": (1, ["--mode", "sync", "--topology", "butterfly"]),
    "async": (2, ["--mode", "async", "--topology", "star"]),
    "impala": (2, ["--config", str(ROOT / "experiments" / "cartpole_impala.yaml")]),
    "seed": (2, ["--config", str(ROOT / "experiments" / "cartpole_seed.yaml")]),
    "ga3c": (3, ["--config", str(ROOT / "experiments" / "cartpole_ga3c.yaml")]),
}
EXPERIENCE_ROLES = ("worker", "actor")


def from_logs(run_dir: Path, nranks: int) -> dict:
    """Bytes sent by every rank, and the experience ranks' env and wall seconds."""
    sent, env_s, wall_s = 0, 0.0, 0.0
    for r in range(nranks):
        with h5py.File(run_dir / f"rank{r:04d}.h5", "r") as f:
            u = f["updates"][:]
            u = u[u["update"] != -1]
            sent += int(u["bytes_sent"].sum())
            if f.attrs["role"] in EXPERIENCE_ROLES:
                env_s += float(u["env_s"].sum())
                wall_s += float(sum(u[p].sum() for p in PHASES))
    return {"bytes": sent, "env_share": env_s / wall_s if wall_s else np.nan}


def lag(s: dict) -> tuple[float, float]:
    if s["mode"] in ("impala", "seed", "ga3c"):
        return s["mean_policy_lag"], s["p95_policy_lag"]
    if s["mode"] == "async":
        return s["mean_staleness"], np.nan
    return 0.0, 0.0


def cartpole(opts) -> None:
    rows = []
    for nranks in opts.ranks:
        for design, (least, flags) in DESIGNS.items():
            if nranks < least:
                continue
            name = f"cartpole-{design}-{nranks}r"
            s = launch(nranks, opts.out, name,
                       [*flags, "--target-return", str(opts.target), "--total-steps",
                        str(opts.max_steps), "--seed", str(opts.seed)],
                       opts.timeout)
            rows.append((nranks, design, s, from_logs(opts.out / name, nranks)))
    print(f"\nCartPole-v1 to mean return >= {opts.target:g} (budget {opts.max_steps} env steps),"
          f" seed {opts.seed}")
    print(f"{'ranks':>5} {'design':7} {'steps/s':>8} {'solved':>6} {'steps':>8} {'secs':>6} "
          f"{'lag':>5} {'p95':>4} {'B/step':>7} {'return':>7}")
    for nranks, design, s, logs in rows:
        mean, p95 = lag(s)
        print(f"{nranks:>5} {design:7} {s['env_steps'] / s['wall_s']:>8.0f} "
              f"{str(s['reached_target']):>6} {s['env_steps']:>8} {s['wall_s']:>6.1f} "
              f"{mean:>5.2f} {p95:>4.0f} {logs['bytes'] / s['env_steps']:>7.0f} "
              f"{s['final_mean_return']:>7.1f}")


def delay(opts) -> None:
    rows = []
    env = ["--env", "Delay-v0", "--env-arg", f"cost_s={opts.cost_s}", "--env-arg", "busy=sleep"]
    for nranks in opts.ranks:
        for design, (least, _flags) in DESIGNS.items():
            if nranks < least:
                continue
            name = f"delay-{design}-{nranks}r"
            mode = ["--mode", design] + (["--topology", "star"] if design == "async" else [])
            s = launch(nranks, opts.out, name,
                       [*mode, *env, "--total-steps", str(opts.steps), "--seed", str(opts.seed),
                        "--log-every", "1000"], opts.timeout)
            rows.append((nranks, design, s, from_logs(opts.out / name, nranks)))
    print(f"\nDelay-v0, sleeping step cost {1000 * opts.cost_s:g} ms, {opts.steps} env steps, "
          "4 envs per experience rank")
    print(f"{'ranks':>5} {'design':7} {'steps/s':>8} {'env share':>9} {'B/step':>7}")
    for nranks, design, s, logs in rows:
        print(f"{nranks:>5} {design:7} {s['env_steps'] / s['wall_s']:>8.0f} "
              f"{100 * logs['env_share']:>8.1f}% {logs['bytes'] / s['env_steps']:>7.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("cartpole", "delay"))
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--target", type=float, default=450.0)
    parser.add_argument("--max-steps", type=int, default=500_000)
    parser.add_argument("--steps", type=int, default=20_000, help="budget for 'delay'")
    parser.add_argument("--cost-s", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_designs")
    opts = parser.parse_args()
    {"cartpole": cartpole, "delay": delay}[opts.what](opts)


if __name__ == "__main__":
    main()
