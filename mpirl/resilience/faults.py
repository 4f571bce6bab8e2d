"""Injected failures (``--fail``) and non-finite gradients (``--nan-policy``).

``--fail RANK@UPDATE[:KIND]`` (repeatable; syntax in :func:`parse_faults`)
makes rank RANK fail just before the exchange of its update UPDATE, so tests and users
can watch how a run ends:

* ``exit``  (default) the process dies at once (``os._exit``), as if killed: the MPI
  launcher sees it and ends the job;
* ``raise`` an exception on that rank: ``mpirl.run`` prints it, naming rank and update,
  and aborts the job;
* ``nan``   the rank's gradient becomes NaN: ``--nan-policy`` decides (below);
* ``hang``  the rank stops making progress: the other ranks block in the exchange and
  the watchdog (:mod:`mpirl.resilience.watchdog`) ends the job.

Non-finite gradients (``--nan-policy``): every rank checks its gradient and loss before
the exchange.  ``stop`` ends the job with a message naming the rank and update;
``skip`` counts it and lets the NaN travel through the exchange, where it reaches
every rank's averaged gradient (a sum with a NaN is NaN, identically everywhere), so all
ranks skip that optimizer step together and replicas stay identical.  Async and quorum
workers skip the push instead.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from ..errors import ConfigError

__all__ = ["FAIL_KINDS", "NAN_POLICIES", "ON_FAILURE", "FaultInjector", "FaultSpecError",
           "InjectedFault", "NonFiniteGradient", "check_gradient", "finite", "parse_faults"]

#: what ``--fail RANK@UPDATE:KIND`` does to the rank
FAIL_KINDS = ("exit", "raise", "nan", "hang")
#: what a non-finite gradient does (``--nan-policy``)
NAN_POLICIES = ("stop", "skip")
#: what the other ranks do when one fails (``--on-failure``; shrink: :mod:`.ulfm`)
ON_FAILURE = ("stop", "shrink")


class FaultSpecError(ConfigError):
    """A ``--fail`` entry that cannot be parsed or names a rank that does not exist."""


def parse_faults(specs: list, world_size: int | None = None) -> dict[int, tuple[int, str]]:
    """``["2@5", "1@3:nan"]`` -> ``{2: (5, "exit"), 1: (3, "nan")}``."""
    out: dict[int, tuple[int, str]] = {}
    for spec in specs:
        text = str(spec)
        where, _, kind = text.partition(":")
        kind = kind or "exit"
        try:
            rank_text, update_text = where.split("@")
            rank, update = int(rank_text), int(update_text)
        except ValueError:
            raise FaultSpecError(f"fail={text!r}; expected RANK@UPDATE[:KIND], e.g. 1@10:exit"
                                 ) from None
        if kind not in FAIL_KINDS:
            raise FaultSpecError(f"fail={text!r}: kind {kind!r}; allowed: "
                                 f"{', '.join(FAIL_KINDS)}")
        if rank < 0 or update < 1:
            raise FaultSpecError(f"fail={text!r}; allowed: RANK >= 0 and UPDATE >= 1")
        if world_size is not None and rank >= world_size:
            raise FaultSpecError(f"fail={text!r}: rank {rank} does not exist; allowed ranks: "
                                 f"0..{world_size - 1}")
        out[rank] = (update, kind)
    return out


class InjectedFault(RuntimeError):
    """The failure asked for with ``--fail RANK@UPDATE:raise``."""


class NonFiniteGradient(RuntimeError):
    """A NaN or Inf in a loss or gradient, with ``--nan-policy stop``."""


class FaultInjector:
    """Fires this rank's ``--fail`` entry (if any) at its update."""

    def __init__(self, specs: list, rank: int) -> None:
        self.rank = rank
        self.plan = parse_faults(specs).get(rank)

    def before_exchange(self, update: int, grad: np.ndarray) -> None:
        if self.plan is None or self.plan[0] != update:
            return
        kind = self.plan[1]
        where = f"rank {self.rank} at update {update}"
        if kind == "nan":
            grad[:] = np.nan
            return
        print(f"mpirl.run: injected failure ({kind}) on {where}", file=sys.stderr, flush=True)
        if kind == "exit":
            import os
            os._exit(17)
        if kind == "raise":
            raise InjectedFault(f"injected failure on {where}")
        while True:                  # hang: never returns; the watchdog ends the job
            time.sleep(3600)


def finite(grad: np.ndarray, loss: float | None = None) -> bool:
    """True when ``loss`` (if given) and every gradient element are finite."""
    if loss is not None and not np.isfinite(loss):
        return False
    return bool(np.isfinite(grad).all())


def check_gradient(grad: np.ndarray, policy: str, rank: int, update: int,
                   loss: float | None = None) -> bool:
    """True when the gradient may be used; raises for ``stop``; False for ``skip``."""
    if finite(grad, loss):
        return True
    what = f"rank {rank}: non-finite loss or gradient at update {update}"
    if policy == "stop":
        raise NonFiniteGradient(f"{what} (--nan-policy stop; use skip to go on)")
    print(f"mpirl.run: {what}; skipped (--nan-policy skip)", file=sys.stderr, flush=True)
    return False
