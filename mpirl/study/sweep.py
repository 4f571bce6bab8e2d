"""``python -m mpirl.sweep experiments/NAME.yaml --launcher local|slurm|cluster``: run a grid.

A sweep definition is YAML::

    name: topologies                  # the sweep's directory: <out>/<name> (default runs/sweeps)
    description: free text
    config:                           # mpirl.run fields shared by every point
      env: CartPole-v1
      total_steps: 40000
    grid:                             # every combination; `ranks` is the mpiexec -n count,
      ranks: [1, 2, 4]                # every other key a mpirl.run field
      topology: [native, star, tree, butterfly]
      seed: [1, 2]
    timeout_s: 900                    # per point (local launcher); default 1800
    slurm:                            # for --launcher slurm (all optional)
      time: "00:20:00"                # per job
      nodes: 1
      partition: debug
      launcher: mpirun                # mpirun (MPICH's hydra inside the allocation) or srun
      srun_mpi: pmi2                  # srun --mpi=...
      sbatch: ["--exclusive"]         # extra #SBATCH lines

``grid`` may also be a list of such mappings: the sweep is then the union of their
products (e.g. sync over four topologies plus async over star only).

Each point is one run directory ``<sweep>/<point>/`` named after its values
(``tree-sync-4r-s1``, plus ``-key_value`` for any other grid key), written by
``mpirl.run`` itself.  A point is *done* when its ``summary.json`` exists; running the
sweep again skips done points, so a sweep interrupted anywhere resumes where it stopped.
A point directory without ``summary.json`` (a crashed or killed run) whose checkpoints
can continue it (one per rank, the point's rank count and configuration, all readable)
is resumed with ``mpirl.run --resume``; any other is moved to
``<sweep>/incomplete/<point>-<time>/`` (one line says why) before the point runs again
from scratch: nothing is deleted.  ``--dry-run`` shows which points would resume.

Every point is validated before the first one starts; a bad value stops the sweep at
once with the point and field named.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..config import NOT_RESUMED, Config, ConfigError, load_yaml
from ..launch import mpi_env, mpiexec_command

TOP_KEYS = {"name", "description", "config", "grid", "timeout_s", "slurm"}
SLURM_KEYS = {"time", "nodes", "partition", "launcher", "srun_mpi", "sbatch"}
SLURM_LAUNCHERS = ("mpirun", "srun")
#: grid keys that make up a point's name, in this order; other keys are appended.
NAME_KEYS = ("topology", "mode", "ranks", "seed")


class SweepError(ValueError):
    """A sweep definition or launch that cannot be used; the message says why."""


@dataclass
class Point:
    """One run of the sweep: its name, rank count and complete configuration."""

    name: str
    ranks: int
    config: dict

    def run_dir(self, sweep_dir: Path) -> Path:
        return sweep_dir / self.name

    def done(self, sweep_dir: Path) -> bool:
        return (self.run_dir(sweep_dir) / "summary.json").is_file()


@dataclass
class Plan:
    """What a launcher does with a point (see :func:`plan_point`).

    ``action``: ``done`` (it has a summary.json), ``fresh`` (no run directory yet),
    ``resume`` (``mpirl.run --resume`` from ``update``) or ``restart`` (its unfinished
    run directory goes to ``incomplete/`` first; ``why`` says why it is not resumed)."""

    action: str
    update: int | None = None
    why: str = ""

    def describe(self) -> str:
        if self.action == "resume":
            return f"resume from update {'?' if self.update is None else self.update}"
        if self.action == "restart":
            return f"restart ({self.why})"
        return "done" if self.action == "done" else "to run"


@dataclass
class Sweep:
    name: str
    points: list[Point]
    timeout_s: float
    slurm: dict
    definition: dict


def load(path: str | Path) -> Sweep:
    """Read and check a sweep definition: every point is validated here, before any runs."""
    try:
        data = load_yaml(path)
    except ConfigError as err:
        raise SweepError(str(err)) from None
    if not isinstance(data, dict):
        raise SweepError(f"{path}: expected a mapping with keys {', '.join(sorted(TOP_KEYS))}")
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise SweepError(f"{path}: unknown key(s) {', '.join(unknown)}; "
                         f"allowed: {', '.join(sorted(TOP_KEYS))}")
    name = data.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise SweepError(f"{path}: name={name!r}; allowed: letters, digits, '_', '.', '-'")
    points = _points(data, path)
    timeout = data.get("timeout_s", 1800)
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise SweepError(f"{path}: timeout_s={timeout!r}; allowed: seconds > 0")
    return Sweep(name, points, float(timeout), _slurm_block(data, path), data)


def _points(data: dict, path) -> list[Point]:
    """Every point of the grid (or the union of the grids), each validated."""
    base = data.get("config") or {}
    if not isinstance(base, dict):
        raise SweepError(f"{path}: config must be a mapping of mpirl.run fields")
    for reserved in ("run_dir", "run_name"):
        if reserved in base:
            raise SweepError(f"{path}: config.{reserved} is set by the sweep; remove it")
    grids = data.get("grid")
    grids = [grids] if isinstance(grids, dict) else grids
    if not grids or not all(isinstance(g, dict) and g for g in grids):
        raise SweepError(f"{path}: grid must be a mapping of key: [values] (or a list of them)")
    points: dict[str, Point] = {}
    for grid in grids:
        for point in _expand(grid, base, str(path)):
            points.setdefault(point.name, point)       # a union: repeats count once
    return list(points.values())


def _slurm_block(data: dict, path) -> dict:
    slurm = data.get("slurm") or {}
    bad = sorted(set(slurm) - SLURM_KEYS) if isinstance(slurm, dict) else ["(not a mapping)"]
    if bad:
        raise SweepError(f"{path}: unknown slurm key(s) {', '.join(bad)}; "
                         f"allowed: {', '.join(sorted(SLURM_KEYS))}")
    if slurm.get("launcher", "mpirun") not in SLURM_LAUNCHERS:
        raise SweepError(f"{path}: slurm.launcher={slurm['launcher']!r}; "
                         f"allowed: {', '.join(SLURM_LAUNCHERS)}")
    return slurm


def _expand(grid: dict, base: dict, source: str) -> list[Point]:
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"{source}: grid.{key} must be a non-empty list of values")
    ranks_values = grid.get("ranks", [base.get("ranks", 1)])
    keys = [k for k in grid if k != "ranks"]
    name_keys = [k for k in NAME_KEYS if k in keys] + [k for k in keys if k not in NAME_KEYS]
    out = []
    for ranks in ranks_values:
        if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
            raise SweepError(f"{source}: grid.ranks value {ranks!r}; allowed: integers >= 1")
        for combo in itertools.product(*(grid[k] for k in keys)):
            values = dict(zip(keys, combo, strict=True))
            merged = {**base, **values}
            try:
                cfg = Config.from_dict(merged, source=source)
                cfg.take_design_defaults(set(merged))     # as mpirl.run takes them
                cfg.validate(ranks)
            except ConfigError as err:
                raise SweepError(f"point {values} at {ranks} ranks: {err}") from None
            config = cfg.to_dict()
            out.append(Point(_point_name(config, ranks, name_keys), ranks, config))
    return out


def _point_name(config: dict, ranks: int, extra_keys: list[str]) -> str:
    parts = [config["topology"], config["mode"], f"{ranks}r", f"s{config['seed']}"]
    for key in extra_keys:
        if key not in NAME_KEYS:
            value = config[key]
            text = "+".join(map(str, value)) if isinstance(value, list) else str(value)
            parts.append(f"{key}_{re.sub(r'[^A-Za-z0-9.+]+', '_', text) or 'none'}")
    return "-".join(parts)


# -- preparing points -------------------------------------------------------------------------
def prepare(sweep: Sweep, sweep_dir: Path) -> list[Point]:
    """Write the sweep's files; return the points still to run (done ones skipped)."""
    (sweep_dir / "configs").mkdir(parents=True, exist_ok=True)
    (sweep_dir / "logs").mkdir(exist_ok=True)
    (sweep_dir / "sweep.yaml").write_text(yaml.safe_dump(sweep.definition, sort_keys=False))
    (sweep_dir / "sweep.json").write_text(json.dumps(
        {"name": sweep.name, "points": {p.name: p.ranks for p in sweep.points}}, indent=2))
    todo = []
    for point in sweep.points:
        (sweep_dir / "configs" / f"{point.name}.yaml").write_text(
            yaml.safe_dump(point.config, sort_keys=False))
        if not point.done(sweep_dir):
            todo.append(point)
    return todo


