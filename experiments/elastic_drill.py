"""Elastic drill: lose a node of a 4-node sync job, and bring it back, on the emulated cluster.

    python experiments/elastic_drill.py [--out runs/elastic_drill] [--total-steps 500000]
                                        [--commit-every 5] [--only lose rejoin]

Brings up its own emulated cluster (``mpirlelastic``: 4 nodes, 1 Gbit/s links; root
needed, docs/cluster.md), runs each scenario as a user would —
``python -m mpirl.cluster exec --elastic -n 4 --ranks-per-node 1 -- python -m mpirl.run
--commit-every K ...`` — breaks it with the cluster's own commands, and takes it down.

* ``lose``: node2 powered off (``kill node2 --power-off``: every process on it
  SIGKILLed, and it stays down) once the job has logged ``--kill-at`` updates; the
  budget is finished on the 3 nodes left.
* ``rejoin``: node0 (rank 0's node, the one that writes run.h5) powered off at the same
  point; ``boot node0`` once the 3-node attempt has logged ``--boot-after`` updates of its
  own; the driver stops that attempt at a commit and relaunches on 4 nodes.

Each job logs every row at once (``--log-flush-every 1``) so the log of a killed attempt
ends where its ranks died, and the work done again can be counted.  Measured per
scenario: the exit status, the attempts (ranks, nodes, updates, the commit each
continued from), the updates done again, the time from the kill to the first update of
the next attempt (and its parts: the relaunch up to the new ranks' start, the restore),
the commits' cost, the env steps of the budget reached, and the return curve across
attempts (``analysis.elastic``'s figure).  Writes ``results.md`` and one figure per
scenario into ``--figures`` (default docs/figures/elastic).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.elastic import attempts_table, draw, load_job  # noqa: E402

CLUSTER = "mpirlelastic"
SUBNET = "10.231.88.0/24"
PY = sys.executable


def cluster(*args: str, check: bool = True) -> str:
    done = subprocess.run([PY, "-m", "mpirl.cluster", "--name", CLUSTER, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise SystemExit(f"mpirl.cluster {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def logged_update(attempt_dir: Path) -> int:
    """The last update rank 0's progress.csv reports (0 before its first line)."""
    path = attempt_dir / "progress.csv"
    try:
        rows = list(csv.reader(path.open()))
    except OSError:
        return 0
    return int(rows[-1][0]) if len(rows) > 1 and rows[-1] and rows[-1][0].isdigit() else 0


