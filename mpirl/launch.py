"""How the project starts ``mpiexec``: the command line and the environment it needs.

Tests, benchmarks and experiment scripts build their ``mpiexec`` line here, so settings
for MPI live in one place.  Users launching ``mpirun`` by hand get the same treatment:
``python -m mpirl.run`` and ``python -m mpirl.bench`` call :func:`apply_mpi_defaults`
before MPI starts, in every rank.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

#: MPICH control variables set (unless the user already set them) for every launch.
#:
#: At mpi4py's default thread level (MPI_THREAD_MULTIPLE) a rank waiting in MPICH
#: already yields its core, and no polling knob made oversubscribed runs materially
#: faster; a lower thread level made MPICH's shared-memory collectives spin and hang.
#: So the thread level is pinned to "multiple" (:func:`apply_mpi_defaults`), and the
#: progress throttle (usleep(1) after a poll that made no progress) is set as a guard
#: for users who lower it anyway.  The measurements: docs/benchmarks.md.
MPICH_DEFAULTS: dict[str, str] = {
    "MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1",
    "MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT": "1",
}

#: OpenMP's setting for torch's intra-op threads, set with :data:`MPICH_DEFAULTS` (unless
#: the user set it), before torch loads: a thread that has done its share sleeps instead
#: of spinning for the others.  Spinning threads lose their core to any other busy
#: process: a 1-rank sync run of 1,600 CartPole steps (2 threads on 2 cores) took 55.3 s
#: beside a CI run and 4.4 s with this set, on the same loaded machine.
THREAD_DEFAULTS: dict[str, str] = {"OMP_WAIT_POLICY": "PASSIVE"}


def apply_mpi_defaults(environ: dict | None = None) -> dict:
    """Set :data:`MPICH_DEFAULTS` and :data:`THREAD_DEFAULTS` in ``environ`` (default
    ``os.environ``) where unset.

    Called for this process (``environ`` None), it also pins mpi4py's thread level to
    MPI_THREAD_MULTIPLE; it must run before ``from mpi4py import MPI``."""
    env = os.environ if environ is None else environ
    for key, value in {**MPICH_DEFAULTS, **THREAD_DEFAULTS}.items():
        env.setdefault(key, value)
    if environ is None:
        import mpi4py
        mpi4py.rc.thread_level = "multiple"
    return env


def mpi_library() -> str:
    """The MPI library's version line (Open MPI pads its string with NULs: removed)."""
    from mpi4py import MPI

    return MPI.Get_library_version().replace("\0", "").strip().splitlines()[0].strip()


def process_start_unix() -> float | None:
    """When this process started (Unix seconds, to about 10 ms), from /proc: its start in
    clock ticks since boot against the time since boot now (None where there is none)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])   # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def cpu_count() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def on_emulated_cluster() -> bool:
    """True in a job launched by ``python -m mpirl.cluster`` (``MPIRL_CLUSTER`` set): its
    nodes are network namespaces of one machine, so every rank shares that machine's
    cores whatever node it is on."""
    return bool(os.environ.get("MPIRL_CLUSTER"))


def mpiexec_path() -> str:
    """The ``mpiexec`` next to this Python (the venv's MPICH), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError(
            "no mpiexec found: install the project (pip install -e .) to get MPICH's, "
            "or put your MPI's bin directory on PATH")
    return found


def mpiexec_command(nranks: int, argv: list[str]) -> list[str]:
    """``mpiexec -n NRANKS ARGV...`` for this machine's MPI."""
    if nranks < 1:
        raise ValueError(f"nranks={nranks}; allowed: >= 1")
    return [mpiexec_path(), "-n", str(nranks), *argv]