def plan_point(point: Point, sweep_dir: Path) -> Plan:
    """Done, fresh, resume or restart: an unfinished run directory is resumed only when
    :func:`resume_update` finds nothing against it; every other reason to restart is
    returned in ``Plan.why``."""
    run_dir = point.run_dir(sweep_dir)
    if point.done(sweep_dir):
        return Plan("done")
    if not run_dir.exists():
        return Plan("fresh")
    if not any((run_dir / "checkpoints").glob("rank*.pt")):
        return Plan("restart", why="no checkpoints to resume from")
    from ..resilience.checkpoint import UnusableCheckpoints   # torch: only once one is there

    try:
        return Plan("resume", update=resume_update(point, run_dir))
    except (ConfigError, UnusableCheckpoints) as err:
        return Plan("restart", why=f"cannot resume: {err}")


def resume_update(point: Point, run_dir: Path) -> int | None:
    """The update ``mpirl.run --resume RUN_DIR`` would continue ``point`` from; raises
    ConfigError or UnusableCheckpoints when the run directory must not be resumed.

    mpirl.run's own checks come first, unchanged: the configuration is built as
    ``--resume`` builds it (from the run directory's config.yaml) and validated at the
    point's rank count, which refuses a mode that cannot resume and a rank without a
    checkpoint.  A launcher that resumes on its own must also make sure that this is
    the point's run (not one of a sweep definition edited since: that would continue
    the old run under the new point's name) and that the checkpoints are whole and
    belong together (:func:`mpirl.checkpoint.check_set`), or the job it starts would
    fail or continue from a mix of runs."""
    from ..config import config_differences, parse_args
    from ..resilience.checkpoint import check_set

    cfg = parse_args(["--resume", str(run_dir)]).validate(point.ranks)
    differ = config_differences(
        {k: v for k, v in cfg.to_dict().items() if k not in NOT_RESUMED},
        {k: v for k, v in point.config.items() if k not in NOT_RESUMED})
    if differ:
        raise ConfigError(f"its config.yaml differs from the point's ({', '.join(differ[:4])})")
    kind = cfg.design.checkpoints
    return check_set(run_dir, point.ranks, same_update=kind == "replica",
                     generational=kind == "snapshots")


