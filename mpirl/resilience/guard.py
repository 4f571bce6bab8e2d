"""A rank's guard around its training loop: ``--fail`` injection, the NaN check, the
watchdog and the signal stop, behind the few calls a loop makes at the right moments."""

from __future__ import annotations

import numpy as np

from .faults import FaultInjector, check_gradient, finite
from .stop import StopFlag
from .watchdog import Watchdog


class Guard:
    """Use as ``with Guard(cfg, comm, rank) as guard:`` around a loop; leaving it stops
    the watchdog and gives SIGTERM/SIGINT back to their previous handlers.

    * :meth:`at` / :meth:`beat`: what the rank is doing now, and "an update is done"
      (the watchdog's clock restarts; the sentinel learns it too);
    * :meth:`check`: before an exchange, fire this rank's ``--fail`` entry, then check
      the gradient (``--nan-policy stop`` raises; ``skip`` returns False);
    * :meth:`usable`: after an exchange, whether the averaged gradient may be applied
      (under ``skip`` a NaN that reached every rank makes all of them skip the step);
    * :meth:`stop_agreed`: whether any rank was signalled (collective).
    """

    def __init__(self, cfg, comm, rank: int) -> None:
        self.rank = rank
        self.nan_policy = cfg.nan_policy
        self.faults = FaultInjector(cfg.fail, rank)
        self.watchdog = Watchdog(comm, cfg.watchdog_s, rank)
        self.signals = StopFlag()

    def __enter__(self) -> "Guard":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def at(self, where: str) -> None:
        self.watchdog.at(where)

    def beat(self, update: int, where: str) -> None:
        self.watchdog.beat(update, where)

    def inject(self, update: int, buf: np.ndarray) -> None:
        """Fire this rank's ``--fail`` entry if it is for ``update``."""
        self.faults.before_exchange(update, buf)

    def check(self, update: int, grad: np.ndarray) -> bool:
        """``--fail``, then the gradient's check: True when it may be sent."""
        self.faults.before_exchange(update, grad)
        return check_gradient(grad, self.nan_policy, self.rank, update)

    def usable(self, grad: np.ndarray) -> bool:
        """After the exchange: False when ``skip`` lets a NaN through to every rank.
        (Under ``stop`` every rank checked its own gradient before, so none is here.)"""
        return self.nan_policy != "skip" or finite(grad)

    @property
    def stop_requested(self) -> bool:
        """This rank was signalled."""
        return bool(self.signals.requested)

    def stop_agreed(self, comm) -> bool:
        """True on every rank when any rank was signalled (collective)."""
        return self.signals.agreed(comm)

    def close(self) -> None:
        self.signals.restore()
        self.watchdog.stop()
