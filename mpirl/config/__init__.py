"""The run configuration: one dataclass, a help text per field, YAML in, flags on top.

``python -m mpirl.run --help`` is generated from the field docs (:mod:`.cli`).  The
fields are defined and checked in groups, one module each: :mod:`.design` (what is
compared, and the ranks a design's wiring needs), :mod:`.actorlearner`, :mod:`.replay`,
:mod:`.env` (environment and budget), :mod:`.learner`, :mod:`.telemetry` (bookkeeping)
and :mod:`.resilience` (faults, checkpoints, replay); :class:`Config` (:mod:`.config`)
is all of them at once, with flat keys, as sweeps use them.  A run's fully resolved
configuration is written next to its results, so any run can be repeated with
``--config RUN_DIR/config.yaml``.  Validation happens once, at start, before torch is
imported, and every message names the field, the value and what is allowed.

Validation looks things up in the registries it checks against: designs
(:mod:`mpirl.registry`), topology names (``topologies``), env ids and their arguments
(:mod:`mpirl.parts.envs`, importing no simulator), ``--fail``'s syntax
(:mod:`mpirl.resilience.faults`), and for ``--resume`` and ``--replay-schedule`` the
run's files (:mod:`mpirl.resilience.checkpoint`, :mod:`mpirl.resilience.schedule`).
"""

from __future__ import annotations

from ..errors import ConfigError
from ..resilience.faults import FAIL_KINDS, NAN_POLICIES, ON_FAILURE, FaultSpecError, parse_faults
from .cli import build_parser, parse_args
from .config import CHECKS, NOT_RESUMED, Config
from .design import LATE_POLICIES, MODES, parse_stragglers
from .learner import ACTIVATIONS
from .loading import config_differences, load_yaml

__all__ = ["ACTIVATIONS", "CHECKS", "FAIL_KINDS", "LATE_POLICIES", "MODES", "NAN_POLICIES",
           "NOT_RESUMED", "ON_FAILURE", "Config", "ConfigError", "FaultSpecError", "build_parser",
           "config_differences", "load_yaml", "parse_args", "parse_faults", "parse_stragglers"]
