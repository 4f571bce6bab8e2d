"""``--tensorboard``: the run's scalars as TensorBoard event files, beside the HDF5 log.

Rank 0 (the rank that prints progress in every design: a sync worker, the parameter
server, the learner, seed's learner-and-inference rank) writes ``RUN_DIR/tensorboard/``;
open it with ``tensorboard --logdir runs/``.  At each progress line, with the env steps
of all ranks as the step:

``return/mean``               mean return of the episodes since the previous line
``throughput/env_steps_per_s``
``exchange/comm_share``       the workers' exchange share (gradient designs)
``wait/<role>``               the reporting rank's waiting share (actor-learner, replay)
``lag/mean``                  mean staleness or policy lag of the recent updates

and at each update of rank 0 that computed a gradient (sync, impala, seed, ga3c, apex,
sync-replay: not a parameter server), with its update counter as the step:
``loss/policy``, ``loss/value``, ``loss/entropy``, ``loss/approx_kl`` (those that apply).

The writer is torch's (``torch.utils.tensorboard``, which needs the ``tensorboard``
package: the ``tensorboard`` extra, which ``make`` installs); it queues events and
writes them from its own thread, so an update pays a queue append per scalar.
"""

from __future__ import annotations

import math
from pathlib import Path

#: this process's writer (None: --tensorboard is off, or this rank does not write)
_writer = None


def missing() -> str | None:
    """Why TensorBoard event files cannot be written here (None: they can)."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        return "the tensorboard package is not installed: pip install -e '.[tensorboard]'"
    return None


def active() -> bool:
    """This rank writes event files (so a caller may skip building its scalars)."""
    return _writer is not None


def start(run_dir: Path) -> None:
    """Open the writer of ``run_dir/tensorboard`` (rank 0 of a --tensorboard run)."""
    global _writer
    from torch.utils.tensorboard import SummaryWriter

    _writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"), flush_secs=10)


def scalars(values: dict[str, float], step: int) -> None:
    """Add the finite ``values`` at ``step`` (nothing when this rank does not write)."""
    if _writer is None:
        return
    for tag, value in values.items():
        if value is not None and math.isfinite(value):
            _writer.add_scalar(tag, float(value), int(step))


def close() -> None:
    """Write what is queued and close the files."""
    global _writer
    if _writer is not None:
        _writer.close()
        _writer = None
