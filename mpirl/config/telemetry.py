"""Bookkeeping: run files, progress lines, logs, replica checks."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .checks import at_least, doc


@dataclass
class TelemetryFields:
    run_dir: str = doc("parent directory of run directories", default="runs")
    run_name: str = doc("name of this run's directory (default: topology-mode-Nranks-time)",
                         default="")
    log_every: int = doc(
        "progress line every this many rollouts (sync: rank 0) or server updates "
        "(async, quorum)", default=20)
    target_return: float = doc(
        "stop early once every experience-collecting rank has finished 20 episodes and the "
        "mean over ranks of their last-20-episode mean return reaches this (checked at "
        "each progress line); 0 disables", default=0.0)
    log_flush_every: int = doc(
        "HDF5 log rows buffered before they are written and flushed; a crash loses at "
        "most this many rows per rank", default=50)
    checksum_every: int = doc(
        "compare a checksum of parameters and optimizer state across ranks every this many "
        "updates; a mismatch stops the run; 0 disables", default=50)
    tensorboard: bool = doc(
        "also write the progress scalars and rank 0's losses as TensorBoard event files "
        "into RUN_DIR/tensorboard (needs the tensorboard extra)", default=False)
    torch_threads: int = doc("torch threads per rank; 0 = cores / ranks sharing them (on an "
                              "emulated cluster: every rank of the job)",
                              default=0)


def check_run_dir(cfg) -> None:
    """The run's directory can be made and holds no earlier run: a run is never written
    over (``--resume`` continues one in place)."""
    from pathlib import Path

    parent = Path(cfg.run_dir)
    for above in (parent, *parent.parents):
        if above.exists():
            if not above.is_dir():
                raise ConfigError(f"run_dir={cfg.run_dir!r}: {above} is a file; allowed: a "
                                  "directory (made if missing)")
            break
    from ..resilience.elastic import Launch

    launch = Launch.from_env() if not cfg.resume else None
    if cfg.resume or not (cfg.run_name or launch):  # a default name carries the time of day
        return
    earlier = parent / (launch.run_name(cfg.run_name) if launch else cfg.run_name)
    if (earlier / "run.h5").exists() or (earlier / "config.yaml").exists():
        raise ConfigError(f"run_name={cfg.run_name!r}: {earlier} already holds a run; "
                          "allowed: another --run-name, --resume "
                          f"{earlier} to continue it, or remove it first")


def check_telemetry(cfg, world_size: int) -> None:
    check_run_dir(cfg)
    if cfg.tensorboard:
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            raise ConfigError("tensorboard=True: the tensorboard package is not installed: "
                              "pip install -e '.[tensorboard]'")
    for name in ("log_every", "log_flush_every"):
        at_least(name, getattr(cfg, name), 1)
    for name in ("checksum_every", "torch_threads"):
        at_least(name, getattr(cfg, name), 0)
