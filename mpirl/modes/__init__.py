"""The training designs compared by mpirl, registered by ``--mode`` name.

Each mode is a function ``run(cfg, comm, run_dir) -> Summary`` that every rank calls.
Modes decide who computes gradients, when they travel and where they are applied;
how bytes move is the topology's business (``topologies/``), and what a gradient is
the Replica's (``mpirl/replica.py``).
"""

from __future__ import annotations

from .paramserver import run_async, run_quorum
from .sync import run_sync

MODES = {"sync": run_sync, "async": run_async, "quorum": run_quorum}
