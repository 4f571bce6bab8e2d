"""Train your own env with your own network from a Python script (docs/api.md).

    python experiments/train_custom.py [--ranks 3] [--total-steps 20000] [--runs runs]

``mpirl.train`` checks the configuration here, launches ``mpiexec -n RANKS python -m
mpirl.run`` with this script's directory on the ranks' PYTHONPATH (so every rank imports
``custom_env``: the env registers itself, the factory builds the network), streams the
run's progress, and returns its directory and summary.  Then the run's HDF5 logs are
read back.  Sync A2C on ``Corridor-v0`` at 3 ranks: the mean return of the first 20 episodes
is 0.35 (a random walk reaches the end late, or not at all), of the last 20 0.93 (straight
to the end, 8 steps).
"""

from __future__ import annotations

import argparse
import sys

import mpirl


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--total-steps", type=int, default=20_000)
    parser.add_argument("--runs", default="runs", help="parent of the run directory")
    parser.add_argument("--name", default=None, help="the run directory's name")
    args = parser.parse_args(argv)
    config = {"env": "custom_env:Corridor-v0", "model": "custom_env:make_net",
              "mode": "sync", "topology": "ring", "hidden": [32], "lr": 3e-3,
              "num_envs": 4, "rollout_steps": 16, "total_steps": args.total_steps,
              "log_every": 10, "run_dir": args.runs}
    if args.name:
        config["run_name"] = args.name
    try:
        result = mpirl.train(config, ranks=args.ranks, timeout_s=600)
    except mpirl.ConfigError as err:
        print(f"train_custom: error: {err}", file=sys.stderr)
        return 2
    run = result.load()
    episodes = run.episodes
    first, last = episodes.head(20)["return"].mean(), episodes.tail(20)["return"].mean()
    print(f"{result.run_dir}: {len(episodes)} episodes on {run.meta['world_size']} ranks; "
          f"mean return of the first 20 {first:.2f}, of the last 20 {last:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
