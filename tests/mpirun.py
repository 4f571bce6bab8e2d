"""Start every job a test launches under a real ``mpiexec``, with a hard time cap.

A deadlock must fail the test, never hang CI: each job runs in its own session (its own
process group), and when its cap passes the whole group (mpiexec, its proxies and every
rank) is killed and the test fails with the tail of what the ranks printed.

* :func:`run_mpi` runs a job to its end and returns it (``.returncode``, ``.output``);
* :func:`start_mpi` starts one and returns the running :class:`MPIJob`, for a test that
  watches it, signals it or kills some of its ranks before :meth:`MPIJob.wait`.

``command`` gives the full launcher line instead of ``mpiexec -n N python ARGV``: Open
MPI's (``mpirl.launch.openmpi_ulfm_command``), an MPMD ``mpiexec ... : ...`` line, or a
program that launches mpiexec itself (``python -m mpirl.sweep``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mpirl.launch import mpi_env, mpiexec_command

ROOT = Path(__file__).resolve().parents[1]


class MPIJob:
    """A job started by :func:`start_mpi`; as a context manager it kills the job's process
    group on leaving if the job is still running (a test that failed half-way)."""

    def __init__(self, cmd: list[str], label: str, *, env: dict, cwd: Path):
        self.label = label
        # Output goes to an unlinked file, not a pipe: a job that prints a lot while the
        # test only polls it never blocks on a full pipe, and .output can be read at any
        # time.  The test reads through its own file description (no shared offset).
        fd, path = tempfile.mkstemp(prefix="mpirl-test-", suffix=".out")
        try:
            self._reader = open(path, "rb")    # closed once the job has ended
            os.unlink(path)
            self._proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                          stdout=fd, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        finally:
            os.close(fd)
        self._final: str | None = None

    # -- the process ------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        """mpiexec's pid, which is also the id of the job's process group."""
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """mpiexec's exit status (negative: the signal that ended it); None while running."""
        return self._proc.returncode

    def poll(self) -> int | None:
        """The exit status if mpiexec has ended, else None."""
        return self._proc.poll()

    def wait(self, timeout_s: float = 120, what: str | None = None) -> int:
        """Wait for mpiexec to end and return its exit status.  Past ``timeout_s``, kill the
        whole process group and fail the test with ``what`` (default: the command did not
        finish) and the tail of the output."""
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            self._proc.wait()
            why = what or f"{self.label} did not finish within {timeout_s:.0f} s (deadlock?)"
            pytest.fail(f"{why}; last output:\n{self.tail()[-4000:]}", pytrace=False)
        return self._proc.returncode

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the whole process group: mpiexec, its proxies and every rank."""
        try:
            os.killpg(self._proc.pid, sig)
        except ProcessLookupError:            # every process of the group has ended
            pass

    def signal(self, sig: int) -> None:
        """Send ``sig`` to mpiexec alone (MPICH's forwards SIGTERM, SIGINT... to the ranks)."""
        if self._proc.poll() is None:
            self._proc.send_signal(sig)

    def reached(self, run_dir: Path, rank: int, update: int, timeout_s: float = 120) -> dict:
        """Wait until ``rank`` reports ``update`` in its sentinel status file (what a test
        waits for before it kills or signals that rank) and return that status; fail the
        test if the job ends first or ``timeout_s`` passes (killing the job)."""
        import time

        from mpirl.resilience.sentinel import read_status, status_dir

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = read_status(status_dir(run_dir) / f"rank{rank:04d}")
            if status and status["update"] >= update:
                return status
            if self.poll() is not None:
                pytest.fail(f"the run ended before rank {rank} reached update {update}:\n"
                            f"{self.tail()}", pytrace=False)
            time.sleep(0.05)
        self.kill()
        self._proc.wait()
        pytest.fail(f"rank {rank} did not reach update {update} within {timeout_s:.0f} s:\n"
                    f"{self.tail()}", pytrace=False)

    # -- what it printed ------------------------------------------------------------------------
    @property
    def output(self) -> str:
        """stdout and stderr of the job together: all of it once it ended, else so far."""
        if self._final is not None:
            return self._final
        self._reader.seek(0)
        text = self._reader.read().decode(errors="replace")
        if self._proc.poll() is not None:     # mpiexec has ended: nothing more can come
            self._final = text
            self._reader.close()
        return text

    def tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of :attr:`output`."""
        return "\n".join(self.output.splitlines()[-lines:])

    # -- a test that fails half-way leaves no job behind ----------------------------------------
    def __enter__(self) -> MPIJob:
        return self

    def __exit__(self, *exc) -> None:
        if self._proc.poll() is None:
            self.kill()
            self._proc.wait()

    def __repr__(self) -> str:
        return f"<MPIJob pid={self.pid} returncode={self.returncode} {self.label!r}>"


def start_mpi(nranks: int, argv: list[str], *, env: dict | None = None, cwd: Path = ROOT,
              command: list[str] | None = None) -> MPIJob:
    """Start ``mpiexec -n nranks <this python> argv...`` (or ``command``, the full launcher
    line, in which case ``nranks`` and ``argv`` only name the job in failure messages) in
    its own session, with stdout and stderr captured together; ``env`` is added to the
    MPI defaults (:func:`mpirl.launch.mpi_env`) and ``PYTHONPATH`` pointing at the
    checkout."""
    cmd = command if command is not None else mpiexec_command(nranks, [sys.executable, *argv])
    label = " ".join(command) if command is not None else \
        f"mpiexec -n {nranks} {' '.join(argv)}"
    full_env = mpi_env({"PYTHONPATH": str(ROOT), **(env or {})})
    return MPIJob(cmd, label, env=full_env, cwd=cwd)


def run_mpi(nranks: int, argv: list[str], *, timeout_s: float = 120, env: dict | None = None,
            cwd: Path = ROOT, check: bool = True, command: list[str] | None = None) -> MPIJob:
    """Run a job to its end (:func:`start_mpi`'s arguments); fail the test if it runs past
    ``timeout_s``, and if ``check``, if it exits non-zero.  Returns the ended job."""
    job = start_mpi(nranks, argv, env=env, cwd=cwd, command=command)
    job.wait(timeout_s)
    if check and job.returncode != 0:
        pytest.fail(f"{job.label} exited {job.returncode}:\n{job.tail()}", pytrace=False)
    return job
