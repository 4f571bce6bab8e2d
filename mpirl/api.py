"""``mpirl.train``: run a design under ``mpiexec`` from a Python script or notebook.

    import mpirl

    result = mpirl.train({"env": "CartPole-v1", "mode": "sync", "topology": "ring",
                          "total_steps": 50_000}, ranks=4)
    result.summary["final_mean_return"], result.run_dir
    run = result.load()          # the HDF5 logs as tables (mpirl.telemetry.read.Run)

The configuration (a dict of the fields ``python -m mpirl.run --help`` lists, a YAML
file, or both, with keyword arguments on top) is checked here first, exactly as every
rank will check it, so a bad value raises :class:`~mpirl.errors.ConfigError` with the
run's one-line message before any process starts.  The run is then launched as users
launch it, ``mpiexec -n RANKS python -m mpirl.run --config FILE``, with every directory
on this interpreter's ``sys.path`` on the ranks' ``PYTHONPATH``, so modules your script
can import (your env's, your network factory's) are importable in every rank.  Its
output streams to this process's stdout unless ``quiet``.  A run that fails raises
:class:`TrainError` with its last lines; one that outlives ``timeout_s`` is stopped as a
batch system stops it (SIGTERM: every rank ends at its next boundary, logs closed) and
raises :class:`TrainError` too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .errors import ConfigError
from .launch import stop_job


class TrainError(RuntimeError):
    """The run ended with an error, or was stopped at its time limit."""


@dataclass
class TrainResult:
    """What a finished run left: its directory, its summary and the launch's exit status."""

    run_dir: Path
    summary: dict = field(default_factory=dict)
    returncode: int = 0

    def load(self):
        """The run's logs as tables (:func:`mpirl.telemetry.read.load_run`)."""
        from .telemetry.read import load_run

        return load_run(self.run_dir)


def configuration(config: dict | str | Path | None = None, **fields) -> dict:
    """The run's fields: ``config`` (a dict, or a YAML file's path) with ``fields`` on
    top (``snake_case`` names, as in a YAML file)."""
    if config is None:
        base = {}
    elif isinstance(config, (str, Path)):
        path = Path(config)
        if not path.is_file():
            raise ConfigError(f"config={str(config)!r}: no such file")
        base = yaml.safe_load(path.read_text()) or {}
    elif isinstance(config, dict):
        base = dict(config)
    else:
        raise ConfigError(f"config of type {type(config).__name__}; allowed: a dict, or the "
                          "path of a YAML file")
    return {**base, **{k.replace("-", "_"): v for k, v in fields.items()}}


def _pythonpath() -> str:
    dirs = [os.getcwd(), *(p for p in sys.path if p and os.path.isdir(p))]
    old = os.environ.get("PYTHONPATH")
    return os.pathsep.join(dict.fromkeys(dirs + ([old] if old else [])))


def train(config: dict | str | Path | None = None, *, ranks: int = 2,
          timeout_s: float | None = None, quiet: bool = False, **fields) -> TrainResult:
    """Run one configuration on ``ranks`` MPI ranks and wait for it (module docstring)."""
    from .config import parse_args
    from .launch import mpi_env, mpiexec_command

    if type(ranks) is not int or ranks < 1:
        raise ConfigError(f"ranks={ranks!r}; allowed: an int >= 1")
    if timeout_s is not None and not timeout_s > 0:
        raise ConfigError(f"timeout_s={timeout_s!r}; allowed: a number above 0, or None")
    values = configuration(config, **fields)
    with tempfile.TemporaryDirectory(prefix="mpirl-train-") as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(values, sort_keys=False))
        cfg = parse_args(["--config", str(path)]).validate(ranks)   # ConfigError: raised
        if not cfg.run_name:                 # named here, so that the result can find it
            values["run_name"] = cfg.run_name = cfg.default_run_name(ranks)
            path.write_text(yaml.safe_dump(values, sort_keys=False))
        run_dir = Path(cfg.run_dir) / cfg.run_name
        cmd = mpiexec_command(ranks, [sys.executable, "-m", "mpirl.run", "--config", str(path)])
        code, tail = _launch(cmd, mpi_env({"PYTHONPATH": _pythonpath()}), timeout_s, quiet)
    if code == "timeout":
        raise TrainError(f"the run outlived timeout_s={timeout_s:g} and was stopped; its "
                         f"logs are in {run_dir}")
    if code:
        last = next((line for line in reversed(tail) if line.strip()), "")
        raise TrainError(f"the run exited with status {code}: {last}")
    summary_path = run_dir / "summary.json"
    import json

    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    return TrainResult(run_dir, summary, code)


def _launch(cmd: list[str], env: dict, timeout_s: float | None,
            quiet: bool) -> tuple[int | str, list[str]]:
    """Run ``cmd``, echoing its output unless ``quiet``; its exit status (``"timeout"``
    when the deadline stopped it) and its last 20 lines."""
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    tail: deque[str] = deque(maxlen=20)
    stopped = threading.Event()

    def deadline() -> None:
        if job.poll() is None:
            stopped.set()
            stop_job(job, 120.0)

    timer = threading.Timer(timeout_s, deadline) if timeout_s else None
    if timer:
        timer.daemon = True
        timer.start()
    try:
        for line in job.stdout:
            tail.append(line.rstrip("\n"))
            if not quiet:
                print(line, end="", flush=True)
        code = job.wait()
    except BaseException:                        # Ctrl-C: stop the job as the deadline does
        deadline()
        raise
    finally:
        if timer:
            timer.cancel()
    return ("timeout" if stopped.is_set() else code), list(tail)
