"""experiments/bench_mujoco.py's results file (no MuJoCo run): runs measured at different
sittings merge into one table, nothing kept is dropped, and the committed table is what
its committed results file gives."""

from __future__ import annotations

import json
import sys

from mpirun import ROOT

sys.path.insert(0, str(ROOT / "experiments"))
import bench_mujoco as bench  # noqa: E402


def run(env: str, seed: int, final: float, steps: int = 300_000, ranks: int = 1) -> dict:
    return {"env": env, "seed": seed, "steps": steps, "ranks": ranks, "final": final,
            "mode": "sync-replay", "env_steps_per_s": 50.0, "curve": None}


def test_runs_of_several_sittings_make_one_table_and_none_is_dropped(tmp_path, capsys):
    kept = tmp_path / "sac.json"
    first = bench.merge(kept, [run("HalfCheetah-v5", 1, 5000.0), run("Hopper-v5", 2, 2000.0)])
    kept.write_text(json.dumps({"runs": first}))
    # a later sitting: another seed, a seed measured again, a run of another budget
    every = bench.merge(kept, [run("HalfCheetah-v5", 2, 6000.0),
                               run("Hopper-v5", 2, 2500.0),
                               run("Hopper-v5", 2, 900.0, steps=100_000)])
    assert [(r["env"], r["seed"], r["steps"], r["final"]) for r in every] == [
        ("Hopper-v5", 2, 100_000, 900.0), ("Hopper-v5", 2, 300_000, 2500.0),
        ("HalfCheetah-v5", 1, 300_000, 5000.0), ("HalfCheetah-v5", 2, 300_000, 6000.0)]
    tabled = bench.of_table(every, 300_000, 1, "sac.json")
    assert "kept, not in this table: Hopper-v5 seed 2 (100,000 env steps" in capsys.readouterr().out
    text = bench.table("sac", tabled, 300_000, 1)
    assert "| HalfCheetah-v5 | 2 | 5500 +- 707 | 5000, 6000 | 50 | 9635 +- 1424 | no |" in text
    assert "| Hopper-v5 | 1 | 2500 +- 0 | 2500 | 50 | 2310 +- 343 | yes |" in text


def test_the_committed_sac_table_is_its_results_file():
    out = ROOT / "docs" / "figures" / "mujoco"
    runs = json.loads((out / "sac.json").read_text())["runs"]
    steps, ranks = bench.ALGOS["sac"][2:4]
    assert (out / "sac.md").read_text() == bench.table(
        "sac", bench.of_table(runs, steps, ranks, "sac.json"), steps, ranks)
