"""Run a program under a real ``mpiexec`` from a test, with a hard time cap.

A deadlock must fail the test, never hang CI: the job runs in its own process group,
and when the cap passes the whole group (mpiexec, its proxies and every rank) is
killed and the test fails with the tail of what the ranks printed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from mpirl.launch import mpi_env, mpiexec_command

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class MPIResult:
    returncode: int
    output: str

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


def run_mpi(nranks: int, argv: list[str], *, timeout_s: float = 120, env: dict | None = None,
            cwd: Path = ROOT, check: bool = True) -> MPIResult:
    """Run ``mpiexec -n nranks <python> argv...``; fail on timeout, and on error if ``check``."""
    cmd = mpiexec_command(nranks, [sys.executable, *argv])
    full_env = mpi_env({"PYTHONPATH": str(ROOT), **(env or {})})
    proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"mpiexec -n {nranks} {' '.join(argv)} did not finish within {timeout_s:.0f} s "
                    f"(deadlock?); last output:\n{out[-4000:]}", pytrace=False)
    result = MPIResult(proc.returncode, out)
    if check and proc.returncode != 0:
        pytest.fail(f"mpiexec -n {nranks} {' '.join(argv)} exited {proc.returncode}:\n"
                    f"{result.tail()}", pytrace=False)
    return result
