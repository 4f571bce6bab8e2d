"""The alpha-beta-gamma prediction of an exchange's time, from its cost terms.

Each topology states its terms (``cost(op, p, n)``: messages, bytes moved, bytes
reduced, link phases); this module turns terms into seconds with a machine's fitted
:class:`Params`.  The fit itself, from ``mpirl.bench`` results, is
:mod:`mpirl.study.costmodel` (``python -m mpirl.costmodel``), which re-exports these; the
``auto`` topology predicts with them to pick an algorithm per call.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

from .native import MPICH_ALGORITHMS, Native


@dataclass
class Params:
    alpha: float     # s per message
    beta: float      # s per byte moved
    gamma: float     # s per byte reduced
    delta: float     # extra s per message for a Python topology
    rendezvous: float = 0.0     # extra s per message larger than eager_bytes (handshake)
    eager_bytes: float = math.inf   # MPICH's eager/rendezvous switch, as fitted
    burst_bytes: float = 0.0    # each link direction's token bucket (0: a plain link)
    refill_bytes: float = 0.0   # tokens a link regains between calls, 0..burst_bytes
    duplex_links: bool = False  # ranks on a network: a link sends and receives at once
                                # (False: shared memory, copies by the ranks' CPUs)

    def as_dict(self) -> dict:
        return asdict(self)


class Terms(NamedTuple):
    """An exchange's cost terms, as the model uses them."""
    messages: float
    bytes_moved: float
    bytes_reduced: float
    python: bool         # sent from Python: delta applies
    link_phases: int


def link_bytes(bytes_moved: float, phases: int, burst: float, refill: float) -> float:
    """Of ``bytes_moved`` crossing a token-bucket link in ``phases`` equal phases, the
    bytes its rate must carry: each phase's first ``burst`` bytes leave at once (the
    direction it uses was idle), and one direction carries ``bytes_moved / phases`` per
    call of which only ``refill`` came back between calls.  ``burst = 0``: all of them."""
    if burst <= 0:
        return bytes_moved
    per_phase = bytes_moved / phases
    return max(phases * max(0.0, per_phase - burst), per_phase - refill)


def terms(op: str, cls: type, p: int, n: float, algorithm: str | None = None) -> Terms:
    """The :class:`Terms` of topology class ``cls`` (``algorithm``: one of MPICH's, for
    ``Native``): its messages, bytes moved and bytes reduced, whether delta applies and
    its link phases.  KeyError when there is no model of it."""
    cost = cls.cost(op, p, n, algorithm) if algorithm else cls.cost(op, p, n)
    return Terms(cost.messages, cost.bytes_moved, cost.bytes_reduced,
                 cls.from_python and p > 1, cost.link_phases)


def seconds(params: Params, t: Terms) -> float:
    """The time ``params`` predict for an exchange of terms ``t``."""
    a, b, c, python, phases = t
    large = a if a and b / a > params.eager_bytes else 0.0
    moved = link_bytes(b, phases, params.burst_bytes, params.refill_bytes)
    return a * (params.alpha + (params.delta if python else 0.0)) + moved * params.beta \
        + c * params.gamma + large * params.rendezvous


def mpi_seconds(params: Params, op: str, p: int, n: float) -> float:
    """MPI's own choice, predicted as the cheapest of MPICH's modelled algorithms."""
    return min(seconds(params, terms(op, Native, p, n, algorithm))
               for algorithm in MPICH_ALGORITHMS[op])


def load_params(path: str | Path) -> Params:
    return Params(**json.loads(Path(path).read_text()))