def set_aside_incomplete(point: Point, sweep_dir: Path) -> Path | None:
    """Move a point's unfinished run directory under ``incomplete/``; return where to."""
    run_dir = point.run_dir(sweep_dir)
    if not run_dir.exists():
        return None
    target = sweep_dir / "incomplete" / f"{point.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    target.parent.mkdir(exist_ok=True)
    shutil.move(str(run_dir), str(target))
    return target


def run_argv(point: Point, sweep_dir: Path) -> list[str]:
    """The ``python -m mpirl.run ...`` part of a point's command line."""
    return ["-m", "mpirl.run", "--config", str(sweep_dir / "configs" / f"{point.name}.yaml"),
            "--run-dir", str(sweep_dir), "--run-name", point.name]


def resume_argv(point: Point, sweep_dir: Path) -> list[str]:
    """The ``python -m mpirl.run ...`` part of a resumed point's command line: the run
    directory's own config.yaml, which :func:`resume_update` checked is the point's."""
    return ["-m", "mpirl.run", "--resume", str(point.run_dir(sweep_dir))]


# -- local launcher ----------------------------------------------------------------------------
def run_local(sweep: Sweep, sweep_dir: Path, todo: list[Point],
              plans: dict[str, Plan], cluster=None, per_node: int | None = None,
              order: str = "block") -> list[str]:
    """Run the points one after another through mpiexec, resuming or restarting each as
    ``plans`` says; return the names that failed.  With ``cluster`` (an emulated
    cluster, :mod:`mpirl.cluster`), each point runs across its nodes, ``per_node``
    ranks on each (default: spread evenly), numbered by ``order`` (block or cyclic)."""
    failed = []
    resumed = 0
    env = mpi_env({"PYTHONPATH": os.pathsep.join(filter(None, [str(_project_root()),
                                                               os.environ.get("PYTHONPATH")]))})
    for i, point in enumerate(todo, 1):
        plan = plans[point.name]
        log = sweep_dir / "logs" / f"{point.name}.out"
        if plan.action == "resume":
            argv, log_mode, resumed = resume_argv(point, sweep_dir), "a", resumed + 1
        else:
            argv, log_mode = run_argv(point, sweep_dir), "w"
            moved = set_aside_incomplete(point, sweep_dir)
            if moved:
                print(f"sweep: {point.name}: not resumed, {plan.why}; restarting from scratch "
                      f"(unfinished earlier run kept in {moved})", flush=True)
        cmd = mpiexec_command(point.ranks, [sys.executable, *argv])
        if cluster is not None:
            from ..cluster.launch import mpiexec_argv  # noqa: PLC0415

            cmd, job_env = mpiexec_argv(cluster, point.ranks, per_node,
                                        [sys.executable, *argv], order=order)
            env = {**job_env, "PYTHONPATH": env["PYTHONPATH"]}
        what = f" ({plan.describe()})" if plan.action == "resume" else ""
        print(f"sweep: [{i}/{len(todo)}] {point.name}{what} ... ", end="", flush=True)
        started = time.monotonic()
        links_before = link_bytes(cluster) if cluster is not None else None
        with open(log, log_mode) as out:
            if plan.action == "resume":       # the interrupted attempt's output stays above
                out.write(f"\nsweep: {plan.describe()}: {shlex.join(argv)}\n")
                out.flush()
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
            try:
                code = proc.wait(timeout=sweep.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
                code = "timeout"
        took = time.monotonic() - started
        if links_before is not None and point.run_dir(sweep_dir).is_dir():
            write_links(point.run_dir(sweep_dir), cluster, links_before)
        if code == 0 and point.done(sweep_dir):
            print(f"done in {took:.0f} s", flush=True)
        else:
            why = f"no result within {sweep.timeout_s:g} s" if code == "timeout" \
                else f"exit {code}"
            print(f"FAILED ({why}; see {log})", flush=True)
            failed.append(point.name)
    print(f"sweep: {len(todo)} point(s) run, {resumed} of them resumed from checkpoints, "
          f"{len(failed)} failed", flush=True)
    return failed


def link_bytes(cluster) -> dict:
    from ..cluster.net import link_bytes as read  # noqa: PLC0415

    return read(cluster)


def write_links(run_dir: Path, cluster, before: dict) -> None:
    """``links.json`` in the run directory: bytes each node sent and received through its
    link during the point (the launcher's own traffic included: a few KB), added to
    those of the point's earlier attempts if it was resumed (:func:`merge_links`)."""
    after = link_bytes(cluster)
    moved = {h: {k: after[h][k] - before[h][k] for k in ("sent", "received")} for h in after}
    path = run_dir / "links.json"
    earlier = json.loads(path.read_text()) if path.is_file() else None
    path.write_text(json.dumps(merge_links(earlier, cluster.rate, moved), indent=1))


def merge_links(earlier: dict | None, rate: str, moved: dict) -> dict:
    """``links.json``'s content after an attempt that moved ``moved`` (per node: bytes
    ``sent`` and ``received``) at the link cap ``rate``: ``attempts`` lists each attempt's
    cap and bytes, oldest first; ``nodes`` sums them per node; ``rate`` is the cap ("mixed"
    where attempts ran at different caps).  ``earlier``: the file before this attempt
    (None for a point's first; one written without ``attempts`` counts as one)."""
    attempts = [] if earlier is None else \
        earlier.get("attempts", [{"rate": earlier["rate"], "nodes": earlier["nodes"]}])
    attempts = [*attempts, {"rate": rate, "nodes": moved}]
    nodes: dict[str, dict[str, int]] = {}
    for one in attempts:
        for host, bytes_ in one["nodes"].items():
            total = nodes.setdefault(host, {"sent": 0, "received": 0})
            for k in total:
                total[k] += bytes_[k]
    rates = {one["rate"] for one in attempts}
    return {"rate": rates.pop() if len(rates) == 1 else "mixed", "nodes": nodes,
            "attempts": attempts}


def _project_root() -> Path:
    return Path(__file__).resolve().parents[1]


# -- Slurm launcher ----------------------------------------------------------------------------
def sbatch_script(point: Point, sweep: Sweep, sweep_dir: Path, plan: Plan) -> str:
    """A batch script that runs one point under its own allocation.

    Whether the point is done, resumes or starts afresh is decided again when the job
    starts (``--prepare-point``), not only when the script is written: a job requeued
    or resubmitted after Slurm's time limit stopped it (SIGTERM: every rank writes its
    checkpoint) then continues from that checkpoint.  ``plan`` is what was decided now,
    noted in the script."""
    s = sweep.slurm
    python = sys.executable
    sweep_dir = sweep_dir.absolute()          # the script runs from the project's root
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={job_name(sweep, point)}",
             f"#SBATCH --nodes={s.get('nodes', 1)}",
             f"#SBATCH --ntasks={point.ranks}",
             f"#SBATCH --time={s.get('time', '01:00:00')}",
             f"#SBATCH --output={sweep_dir / 'logs' / point.name}.slurm-%j.out"]
    if s.get("partition"):
        lines.append(f"#SBATCH --partition={s['partition']}")
    lines += [f"#SBATCH {extra}" for extra in s.get("sbatch", [])]
    fresh = shlex.join(run_argv(point, sweep_dir)[2:])
    resume = shlex.join(resume_argv(point, sweep_dir)[2:])
    if s.get("launcher", "mpirun") == "srun":
        launch = f"srun --mpi={s.get('srun_mpi', 'pmi2')} -n \"$SLURM_NTASKS\""
    else:
        launch = f"{shlex.quote(mpiexec_command(1, [])[0])} -n \"$SLURM_NTASKS\""
    prepare = shlex.join([python, "-m", "mpirl.sweep", str(sweep_dir / "sweep.yaml"),
                          "--out", str(sweep_dir.parent), "--prepare-point", point.name])
    lines += [
        "# written by python -m mpirl.sweep; rerunning the sweep rewrites it",
        f"# when written: {plan.describe()}",
        "set -euo pipefail",
        f"cd {shlex.quote(str(_project_root()))}",
        f"export PYTHONPATH={shlex.quote(str(_project_root()))}${{PYTHONPATH:+:$PYTHONPATH}}",
        "# done, resume or fresh, decided as the job starts (an unusable earlier run is moved",
        "# to incomplete/ and the line why is in this job's output): a requeued job resumes",
        f"action=$({prepare})",
        'case "$action" in',
        "    done) echo 'already done'; exit 0 ;;",
        f"    resume) args=({resume}) ;;",
        f"    *) args=({fresh}) ;;",
        "esac",
        "# exec: Slurm's SIGTERM at the time limit reaches mpiexec, which makes every rank",
        "# checkpoint and stop",
        f'exec {launch} {shlex.quote(python)} -m mpirl.run "${{args[@]}}"',
        ""]
    return "\n".join(lines)


