"""Stopping on a signal: SIGTERM (Slurm's time limit, kill) or SIGINT (Ctrl-C) on any
rank stops every rank at the same update, with a checkpoint (exit status 128 + the
signal this rank received: 130 after Ctrl-C, 143 after SIGTERM, as shells report them)."""

from __future__ import annotations

import threading


#: the signal this process received (0: none); with several, the last
_received = 0


def received() -> int:
    """The number of the stop signal this process received (0: none)."""
    return _received


class StopRequested(RuntimeError):
    """SIGTERM or SIGINT arrived; the run checkpointed and stopped at ``update``."""

    def __init__(self, update: int, run_dir, ranks: int) -> None:
        super().__init__(f"stopped by a signal after update {update}; checkpoint written: "
                         f"continue with  mpirun -np {ranks} python -m mpirl.run --resume "
                         f"{run_dir}")
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
        global _received
        _received = signum
        self.requested = 1

    def agreed(self, comm) -> bool:
        """True on every rank when any rank was signalled (collective)."""
        from mpi4py import MPI

        return bool(comm.allreduce(self.requested, op=MPI.MAX))

    def restore(self) -> None:
        import signal

        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
