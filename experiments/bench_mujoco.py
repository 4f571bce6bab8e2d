"""PPO on MuJoCo against its reference: CleanRL's ppo_continuous_action at 1M env steps.

    python experiments/bench_mujoco.py [--envs Hopper-v5 ...] [--seeds 1 2 3]
                                       [--steps 1000000] [--ranks 2] [--runs DIR]

Each (env, seed) is one run of ``experiments/hopper_ppo.yaml`` with ``--env`` and
``--seed`` changed, launched as users launch it (``mpiexec -n RANKS python -m
mpirl.run``), into ``--runs`` (a run whose ``summary.json`` exists is not run again, so
an interrupted benchmark continues).  The table (docs/figures/mujoco/ppo.md) gives, per
env, the mean +- std over seeds of the final mean return (the last 20 episodes of every
rank) beside CleanRL's published v4 figure, and whether it falls within the published
band (mean +- std); the figure (ppo.png) draws every seed's return against env steps.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpirl.launch import mpi_env, mpiexec_command  # noqa: E402

#: CleanRL ppo_continuous_action, MuJoCo v4, 1M steps: mean +- std over seeds (the
#: figures the issue quotes, from CleanRL's documentation)
REFERENCE = {"HalfCheetah": (1442.64, 46.03), "Hopper": (2382.86, 271.74),
             "Walker2d": (2287.95, 568.08)}
OUT = ROOT / "docs" / "figures" / "mujoco"


def run(env: str, seed: int, steps: int, ranks: int, runs: Path) -> Path:
    """The run directory of (env, seed), run first if it has no summary yet."""
    name = f"ppo-{env}-s{seed}"
    found = sorted((runs / name).glob("*/summary.json"))
    if found:
        return found[-1].parent
    argv = ["--config", str(ROOT / "experiments" / "hopper_ppo.yaml"), "--env", env,
            "--seed", str(seed), "--total-steps", str(steps), "--run-dir", str(runs / name)]
    cmd = mpiexec_command(ranks, [sys.executable, "-m", "mpirl.run", *argv])
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, env=mpi_env(), check=True, timeout=4 * 3600)
    return sorted((runs / name).glob("*/summary.json"))[-1].parent


def curve(run_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """env steps, wall seconds and mean return of each progress line."""
    rows = np.genfromtxt(run_dir / "progress.csv", delimiter=",", names=True)
    return rows["env_steps"], rows["wall_s"], rows["mean_return"]


def table(results: dict[str, list[dict]], steps: int, ranks: int) -> str:
    lines = [f"PPO (sync, {ranks} ranks, experiments/hopper_ppo.yaml) at {steps:,} env "
             "steps, against CleanRL's ppo_continuous_action (MuJoCo v4, 1M steps).", "",
             "| env | seeds | final mean return (mean +- std) | per seed | env steps/s | "
             "CleanRL | within the band |", "|---|---|---|---|---|---|---|"]
    for env, rows in results.items():
        finals = np.array([r["final_mean_return"] for r in rows])
        speed = np.mean([r["env_steps"] / r["wall_s"] for r in rows])
        ref = REFERENCE.get(env.split("-")[0])
        mean, std = finals.mean(), finals.std(ddof=1) if len(finals) > 1 else 0.0
        band = "n/a" if ref is None else ("yes" if ref[0] - ref[1] <= mean else "no")
        ref_text = "n/a" if ref is None else f"{ref[0]:.0f} +- {ref[1]:.0f}"
        lines.append(f"| {env} | {len(rows)} | {mean:.0f} +- {std:.0f} | "
                     f"{', '.join(f'{f:.0f}' for f in finals)} | {speed:.0f} | {ref_text} "
                     f"| {band} |")
    lines += ["", "Within the band: the mean over seeds reaches the reference's mean minus "
              "its std (above the band counts as within)."]
    return "\n".join(lines) + "\n"


def figure(curves: dict[str, list[tuple]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.6), squeeze=False)
    for ax, (env, runs) in zip(axes[0], curves.items(), strict=True):
        for seed, (steps, _wall, ret) in runs:
            ax.plot(steps / 1e6, ret, label=f"seed {seed}")
        ref = REFERENCE.get(env.split("-")[0])
        if ref is not None:
            ax.axhspan(ref[0] - ref[1], ref[0] + ref[1], color="grey", alpha=0.25,
                       label="CleanRL at 1M (mean +- std)")
        ax.set(title=env, xlabel="env steps (millions)", ylabel="mean episode return")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["Hopper-v5", "HalfCheetah-v5",
                                                      "Walker2d-v5"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "bench_mujoco")
    args = parser.parse_args(argv)
    results: dict[str, list[dict]] = {}
    curves: dict[str, list[tuple]] = {}
    for env in args.envs:
        for seed in args.seeds:
            run_dir = run(env, seed, args.steps, args.ranks, args.runs)
            summary = json.loads((run_dir / "summary.json").read_text().replace("NaN", "null"))
            results.setdefault(env, []).append(summary)
            curves.setdefault(env, []).append((seed, curve(run_dir)))
    OUT.mkdir(parents=True, exist_ok=True)
    text = table(results, args.steps, args.ranks)
    (OUT / "ppo.md").write_text(text)
    figure(curves, OUT / "ppo.png")
    print(text)


if __name__ == "__main__":
    main()