def job_name(sweep: Sweep, point: Point) -> str:
    return f"mpirl-{sweep.name}-{point.name}"


def run_slurm(sweep: Sweep, sweep_dir: Path, todo: list[Point], plans: dict[str, Plan], *,
              submit: bool, wait_s: float | None) -> list[str]:
    """Write one batch script per point to run; with ``submit``, sbatch them (skipping
    points that already have a job queued or running).  Returns the points that failed."""
    scripts = _write_scripts(sweep, sweep_dir, todo, plans)
    if not submit:
        for path in scripts.values():
            print(f"  sbatch {path}")
        return []
    for tool in ("sbatch", "squeue"):
        if shutil.which(tool) is None:
            raise SweepError(f"--submit needs Slurm's {tool} on PATH; without --submit the "
                             "scripts are written for you to submit")
    jobs = _submit(sweep, todo, scripts)
    with open(sweep_dir / "slurm" / "jobs.txt", "a") as f:
        for name, job in jobs.items():
            f.write(f"{job} {name}\n")
    if wait_s is None or not jobs:
        return []
    deadline = time.monotonic() + wait_s
    while set(_squeue(["-h", "-o", "%i", "-j", ",".join(jobs.values())])) & set(jobs.values()):
        if time.monotonic() > deadline:
            raise SweepError(f"jobs {', '.join(jobs.values())} still queued or running after "
                             f"--wait {wait_s:g} s (they go on; rerun later to collect)")
        time.sleep(1.0)
    return [p.name for p in todo if p.name in jobs and not p.done(sweep_dir)]