def end_process(proc, grace_s: float) -> None:
    """SIGTERM ``proc`` (a ``subprocess.Popen``), then SIGKILL if it outlives ``grace_s``;
    returns once it has ended."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_job(job, grace_s: float) -> bool:
    """Stop a running ``mpiexec`` (a ``subprocess.Popen`` started in its own session) as a
    batch system's time limit does: SIGTERM, which mpiexec forwards to every rank; if it
    has not ended ``grace_s`` later, SIGKILL to its whole process group.  True when it
    ended within the grace."""
    import signal
    import subprocess

    job.send_signal(signal.SIGTERM)
    try:
        job.wait(timeout=grace_s)
        return True
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        return False


def run_for(cmd: list[str], seconds: float, cwd=None, grace_s: float = 300.0,
            stdout=None) -> bool:
    """Run ``cmd`` (an ``mpiexec`` line) for at most ``seconds``, then stop it as a batch
    system's time limit does: SIGTERM to mpiexec, which forwards it to every rank, and
    every rank ends at its next boundary with its logs closed.  Returns True when the
    limit stopped it, False when it ended by itself first; raises RuntimeError when it
    failed (its exit status) or outlived ``grace_s`` after the SIGTERM (then its whole
    process group, mpiexec and every rank, is killed).  Interrupted (Ctrl-C), it stops
    the job the same way before the interrupt goes on.  ``stdout``: where its output
    goes (default: discarded)."""
    import subprocess

    job = subprocess.Popen(cmd, cwd=cwd, env=mpi_env(), start_new_session=True,
                           stdout=subprocess.DEVNULL if stdout is None else stdout,
                           stderr=subprocess.STDOUT if stdout is not None else None)

    def stop() -> None:
        if not stop_job(job, grace_s):
            raise RuntimeError(f"no exit within {grace_s:g} s of SIGTERM (killed): "
                               f"{' '.join(cmd)}")

    try:
        code = job.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        stop()
        return True
    except BaseException:
        stop()
        raise
    if code:
        raise RuntimeError(f"exit status {code} before the time limit: {' '.join(cmd)}")
    return False


#: Open MPI 5's mpiexec options that let ranks survive a failure (ULFM), as measured on
#: PyPI's Open MPI 5.0.11: without the failure detector, survivors blocked on a dead
#: peer wait forever (> 40 s seen); with it they get an error after about the timeout.
#: The detector runs in its own thread: from the main thread, a rank busy in Python
#: (importing torch on an oversubscribed node) missed its heartbeats and was declared
#: dead while alive (Open MPI then aborts it: "the failure detector made a mistake");
#: a 2 s timeout still misfired once at start-up with the node loaded 6x over, hence 4 s.
OPENMPI_ULFM_ARGS = ("--with-ft", "ulfm", "--mca", "mpi_ft_detector", "true",
                     "--mca", "mpi_ft_detector_thread", "true",
                     "--mca", "mpi_ft_detector_period", "1",
                     "--mca", "mpi_ft_detector_timeout", "4")


def fault_tolerant_launch() -> bool:
    """Open MPI's launcher started this process with fault tolerance (``--with-ft ulfm``)."""
    return os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "true")


def openmpi_ulfm_command(venv: str, nranks: int, argv: list[str]) -> list[str]:
    """``mpiexec`` of the Open MPI environment ``venv`` (``make ulfm-env``), fault
    tolerance on, oversubscription allowed; ``argv`` runs under that venv's Python."""
    if nranks < 1:
        raise ValueError(f"nranks={nranks}; allowed: >= 1")
    root = ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    return [os.path.join(venv, "bin", "mpiexec"), *root, "--oversubscribe",
            *OPENMPI_ULFM_ARGS, "-n", str(nranks), os.path.join(venv, "bin", "python"), *argv]


def mpi_env(extra: dict | None = None) -> dict:
    """A copy of the environment with the MPI defaults applied and ``extra`` on top."""
    env = apply_mpi_defaults(dict(os.environ))
    env.update(extra or {})
    return env


def abort_job(comm, message: str, code: int = 1) -> None:
    """Print ``message`` to stderr and end the whole MPI job with ``code``; never returns.

    The short pause lets the launcher forward the message before MPI_Abort tears every
    rank down (without it the line was sometimes lost), and ``os._exit`` follows
    because MPICH's MPI_Abort can return to the caller before the launcher kills it."""
    import time

    from .resilience import sentinel

    sentinel.reported()          # this rank speaks for itself: no death report for the job
    print(message, file=sys.stderr, flush=True)
    time.sleep(0.5)
    if fault_tolerant_launch():
        # Open MPI with fault tolerance (ULFM): every rank that sees the failure leaves by
        # itself (the communicator is revoked, so none stays blocked); MPI_Abort there
        # left Open MPI 5.0.11's launcher waiting forever after a peer's SIGKILL.
        os._exit(code)
    comm.Abort(code)
    os._exit(code)
