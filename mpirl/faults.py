"""Faults: injected ones (``--fail``), stalls (a watchdog) and non-finite gradients.

``--fail RANK@UPDATE[:KIND]`` (repeatable) makes rank RANK fail just before the exchange
of its update UPDATE, so tests and users can watch how a run ends:

* ``exit``  (default) the process dies at once (``os._exit``), as if killed: the MPI
  launcher sees it and ends the job;
* ``raise`` an exception on that rank: ``mpirl.run`` prints it, naming rank and update,
  and aborts the job;
* ``nan``   the rank's gradient becomes NaN: ``--nan-policy`` decides (below);
* ``hang``  the rank stops making progress: the other ranks block in the exchange and
  the watchdog ends the job.

Watchdog: every rank's main loop beats once per update; a thread checks the beat and, if
none came for ``--watchdog-s`` seconds, prints which rank, at which update, was stuck
for how long, and aborts the whole job (MPI_Abort).  Blocking collectives have no
deadline of their own; this is theirs.

Non-finite gradients (``--nan-policy``): every rank checks its gradient and loss before
the exchange.  ``stop`` ends the job with a message naming the rank and update;
``skip`` counts it and lets the NaN travel through the exchange, where it reaches
every rank's averaged gradient (a sum with a NaN is NaN, identically everywhere), so all
ranks skip that optimizer step together and replicas stay identical.  Async and quorum
workers skip the push instead.
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np

from . import sentinel

FAIL_KINDS = ("exit", "raise", "nan", "hang")
NAN_POLICIES = ("stop", "skip")


class FaultSpecError(ValueError):
    """A ``--fail`` entry that cannot be parsed or names a rank that does not exist."""


class InjectedFault(RuntimeError):
    """The failure asked for with ``--fail RANK@UPDATE:raise``."""


class NonFiniteGradient(RuntimeError):
    """A NaN or Inf in a loss or gradient, with ``--nan-policy stop``."""


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


class Watchdog:
    """Aborts the job when this rank's main loop stops beating for ``timeout_s``."""

    def __init__(self, comm, timeout_s: float, rank: int, *, prog: str = "mpirl.run",
                 unit: str = "update", option: str = "--watchdog-s") -> None:
        self.comm, self.timeout_s, self.rank = comm, timeout_s, rank
        # how the abort message names the program, what a beat counts, and its flag
        self.prog, self.unit, self.option = prog, unit, option
        self.last = time.monotonic()
        self.update = 0
        self.where = "starting"
        self._stop = threading.Event()
        self._thread = None
        if timeout_s > 0:
            self._thread = threading.Thread(target=self._watch, name="mpirl-watchdog",
                                            daemon=True)
            self._thread.start()

    def beat(self, update: int, where: str = "") -> None:
        """An update is done: the clock restarts."""
        self.last = time.monotonic()
        self.update = update
        self.where = where
        sentinel.publish(update, where)

    def at(self, where: str) -> None:
        """Say what this rank is doing now (shown if it stalls there); the clock runs on."""
        self.where = where
        sentinel.publish(self.update, where)

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        period = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(period):
            stalled = time.monotonic() - self.last
            if stalled > self.timeout_s:
                from .launch import abort_job

                abort_job(self.comm, f"{self.prog}: error: rank {self.rank} made no progress "
                          f"for {stalled:.0f} s after {self.unit} {self.update}, "
                          f"{self.where or 'outside the training loop'} ({self.option} "
                          f"{self.timeout_s:g}); ending the job", 4)


class StopRequested(RuntimeError):
    """SIGTERM or SIGINT arrived; the run checkpointed and stopped at ``update``."""

    def __init__(self, update: int, run_dir) -> None:
        super().__init__(f"stopped by a signal after update {update}; checkpoint written: "
                         f"continue with  python -m mpirl.run --resume {run_dir}")
        self.update = update


class StopFlag:
    """Catches SIGTERM (Slurm's time limit, kill) and SIGINT (Ctrl-C) on this rank; the
    training loop asks :meth:`agreed` at each rollout boundary, so all ranks stop at the
    same update even if the signal reached them at different moments."""

    def __init__(self) -> None:
        import signal

        self.requested = 0
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = 1

    def agreed(self, comm) -> bool:
        """True on every rank when any rank was signalled (collective)."""
        from mpi4py import MPI

        return bool(comm.allreduce(self.requested, op=MPI.MAX))

    def restore(self) -> None:
        import signal

        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
