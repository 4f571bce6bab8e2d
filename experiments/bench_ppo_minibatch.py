"""What DD-PPO's minibatches cost: env steps/s of PPO with 32 minibatches (every
minibatch's gradient through the topology) against the full-batch PPO mpirl had before
(one exchange per pass), side by side.

    python experiments/bench_ppo_minibatch.py [--env Hopper-v5] [--steps 40960]
                                              [--rounds 3] [--ranks 2]

Both are ``experiments/hopper_ppo.yaml`` (10 passes over each 1024-step rollout per rank)
at ``--ranks`` ranks; the full batch is ``--minibatches 1`` (10 exchanges per rollout),
DD-PPO is ``--minibatches 32`` (320).  The two alternate, ``--rounds`` times, so that the
machine's load falls on both alike; the table gives env steps/s, the exchange's share of
the busy time and the time per exchange, each round's ratio, and their mean.  The table
goes to docs/figures/mujoco/minibatch.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpirl.launch import mpi_env, mpiexec_command  # noqa: E402

VARIANTS = {"full batch": 1, "32 minibatches": 32}
OUT = ROOT / "docs" / "figures" / "mujoco" / "minibatch.md"


def run(env: str, minibatches: int, steps: int, ranks: int, into: Path, name: str) -> dict:
    argv = ["--config", str(ROOT / "experiments" / "hopper_ppo.yaml"), "--env", env,
            "--minibatches", str(minibatches), "--total-steps", str(steps),
            "--log-every", "1000", "--run-dir", str(into), "--run-name", name]
    cmd = mpiexec_command(ranks, [sys.executable, "-m", "mpirl.run", *argv])
    subprocess.run(cmd, cwd=ROOT, env=mpi_env(), check=True, timeout=1800,
                   stdout=subprocess.DEVNULL)
    s = json.loads((into / name / "summary.json").read_text().replace("NaN", "null"))
    return {"steps_per_s": s["env_steps"] / s["wall_s"], "comm": s["comm_share"],
            "updates": s["updates"],
            "exchange_ms": 1e3 * s["phase_s"]["exchange_s"] / max(s["updates"], 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Hopper-v5")
    parser.add_argument("--steps", type=int, default=40960)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    rows: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="mpirl-minibatch-") as tmp:
        for r in range(args.rounds):
            for label, m in VARIANTS.items():
                rows[label].append(run(args.env, m, args.steps, args.ranks, Path(tmp),
                                       f"{m}-{r}"))
                print(f"round {r + 1} {label}: {json.dumps(rows[label][-1])}", flush=True)
    text = table(rows, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


def table(rows: dict[str, list[dict]], args) -> str:
    base, dd = rows["full batch"], rows["32 minibatches"]
    ratios = [d["steps_per_s"] / b["steps_per_s"] for b, d in zip(base, dd, strict=True)]
    lines = [f"PPO on {args.env}, sync over butterfly at {args.ranks} ranks, "
             f"experiments/hopper_ppo.yaml, {args.steps:,} env steps per run, the two "
             f"variants alternating {args.rounds} times.", "",
             "| variant | exchanges per rollout | env steps/s (per round) | mean | "
             "communication share | ms per exchange |", "|---|---|---|---|---|---|"]
    for label, m in VARIANTS.items():
        rs = rows[label]
        speeds = [r["steps_per_s"] for r in rs]
        lines.append(f"| {label} | {10 * m} | {', '.join(f'{s:.0f}' for s in speeds)} | "
                     f"{np.mean(speeds):.0f} | {100 * np.mean([r['comm'] for r in rs]):.1f}% | "
                     f"{np.mean([r['exchange_ms'] for r in rs]):.3f} |")
    lines += ["", f"32 minibatches / full batch, env steps/s per round: "
              f"{', '.join(f'{x:.2f}' for x in ratios)}; mean {np.mean(ratios):.2f}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
