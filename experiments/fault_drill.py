"""Fault drill: break runs on purpose, the way clusters do, and measure what happens.

    python experiments/fault_drill.py [--out runs/drill] [--only NAME ...]

Each scenario starts a real job (MPICH from .venv; Open MPI from .venv-ulfm for the
survival ones), breaks it once the chosen rank has reported a given update (``kill -9``
of one rank, SIGTERM to ``mpiexec``, or a ``--fail`` injection), and measures: seconds
from the fault to the end of the job (or, for survival, to the survivors' recovery),
the exit status, whether the output names the failed rank, and whether every record
survived — every rank log opens, and after the resume (where the scenario resumes) each
rank's log holds every update exactly once and the gradient accounting adds up.  Prints
one markdown table row per scenario.

The cluster scenarios run on an emulated cluster of 2 nodes at 1 Gbit/s (its own,
``mpirldrill``, brought up and down by the drill; root needed, docs/cluster.md), 2 ranks
per node, and break a whole node: every process on it killed, its link cut, or its
ranks alone killed with its MPI runtime daemon kept (``kill --keep-runtime``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpirl.launch import mpi_env, mpiexec_command, openmpi_ulfm_command  # noqa: E402
from mpirl.resilience.sentinel import read_status, status_dir  # noqa: E402

SLOW = ["--env", "Delay-v0", "--env-arg", "cost_s=0.004", "--env-arg", "episode_steps=40",
        "--num-envs", "2", "--rollout-steps", "8", "--log-flush-every", "5",
        "--checkpoint-every", "5", "--log-every", "5"]

#: name -> (ranks, extra args, fault, rank to watch, update to break at, resume?, ulfm?)
SCENARIOS = {
    "kill -9 rank 1, sync butterfly": (3, ["--topology", "butterfly", "--total-steps", "4800"],
                                       "kill", 1, 12, True, False),
    "kill -9 rank 2, sync ring (4 ranks)": (4, ["--topology", "ring", "--total-steps", "6400"],
                                            "kill", 2, 12, True, False),
    "kill -9 server, async": (3, ["--mode", "async", "--topology", "star",
                                  "--total-steps", "4800"], "kill", 0, 30, True, False),
    "kill -9 worker 2, quorum (4 ranks)": (4, ["--mode", "quorum", "--topology", "star",
                                               "--total-steps", "6400"], "kill", 2, 12, True,
                                           False),
    "exception on rank 1 (--fail raise)": (3, ["--topology", "tree", "--total-steps", "4800",
                                               "--fail", "1@12:raise"], None, 1, 0, True,
                                           False),
    "rank 1 hangs (--fail hang, watchdog 5 s)": (3, ["--topology", "tree", "--total-steps",
                                                     "4800", "--fail", "1@12:hang",
                                                     "--watchdog-s", "5"], None, 1, 0, True,
                                                 False),
    "NaN on rank 1 (--nan-policy stop)": (3, ["--topology", "butterfly", "--total-steps",
                                              "4800", "--fail", "1@12:nan"], None, 1, 0, True,
                                          False),
    "SIGTERM to mpiexec, sync": (3, ["--topology", "butterfly", "--total-steps", "4800"],
                                 "term", 0, 12, True, False),
    "SIGTERM to mpiexec, async": (3, ["--mode", "async", "--topology", "star",
                                      "--total-steps", "4800"], "term", 1, 12, True, False),
    "ULFM: kill -9 rank 2, butterfly, shrink": (4, ["--topology", "butterfly", "--total-steps",
                                                    "4800", "--on-failure", "shrink"],
                                                "kill", 2, 12, False, True),
    "ULFM: kill -9 rank 0, tree, shrink": (4, ["--topology", "tree", "--total-steps", "4800",
                                               "--on-failure", "shrink"], "kill", 0, 12, False,
                                           True),
    "ULFM: kill -9 server, async": (3, ["--mode", "async", "--topology", "star",
                                        "--total-steps", "4800"], "kill", 0, 30, False, True),
}


#: name -> (ranks, extra args, fault, node, rank to watch, update, mpi, expected end)
#: on the emulated cluster: 2 nodes, 2 ranks each (node1 holds ranks 2 and 3)
CLUSTER_SCENARIOS = {
    "cluster: kill node1 (ranks 2, 3), sync butterfly, MPICH": (
        4, ["--topology", "butterfly", "--total-steps", "1000000"], "node-kill", "node1", 2, 12,
        "mpich", "ends"),
    "cluster: cut node1's link, sync butterfly, MPICH (watchdog 10 s)": (
        4, ["--topology", "butterfly", "--total-steps", "1000000", "--watchdog-s", "10"],
        "node-cut", "node1", 2, 12, "mpich", "ends"),
    "cluster: kill node1 (ranks 2, 3), sync butterfly, Open MPI shrink": (
        4, ["--topology", "butterfly", "--total-steps", "6400", "--on-failure", "shrink"],
        "node-kill", "node1", 2, 12, "openmpi", "survives"),
    "cluster: kill node1 (ranks 2, 3), sync star, Open MPI shrink": (
        4, ["--topology", "star", "--total-steps", "6400", "--on-failure", "shrink"],
        "node-kill", "node1", 2, 12, "openmpi", "survives"),
    "cluster: kill node0 (the server, rank 0), async star, Open MPI": (
        4, ["--mode", "async", "--topology", "star", "--total-steps", "1000000"],
        "node-kill", "node0", 1, 30, "openmpi", "ends"),
    # the node's ranks alone (kill --keep-runtime): its loss as MPI sees it, on a runtime
    # that outlives a node's daemon (Open MPI 5.0's PRRTE does not: the kills above)
    "cluster: node1's ranks (2, 3) killed, runtime kept, sync butterfly, Open MPI shrink": (
        4, ["--topology", "butterfly", "--total-steps", "6400", "--on-failure", "shrink"],
        "node-ranks", "node1", 2, 12, "openmpi", "survives"),
    "cluster: node0's ranks (0: the root, 1) killed, runtime kept, sync star, Open MPI shrink": (
        4, ["--topology", "star", "--total-steps", "6400", "--on-failure", "shrink"],
        "node-ranks", "node0", 2, 12, "openmpi", "survives"),
    "cluster: node0's ranks (0: the server, 1) killed, runtime kept, async star, Open MPI": (
        4, ["--mode", "async", "--topology", "star", "--total-steps", "1000000"],
        "node-ranks", "node0", 2, 30, "openmpi", "ends"),
}
#: how each fault is made: mpirl.cluster's command
FAULTS = {"node-kill": ["kill"], "node-cut": ["cut"], "node-ranks": ["kill", "--keep-runtime"]}
CLUSTER = "mpirldrill"


def command(nranks: int, argv: list[str], ulfm: bool) -> list[str]:
    if ulfm:
        return openmpi_ulfm_command(str(ROOT / ".venv-ulfm"), nranks, argv)
    return mpiexec_command(nranks, [sys.executable, *argv])


def start(nranks, argv, ulfm):
    return subprocess.Popen(command(nranks, argv, ulfm), cwd=ROOT,
                            env=mpi_env({"PYTHONPATH": str(ROOT)}), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def wait_for(proc, run_dir: Path, rank: int, update: int, deadline_s: float = 180) -> dict:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and proc.poll() is None:
        status = read_status(status_dir(run_dir) / f"rank{rank:04d}")
        if status and status["update"] >= update:
            return status
        time.sleep(0.02)
    raise RuntimeError(f"rank {rank} did not reach update {update}")


def finish(proc, timeout_s: float = 240) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return -1, out
    return proc.returncode, out


def logs_complete(run_dir: Path, nranks: int) -> tuple[bool, int]:
    """Every rank log opens; each has its update (or push) rows exactly once in order."""
    rows = 0
    ok = True
    for r in range(nranks):
        with h5py.File(run_dir / f"rank{r:04d}.h5", "r", libver="latest", swmr=True) as f:
            updates = f["updates"]["update"][...]
            role = f.attrs.get("role", "worker")
        rows += len(updates)
        if role == "worker" and not np.array_equal(updates, np.arange(1, len(updates) + 1)):
            ok = False
    return ok, rows


def drill(name: str, spec, out: Path) -> dict:
    nranks, args, fault, rank, at, resume, ulfm = spec
    run_dir = out / f"s{list(SCENARIOS).index(name):02d}"
    shutil.rmtree(run_dir, ignore_errors=True)
    argv = ["-m", "mpirl.run", *SLOW, *args, "--run-dir", str(out), "--run-name",
            run_dir.name]
    for _ in range(4 if ulfm else 1):      # Open MPI's start-up segfaults: docs/faults.md
        proc = start(nranks, argv, ulfm)
        try:
            status = wait_for(proc, run_dir, rank, at)
            break
        except RuntimeError:
            if fault is None and proc.poll() is not None:
                status = None
                break
            code, text = finish(proc, 5)
            if (run_dir / "config.yaml").exists():
                return {"name": name, "error": text[-800:]}
            shutil.rmtree(run_dir, ignore_errors=True)
    t_fault = time.time()
    if fault == "kill":
        os.kill(status["pid"], signal.SIGKILL)
    elif fault == "term":
        os.kill(proc.pid, signal.SIGTERM)
    code, text = finish(proc)
    t_end = time.time()
    row = {"name": name, "exit": code, "to_end_s": t_end - t_fault if fault else None,
           "named": None}
    lines = [line for line in text.splitlines()
             if ("died without a word" in line or "error" in line.lower()
                 or "stopped by a signal" in line or "survived" in line)
             and not line.startswith("[")]
    named = [line for line in lines if re.search(rf"rank {rank}\b", line) and
             ("died" in line or "error" in line or "no progress" in line)]
    row["says"] = (named or lines or [""])[0][:160]
    row["named"] = bool(named) or fault == "term"
    summary = run_dir / "summary.json"
    if ulfm and summary.is_file():                    # survived: recovery as the logs saw it
        s = json.loads(summary.read_text())
        detect, recovered = [], []
        for r in set(range(nranks)) - set(s["ranks_failed"]):
            with h5py.File(run_dir / f"rank{r:04d}.h5", "r") as f:
                fails = f["failures"][...]
            detect += list(fails["detect_s"])
            recovered += [float(u) - t_fault for u in fails["unix_s"]]
        row.update(survived=True, detect_s=max(detect), recover_s=max(recovered),
                   env_steps=s["env_steps"], ranks_failed=s["ranks_failed"])
    ok, rows = logs_complete(run_dir, nranks)
    row.update(logs_open=True, rows_before=rows)
    if resume:
        code2, text2 = finish(start(nranks, ["-m", "mpirl.run", "--resume", str(run_dir)],
                                    False), 600)
        s = json.loads(summary.read_text()) if summary.is_file() else {}
        ok, rows = logs_complete(run_dir, nranks)
        row.update(resume_exit=code2, complete_after_resume=ok,
                   accounting=s.get("gradients_sent") == s.get("gradients_applied", 0)
                   + s.get("gradients_dropped", 0) if s else None,
                   env_steps=s.get("env_steps"))
    return row


def cluster_drill(name: str, spec, out: Path) -> dict:
    """One whole-node fault on the emulated cluster; what ended, when, and who was named."""
    nranks, args, fault, node, rank, at, mpi, expected = spec
    run_dir = out / f"c{list(CLUSTER_SCENARIOS).index(name):02d}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cli = [sys.executable, "-m", "mpirl.cluster", "--name", CLUSTER]
    launch = [*cli, "exec", "-n", str(nranks), "--ranks-per-node", "2", "--timeout", "300",
              *(["--mpi", "openmpi", "--ulfm"] if mpi == "openmpi" else []), "--",
              "python", "-m", "mpirl.run", *SLOW, *args, "--run-dir", str(out),
              "--run-name", run_dir.name]
    for attempt in range(4 if mpi == "openmpi" else 1):   # Open MPI's start-up segfaults
        proc = subprocess.Popen(launch, cwd=ROOT, env=mpi_env({"PYTHONPATH": str(ROOT)}),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            wait_for(proc, run_dir, rank, at)
            break
        except RuntimeError:
            code, text = finish(proc, 30)
            shutil.rmtree(run_dir, ignore_errors=True)
            if attempt == (3 if mpi == "openmpi" else 0):
                return {"name": name, "error": text[-800:]}
    t_fault = time.time()
    subprocess.run([*cli, *FAULTS[fault], node], check=True, capture_output=True)
    code, text = finish(proc, 300)
    t_end = time.time()
    if fault == "node-cut":
        subprocess.run([*cli, "cut", node, "--restore"], check=True, capture_output=True)
    ranks_there = "ranks 2, 3" if node == "node1" else "ranks 0, 1"
    lines = [line for line in text.splitlines() if node in line and ranks_there in line]
    row = {"name": name, "exit": code, "to_end_s": t_end - t_fault, "expected": expected,
           "named": bool(lines), "says": (lines or [""])[0][:160],
           "last_lines": [line[:160] for line in text.strip().splitlines()[-3:]]}
    summary = run_dir / "summary.json"
    if summary.is_file():
        s = json.loads(summary.read_text())
        row.update(survived=True, ranks_failed=s.get("ranks_failed"), env_steps=s["env_steps"])
        detect, recovered = [], []
        for r in set(range(nranks)) - set(s.get("ranks_failed") or []):
            with h5py.File(run_dir / f"rank{r:04d}.h5", "r") as f:
                if "failures" in f:
                    fails = f["failures"][...]
                    detect += list(fails["detect_s"])
                    recovered += [float(u) - t_fault for u in fails["unix_s"]]
        if detect:
            row.update(detect_s=max(detect), recover_s=max(recovered))
        lost = [2, 3] if node == "node1" else [0, 1]
        row["named"] = row["named"] or s.get("ranks_failed") == lost
    row["logs_open"] = True
    logs_complete(run_dir, nranks)                  # every rank log opens (raises if not)
    return row


def run_cluster_drills(names: list[str], out: Path) -> list[dict]:
    from mpirl.cluster import lifecycle

    rows = []
    lifecycle.down(CLUSTER)
    lifecycle.up(CLUSTER, 2, "1gbit", "10.231.88.0/24")
    try:
        for name in names:
            row = cluster_drill(name, CLUSTER_SCENARIOS[name], out)
            rows.append(row)
            print(json.dumps(row, default=str), flush=True)
    finally:
        lifecycle.down(CLUSTER)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/drill")
    parser.add_argument("--only", nargs="*", help="scenario names containing these words")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, spec in SCENARIOS.items():
        if args.only and not any(word in name for word in args.only):
            continue
        if spec[6] and not (ROOT / ".venv-ulfm" / "bin" / "mpiexec").exists():
            print(f"skipped (no .venv-ulfm; make ulfm-env): {name}", flush=True)
            continue
        row = drill(name, spec, out)
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
    cluster = [name for name, spec in CLUSTER_SCENARIOS.items()
               if not args.only or any(word in name for word in args.only)]
    if cluster and os.geteuid() != 0:
        print(f"skipped (the emulated cluster needs root): {len(cluster)} cluster scenarios")
    elif cluster:
        if not (ROOT / ".venv-ulfm" / "bin" / "mpiexec").exists():
            cluster = [n for n in cluster if CLUSTER_SCENARIOS[n][6] != "openmpi"]
        rows += run_cluster_drills(cluster, out)
    (out / "drill.json").write_text(json.dumps(rows, indent=2, default=str))
    print("\n| fault | exit | fault -> end (s) | named | logs after | resume |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['name']} | error | | | | |")
            continue
        end = f"{r['to_end_s']:.1f}" if r.get("to_end_s") is not None else "-"
        if r.get("survived") and "detect_s" in r:
            end += f" (detect {r['detect_s']:.1f}, recovered {r['recover_s']:.1f})"
        resume = ("complete" if r.get("complete_after_resume") else "INCOMPLETE") \
            if "complete_after_resume" in r else "-"
        print(f"| {r['name']} | {r['exit']} | {end} | {r['named']} | "
              f"{'open' if r['logs_open'] else 'UNREADABLE'} | {resume} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
