"""--one-step-stale measured in situ: how much of the gradient exchange a rollout hides,
on the emulated cluster at 100 Mbit/s and 1 Gbit/s.

    python experiments/bench_stale.py            # ~8 min on 2 cores, as root

On its own emulated cluster (``mpirlstale``, 2 nodes x 1 rank, taken down at the end,
also on error), ``python -m mpirl.run`` trains sync A2C over ring with a network of
about 1.1 M float32 parameters (``--hidden 512 512 512``: 4.2 MiB of gradient per
exchange) on ``Delay-v0``, a simulator whose every step costs ``--cost-ms`` (sleep: a
slow simulator such as OpenSim, without its CPU), 2 envs x 64 steps per rollout.  Plain
and ``--one-step-stale`` runs alternate (ABAB: the same conditions for both),
``--trials`` of each per link rate.  Per run, from rank 0's log: the median wall time
per update (the spacing of its rows' ``t_s``, past the first 3 updates), its median
``exchange_s`` (the plain run's whole exchange; the stale run's wait left after the next
rollout) and ``env_s``.

Writes ``results.md`` (medians over trials, side by side) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NAME = "mpirlstale"
SUBNET = "10.231.94.0/24"
NODES = 2
RATES = ["100mbit", "1gbit"]
WAYS = {"plain": [], "stale": ["--one-step-stale"]}


def run_args(cost_ms: float, updates: int, run_dir: Path, name: str) -> list[str]:
    from mpirl.cluster.trials import SLOW_SIM_ROLLOUT, slow_sim_argv

    return slow_sim_argv(updates * NODES * SLOW_SIM_ROLLOUT, run_dir, name, cost_ms,
                         "--topology", "ring")


def measure(run: Path) -> dict:
    """Rank 0's medians past the first 3 updates (start-up, the first bcast)."""
    import numpy as np

    from mpirl.telemetry.read import load_run

    u = load_run(run).updates
    u = u[u["rank"] == 0].sort_values("update")
    later = u[u["update"] > 3]
    return {"update_s": float(np.median(np.diff(later["t_s"]))),
            "exchange_s": float(later["exchange_s"].median()),
            "env_s": float(later["env_s"].median()),
            "params": int(json.loads((run / "summary.json").read_text())["gradient_bytes"]) // 4,
            "staleness": float(later["staleness"].mean())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/figures/stale")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--cost-ms", type=float, default=3.0)
    args = parser.parse_args()
    from mpirl.cluster.trials import alternate

    out = (ROOT / args.out).resolve()
    runs = out / "runs"
    out.mkdir(parents=True, exist_ok=True)
    results = alternate((NAME, NODES, SUBNET), RATES, WAYS, args.trials, runs,
                        lambda runs, name: run_args(args.cost_ms, args.updates, runs, name),
                        measure)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    write(out, results, args)
    shutil.rmtree(runs, ignore_errors=True)       # the figures' numbers are in results.json
    return 0


def write(out: Path, results: dict, args) -> None:
    import numpy as np

    first = results[RATES[0]]["plain"][0]
    lines = ["# One-step-stale sync: the exchange hidden behind the next rollout "
             "(experiments/bench_stale.py)", "",
             f"Emulated cluster, {NODES} nodes x 1 rank, ring; sync A2C with "
             f"{first['params']} float32 parameters ({first['params'] * 4 / 2**20:.2f} MiB "
             f"per exchange) on Delay-v0 at {args.cost_ms:g} ms a step, 2 envs x 64 steps "
             f"per rollout; plain and `--one-step-stale` runs alternate, {args.trials} of "
             f"each, {args.updates} updates each; medians over updates 4.. of rank 0, then "
             "the median over trials, ms. 'exchange': the plain run's whole exchange, the "
             "stale run's wait left after the next rollout. 'Hidden': plain's update "
             "less stale's, as a share of plain's exchange.", "",
             "| link | way | update | exchange | env | update / plain's | hidden | "
             "mean staleness |", "|---|---|---|---|---|---|---|---|"]
    for rate, ways in results.items():
        med = {way: {k: float(np.median([t[k] for t in trials])) for k in trials[0]}
               for way, trials in ways.items()}
        plain = med["plain"]
        for way in WAYS:
            m = med[way]
            hidden = (plain["update_s"] - m["update_s"]) / plain["exchange_s"]
            lines.append(f"| {rate} | {way} | {m['update_s'] * 1e3:.0f} | "
                         f"{m['exchange_s'] * 1e3:.0f} | {m['env_s'] * 1e3:.0f} | "
                         f"{m['update_s'] / plain['update_s']:.2f} | "
                         + ("" if way == "plain" else f"{hidden:.0%}")
                         + f" | {m['staleness']:.2f} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