def wait_for(attempt_dir: Path, update: int, job: subprocess.Popen, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while logged_update(attempt_dir) < update:
        if job.poll() is not None:
            raise SystemExit(f"the job ended (exit {job.returncode}) before {attempt_dir} "
                             f"reached update {update}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{attempt_dir} did not reach update {update} in {limit_s} s")
        time.sleep(0.1)


def scenario(name: str, args, runs: Path) -> dict:
    job_dir = runs / name
    shutil.rmtree(job_dir, ignore_errors=True)
    command = [PY, "-m", "mpirl.cluster", "--name", CLUSTER, "exec", "--elastic", "-n", "4",
               "--ranks-per-node", "1", "--timeout", "1200", "--",
               "python", "-m", "mpirl.run", "--env", args.env, "--total-steps",
               str(args.total_steps), "--commit-every", str(args.commit_every),
               "--log-flush-every", "1", "--seed", str(args.seed),
               "--run-dir", str(runs), "--run-name", name]
    victim = "node2" if name == "lose" else "node0"
    log = (runs / f"{name}.log").open("w")
    started = time.time()
    job = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    marks = {}
    try:
        wait_for(job_dir / "attempt0", args.kill_at, job, 600)
        marks[f"{victim} powered off"] = time.time()
        cluster("kill", victim, "--power-off")
        if name == "rejoin":
            wait_for(job_dir / "attempt1", 1, job, 120)
            first = json.loads((job_dir / "attempt1" / "elastic.json").read_text())
            base = (first.get("restored") or {}).get("update", 0)
            wait_for(job_dir / "attempt1", base + args.boot_after, job, 600)
            marks[f"{victim} booted"] = time.time()
            cluster("boot", victim)
        code = job.wait(timeout=1500)
    finally:
        if job.poll() is None:
            job.kill()
        cluster("boot", victim, check=False)
        log.close()
    attempts = load_job(job_dir)
    table = attempts_table(attempts)
    second = attempts[1]
    kill_unix = marks[f"{victim} powered off"]
    first_end = float((second.run.updates["t_unix_s"] + second.run.updates["busy_s"])
                      .groupby(second.run.updates["update"]).max().iloc[0])
    draw(attempts, args.figures / f"{name}.png", marks)
    last = attempts[-1]
    return {"name": name, "exit": code, "victim": victim, "wall_s": time.time() - started,
            "table": table, "kill_to_training_s": first_end - kill_unix,
            "kill_to_start_s": float(second.run.meta["start_unix_s"]) - kill_unix,
            "restore_s": (second.record.get("restored") or {}).get("seconds"),
            "env_steps": last.run.summary.get("env_steps"),
            "final_return": last.run.summary.get("final_mean_return"),
            "output": (runs / f"{name}.log").read_text()}


def write_results(results: list[dict], args, path: Path) -> None:
    lines = [f"# Elastic drill: {args.env}, 4 nodes x 1 rank, sync butterfly, "
             f"--commit-every {args.commit_every}, budget {args.total_steps:,} env steps",
             "", f"`python experiments/elastic_drill.py --total-steps {args.total_steps} "
             f"--commit-every {args.commit_every} --kill-at {args.kill_at}"
             f" --boot-after {args.boot_after}`", ""]
    for r in results:
        t = r["table"]
        lines += [f"## {r['name']}: {r['victim']} powered off at update ~{args.kill_at}"
                  + (", booted again later" if r["name"] == "rejoin" else ""), "",
                  f"- exit status {r['exit']}; env steps done {r['env_steps']:,} of "
                  f"{args.total_steps:,}; final mean return {r['final_return']:.1f}; "
                  f"the whole job {r['wall_s']:.0f} s",
                  f"- kill -> first update of the next attempt: "
                  f"{r['kill_to_training_s']:.2f} s (kill -> new ranks started "
                  f"{r['kill_to_start_s']:.2f} s; restore {r['restore_s']:.3f} s)",
                  "", "| attempt | ranks | nodes | updates logged | continued from | "
                  "updates done again | gap (s) | commits | ms each | bytes |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for _, row in t.iterrows():
            def cell(v, fmt="{}"):
                return "-" if v is None or v != v else fmt.format(v)
            lines.append(f"| {row.attempt} | {row.ranks} | {row.nodes} | "
                         f"{row.first_update}-{row.last_update} | "
                         f"{cell(row.from_update, '{:.0f}')} | "
                         f"{cell(row.lost_updates, '{:.0f}')} | {cell(row.gap_s, '{:.2f}')} | "
                         f"{cell(row.commits, '{:.0f}')} | {cell(row.commit_ms, '{:.2f}')} | "
                         f"{cell(row.commit_bytes, '{:,.0f}')} |")
        said = [ln for ln in r["output"].splitlines() if "elastic" in ln or "died first" in ln]
        lines += ["", "What the driver and the job printed:", "", "```", *said, "```", "",
                  f"![{r['name']}]({r['name']}.png)", ""]
    path.write_text("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/elastic_drill", type=Path)
    parser.add_argument("--figures", default=ROOT / "docs/figures/elastic", type=Path)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--total-steps", type=int, default=500_000)
    parser.add_argument("--commit-every", type=int, default=5)
    parser.add_argument("--kill-at", type=int, default=600)
    parser.add_argument("--boot-after", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", nargs="*", choices=("lose", "rejoin"),
                        default=["lose", "rejoin"])
    args = parser.parse_args()
    args.out, args.figures = args.out.absolute(), args.figures.absolute()
    args.out.mkdir(parents=True, exist_ok=True)
    args.figures.mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONPATH"] = str(ROOT)
    cluster("down", check=False)
    cluster("up", "--nodes", "4", "--rate", "1gbit", "--subnet", SUBNET)
    try:
        results = [scenario(name, args, args.out) for name in args.only]
    finally:
        cluster("down", check=False)
    write_results(results, args, args.figures / "results.md")
    print((args.figures / "results.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