def _write_scripts(sweep: Sweep, sweep_dir: Path, todo: list[Point],
                   plans: dict[str, Plan]) -> dict[str, Path]:
    """``slurm/<point>.sbatch`` for every point to run."""
    scripts_dir = sweep_dir / "slurm"
    scripts_dir.mkdir(exist_ok=True)
    scripts = {}
    for point in todo:
        path = scripts_dir / f"{point.name}.sbatch"
        path.write_text(sbatch_script(point, sweep, sweep_dir, plans[point.name]))
        path.chmod(0o755)
        scripts[point.name] = path
        if plans[point.name].action in ("resume", "restart"):
            print(f"sweep: {point.name}: {plans[point.name].describe()}", flush=True)
    resumed = sum(plans[p.name].action == "resume" for p in todo)
    print(f"sweep: {len(scripts)} batch script(s) in {scripts_dir}/, {resumed} of them "
          "resuming from checkpoints", flush=True)
    return scripts


def _submit(sweep: Sweep, todo: list[Point], scripts: dict[str, Path]) -> dict[str, str]:
    """sbatch every script whose point has no job queued or running; point -> job id."""
    queued = set(_squeue(["-h", "-o", "%j"]))
    jobs = {}
    for point in todo:
        if job_name(sweep, point) in queued:
            print(f"sweep: {point.name}: a job is already queued or running; not resubmitted")
            continue
        out = subprocess.run(["sbatch", "--parsable", str(scripts[point.name])],
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise SweepError(f"sbatch {scripts[point.name]} failed: {out.stderr.strip()}")
        jobs[point.name] = out.stdout.strip().split(";")[0]
        print(f"sweep: {point.name}: job {jobs[point.name]}", flush=True)
    return jobs


def _squeue(args: list[str]) -> list[str]:
    out = subprocess.run(["squeue", *args], capture_output=True, text=True, timeout=60)
    # squeue -j with jobs that have left the queue may exit non-zero: none of them remain
    return out.stdout.split() if out.returncode == 0 else []


def prepare_point(sweep: Sweep, sweep_dir: Path, name: str) -> int:
    """``--prepare-point NAME``: a batch script's first step, see :func:`sbatch_script`."""
    point = next((p for p in sweep.points if p.name == name), None)
    if point is None:
        raise SweepError(f"--prepare-point {name}: no such point in sweep {sweep.name}")
    plan = plan_point(point, sweep_dir)
    if plan.action == "restart":
        moved = set_aside_incomplete(point, sweep_dir)
        print(f"sweep: {name}: not resumed, {plan.why}; restarting from scratch (unfinished "
              f"earlier run kept in {moved})", file=sys.stderr, flush=True)
    elif plan.action == "resume":
        print(f"sweep: {name}: {plan.describe()}", file=sys.stderr, flush=True)
    print("fresh" if plan.action == "restart" else plan.action, flush=True)
    return 0


def cluster_for(args, sweep: Sweep):
    """The emulated cluster ``--launcher cluster`` runs on, every point checked to fit it
    (before the sweep writes anything); None for the other launchers."""
    if args.launcher != "cluster":
        return None
    from ..cluster import ClusterError  # noqa: PLC0415
    from ..cluster import load as load_cluster  # noqa: PLC0415
    from ..cluster.launch import placement  # noqa: PLC0415

    try:
        cluster = load_cluster(args.cluster_name)
        for point in sweep.points:
            placement(cluster, point.ranks, args.ranks_per_node)
    except ClusterError as err:
        raise SweepError(str(err)) from None
    return cluster


def launch(args, sweep: Sweep, sweep_dir: Path, todo: list[Point], plans: dict[str, Plan],
           cluster) -> list[str]:
    """Run ``todo`` with the launcher the command line chose (``cluster``: the emulated
    cluster's, :func:`cluster_for`); the names that failed."""
    if cluster is not None:
        return run_local(sweep, sweep_dir, todo, plans, cluster, args.ranks_per_node,
                         args.placement or "block")
    if args.launcher == "local":
        return run_local(sweep, sweep_dir, todo, plans)
    return run_slurm(sweep, sweep_dir, todo, plans, submit=args.submit, wait_s=args.wait)


# -- command line ------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpirl.sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("definition", help="sweep YAML, e.g. experiments/topologies.yaml")
    parser.add_argument("--launcher", choices=("local", "slurm", "cluster"), default="local",
                        help="local: run the points here through mpiexec, one after another; "
                             "slurm: write one batch script per point (and --submit them); "
                             "cluster: as local, across the emulated cluster's nodes "
                             "(python -m mpirl.cluster up)")
    parser.add_argument("--cluster-name", default=os.environ.get("MPIRL_CLUSTER_NAME", "mpirl"),
                        help="cluster launcher: which emulated cluster (default mpirl)")
    parser.add_argument("--ranks-per-node", type=int, default=None,
                        help="cluster launcher: ranks per node (default: spread evenly)")
    # the choices are mpirl.cluster.launch.PLACEMENTS, written out: the cluster package is
    # imported only for --launcher cluster (tests/cluster/test_placement.py checks each is taken)
    parser.add_argument("--placement", choices=("block", "cyclic"), default=None,
                        help="cluster launcher: number the ranks in blocks of a node's ranks "
                             "(default) or round robin over the nodes (rank r on node r mod "
                             "N), as `mpirl.cluster exec --placement`")
    parser.add_argument("--out", default="runs/sweeps",
                        help="parent directory of the sweep's directory (default runs/sweeps)")
    parser.add_argument("--submit", action="store_true", help="slurm: sbatch the scripts")
    parser.add_argument("--wait", type=float, metavar="SECONDS", default=None,
                        help="slurm with --submit: wait up to SECONDS for the jobs to end")
    parser.add_argument("--dry-run", action="store_true",
                        help="list the points and which are done, resume or restart; run "
                             "nothing")
    parser.add_argument("--prepare-point", metavar="NAME",
                        help="for the generated batch scripts: decide for this one point, "
                             "now, whether it is done, resumes or starts afresh (moving an "
                             "unusable earlier run to incomplete/), print the reason to stderr "
                             "and done|resume|fresh to stdout; run nothing")
    args = parser.parse_args(argv)
    try:
        for flag, value in (("--ranks-per-node", args.ranks_per_node),
                            ("--placement", args.placement)):
            if value is not None and args.launcher != "cluster":
                raise SweepError(f"{flag} {value} with --launcher {args.launcher}: only the "
                                 "cluster launcher places ranks (mpiexec here and Slurm place "
                                 "them themselves); allowed: --launcher cluster")
        sweep = load(args.definition)
        sweep_dir = Path(args.out) / sweep.name
        cluster = None if args.dry_run or args.prepare_point else cluster_for(args, sweep)
        if args.prepare_point:
            return prepare_point(sweep, sweep_dir, args.prepare_point)
        todo = prepare(sweep, sweep_dir)
        plans = {p.name: plan_point(p, sweep_dir) for p in todo}
        done = len(sweep.points) - len(todo)
        resuming = sum(plan.action == "resume" for plan in plans.values())
        print(f"sweep {sweep.name}: {len(sweep.points)} points, {done} done, {len(todo)} to run "
              f"({resuming} resuming from checkpoints; {sweep_dir}/)", flush=True)
        if args.dry_run:
            for point in sweep.points:
                state = plans[point.name].describe() if point.name in plans else "done"
                print(f"  {point.name:40} {point.ranks:3} ranks  {state}")
            return 0
        failed = launch(args, sweep, sweep_dir, todo, plans, cluster)
    except SweepError as err:
        print(f"mpirl.sweep: error: {err}", file=sys.stderr)
        return 2
    if failed:
        print(f"sweep: {len(failed)} point(s) failed: {', '.join(failed)}; rerun the same "
              "command to retry them (done points are skipped)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
