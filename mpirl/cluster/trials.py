"""Training runs that take turns on a script's own emulated cluster: for each link rate,
``trials`` rounds of every way once (ABAB: a noisy spell hits the ways alike), each run
measured as it ends.  Used by the in-situ benchmarks (``experiments/bench_stale.py``,
``experiments/bench_delivery_training.py``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

from . import lifecycle, net
from .launch import run as run_on


def alternate(cluster: tuple[str, int, str], rates: list[str], ways: dict[str, list[str]],
              trials: int, runs: Path, argv: Callable[[Path, str], list[str]],
              measure: Callable[[Path], dict], *, timeout_s: float = 900,
              per_node: int = 1, order: str = "block") -> dict:
    """``{rate: {way: [measure(run) per trial]}}``.  ``cluster`` is ``(name, nodes,
    subnet)``, brought up for these runs and taken down after (also on error); every
    node runs ``per_node`` ranks of ``argv(runs, name) + ways[way]``, numbered over the
    nodes by ``order`` (``block`` or ``cyclic``: :data:`mpirl.cluster.launch.PLACEMENTS`).
    A run that does not exit 0 stops the whole with SystemExit, naming it."""
    name, nodes, subnet = cluster
    results: dict = {rate: {way: [] for way in ways} for rate in rates}
    with lifecycle.owned(name, nodes, subnet) as spec:
        for rate in rates:
            net.set_rate(spec, rate)
            for trial in range(trials):
                for way, flags in ways.items():
                    run = f"{rate}-{way}-{trial}"
                    shutil.rmtree(runs / run, ignore_errors=True)
                    code = run_on(spec, nodes * per_node, per_node,
                                  [*argv(runs, run), *flags], timeout_s=timeout_s, order=order)
                    if code != 0:
                        raise SystemExit(f"{name}: run {run} exited {code}")
                    results[rate][way].append(measure(runs / run))
                    print(run, results[rate][way][-1], flush=True)
    return results


#: env steps one rank takes per rollout in :func:`slow_sim_argv`'s run (2 envs x 64 steps)
SLOW_SIM_ROLLOUT = 2 * 64


def slow_sim_argv(steps: int, run_dir: Path, name: str, cost_ms: float,
                  *flags: str) -> list[str]:
    """``python -m mpirl.run`` training a network of about 1.1 M float32 parameters
    (4.2 MiB per copy) on ``Delay-v0`` at ``cost_ms`` a step (a slow simulator's time
    without its CPU), 2 envs x 64 steps per rollout (:data:`SLOW_SIM_ROLLOUT`), for
    ``steps`` env steps; ``flags`` pick the design."""
    return ["python", "-m", "mpirl.run", *flags, "--env", "Delay-v0",
            "--env-arg", f"cost_s={cost_ms / 1e3}", "--env-arg", "obs_dim=41",
            "--env-arg", "act_dim=18", "--hidden", "512", "512", "512",
            "--num-envs", "2", "--rollout-steps", "64", "--total-steps", str(steps),
            "--checkpoint-every", "0", "--log-every", "10", "--run-dir", str(run_dir),
            "--run-name", name]
