"""What OpenSim's ``integrator_accuracy`` buys and costs in L2Run-v0.

    python experiments/study_integrator.py [--accuracies 1e-6 1e-5 5e-5 ...]
                                           [--speed-steps 600] [--episodes 4]

For each accuracy, one process, one env (difficulty 0):

1. **Speed.** ``--speed-steps`` steps of uniform random excitations (the same sequence
   for every accuracy, resetting at each fall): env steps/s, from the simulator's own
   time per step (``info["sim_s"]``).  The accuracies take turns, ``--rounds`` times
   (one env each, kept between turns), so the machine's load falls on all alike; the
   table gives the median over rounds and the ratio to 5e-5, the default.
2. **Fidelity.** ``--episodes`` episodes, each a fixed excitation sequence played
   open-loop (the same for every accuracy): half uniform random, half a smooth periodic
   pattern (each muscle a sine of its own phase, the kind of signal a trained gait
   sends).  Against the tightest accuracy (the reference, the first of
   ``--accuracies``): the return's absolute error, the step at which the model falls,
   and the observation error (RMS over the steps both ran, in units of the reference's
   per-feature std).

A looser integrator is faster but its dynamics differ; once the difference is as large
as what a policy's own noise makes, a learner cannot tell, and the steps are cheaper.
The table and figure go to docs/figures/l2run/integrator.{md,png}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "docs" / "figures" / "l2run"
ACT = 18


def make_env(accuracy: float):
    import gymnasium

    import mpirl.parts.envs  # noqa: F401  (registers L2Run-v0)
    return gymnasium.make("L2Run-v0", integrator_accuracy=accuracy).unwrapped


def speed(env, steps: int, seed: int) -> float:
    """env steps per second of simulator time over a fixed random sequence."""
    rng = np.random.default_rng(seed)
    env.reset(seed=0)
    total = 0.0
    for _ in range(steps):
        _, _, terminated, truncated, info = env.step(rng.random(ACT))
        total += info["sim_s"]
        if terminated or truncated:
            env.reset(seed=0)
    return steps / total


def sequences(episodes: int, length: int) -> list[np.ndarray]:
    """The open-loop excitation sequences: random and periodic, alternately."""
    rng = np.random.default_rng(1)
    out = []
    for i in range(episodes):
        if i % 2 == 0:
            out.append(rng.random((length, ACT)))
        else:
            t = np.arange(length)[:, None]
            phase, period = rng.random(ACT) * 2 * np.pi, rng.uniform(25, 45)
            out.append(0.5 + 0.45 * np.sin(2 * np.pi * t / period + phase))
    return out


def play(env, actions: np.ndarray) -> tuple[np.ndarray, float, int]:
    """Observations, return and length of one open-loop episode."""
    obs, _ = env.reset(seed=0)
    seen, ret = [obs], 0.0
    for step, a in enumerate(actions, start=1):
        obs, reward, terminated, truncated, _ = env.step(a)
        seen.append(obs)
        ret += reward
        if terminated or truncated:
            return np.asarray(seen), ret, step
    return np.asarray(seen), ret, len(actions)


def fidelity(runs: list[tuple], ref: list[tuple]) -> dict:
    """Errors of one accuracy's episodes against the reference's."""
    ret_err, fall_diff, obs_err = [], [], []
    for (obs, ret, n), (r_obs, r_ret, r_n) in zip(runs, ref, strict=True):
        k = min(n, r_n) + 1
        scale = r_obs[:k].std(axis=0) + 1e-6
        obs_err.append(float(np.sqrt(np.mean(((obs[:k] - r_obs[:k]) / scale) ** 2))))
        ret_err.append(abs(ret - r_ret))
        fall_diff.append(abs(n - r_n))
    return {"return_err": float(np.mean(ret_err)), "return_err_max": float(np.max(ret_err)),
            "fall_diff": float(np.mean(fall_diff)), "obs_err": float(np.mean(obs_err))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--accuracies", nargs="+", type=float,
                        default=[1e-6, 1e-5, 5e-5, 1e-4, 1e-3, 1e-2, 3e-2])
    parser.add_argument("--speed-steps", type=int, default=200, help="per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--length", type=int, default=300, help="steps per open-loop episode")
    parser.add_argument("--out", type=Path, default=OUT)
    opts = parser.parse_args(argv)
    if sorted(opts.accuracies) != opts.accuracies or not all(0 < a < 1 for a in opts.accuracies):
        parser.error(f"--accuracies {opts.accuracies}: give increasing numbers in (0, 1), "
                     "the reference (tightest) first")
    envs = {acc: make_env(acc) for acc in opts.accuracies}
    rates: dict[float, list[float]] = {acc: [] for acc in opts.accuracies}
    for r in range(opts.rounds):
        for acc, env in envs.items():
            rates[acc].append(speed(env, opts.speed_steps, seed=r))
        print(f"round {r + 1}: " + ", ".join(f"{a:g} {v[-1]:.1f}" for a, v in rates.items()),
              flush=True)
    seqs = sequences(opts.episodes, opts.length)
    rows, ref = [], None
    for acc, env in envs.items():
        runs = [play(env, s) for s in seqs]
        ref = ref or runs
        row = {"accuracy": acc, "steps_per_s": float(np.median(rates[acc])),
               **fidelity(runs, ref), "mean_return": float(np.mean([r[1] for r in runs])),
               "mean_length": float(np.mean([r[2] for r in runs]))}
        rows.append(row)
        print(" ".join(f"{k} {v:.4g}" for k, v in row.items()), flush=True)
        env.close()
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "integrator.md").write_text(table(rows, opts))
    figure(rows, opts.out / "integrator.png")
    print(table(rows, opts))


def table(rows: list[dict], opts) -> str:
    base = next((r for r in rows if r["accuracy"] == 5e-5), rows[0])
    lines = [f"L2Run-v0 (difficulty 0), one process: env steps/s (the median of "
             f"{opts.rounds} rounds of {opts.speed_steps} random-excitation steps, the "
             f"accuracies taking turns), and {opts.episodes} open-loop episodes of up to "
             f"{opts.length} steps against accuracy {rows[0]['accuracy']:g} (the reference).",
             "", "| integrator_accuracy | env steps/s | speed vs 5e-5 | return error (mean, max) "
             "| fall step differs by | observation RMS error (ref. std) | mean return |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['accuracy']:g} | {r['steps_per_s']:.1f} | "
                     f"{r['steps_per_s'] / base['steps_per_s']:.2f}x | "
                     f"{r['return_err']:.4f}, {r['return_err_max']:.4f} | "
                     f"{r['fall_diff']:.1f} | {r['obs_err']:.4f} | {r['mean_return']:.4f} |")
    return "\n".join(lines) + "\n"


def figure(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc = [r["accuracy"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    left.semilogx(acc, [r["steps_per_s"] for r in rows], "o-")
    left.set(xlabel="integrator_accuracy", ylabel="env steps/s (one process)",
             title="speed")
    right.semilogx(acc[1:], [r["return_err"] for r in rows[1:]], "o-", label="mean")
    right.semilogx(acc[1:], [r["return_err_max"] for r in rows[1:]], "s--", label="max")
    right.set(xlabel="integrator_accuracy",
              ylabel=f"|return - return at {acc[0]:g}|", title="fidelity (open loop)")
    right.legend()
    for ax in (left, right):
        ax.axvline(5e-5, color="grey", lw=0.8, ls=":")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
