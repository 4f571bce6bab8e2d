"""The elastic driver: relaunch a job on the nodes that are left (the Horovod Elastic
pattern; the ranks' side is :mod:`mpirl.resilience.elastic`).

    python -m mpirl.elastic [--ranks-per-node M] [--min-nodes K] [--max-restarts R]
                            [--timeout S] -- python -m mpirl.run --commit-every 10 ...

run inside a Slurm allocation (``experiments/slurm/elastic.sbatch``, submitted with
``--no-kill`` so that Slurm keeps the allocation when a node fails).  The emulated
cluster's driver is ``python -m mpirl.cluster exec --elastic``; both run :func:`drive`.

:func:`drive` launches attempt 0 on every live node, M ranks on each, with
``MPIRL_ELASTIC_JOB`` and ``MPIRL_ELASTIC_ATTEMPT`` set; when the job ends and one of its
nodes is no longer live, it drops what that node held in memory and launches the next
attempt on the nodes left (whose ranks continue from the newest commit); when a node
comes back while a smaller attempt runs, it stops that attempt with SIGTERM (every rank
stops at its next rollout and commits) and relaunches on every live node (under Slurm
the node first joins the allocation again: see :class:`Slurm`).  A job that fails while
all its nodes are up failed on its own (a bug, bad input): its exit status is passed on
and nothing is relaunched.

A backend says which nodes are live, starts one attempt, and stops one: :class:`Slurm`
here, :class:`mpirl.cluster.elastic.Emulated` for the emulated cluster.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from .launch import end_process
from .resilience.elastic import ATTEMPT_VAR, JOB_VAR, commit_root, host_dir, job_dir


class ElasticError(Exception):
    """A one-line reason an elastic job cannot start."""


class Backend(Protocol):
    def live(self, hosts: list[str] | None = None) -> list[str]:
        """The nodes a job can run on now, in order (of ``hosts`` when given)."""

    def back(self, running: list[str]) -> list[str]:
        """While an attempt runs on ``running``: the other nodes that can take ranks now
        (a node that came back); asked every poll, so the backend paces its own checks."""

    def start(self, hosts: list[str], per_node: int, command: list[str],
              env: dict) -> subprocess.Popen: ...

    def kill(self, proc: subprocess.Popen) -> None: ...

    def report(self, hosts: list[str], per_node: int) -> list[str]:
        """After an attempt: lines on which node died first, if it failed (maybe none)."""


def _client(*argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """A Slurm client command run from inside the job, without the job's own SLURM_*
    settings (salloc and srun read some of them as options; the job and its nodes are
    named on the command line), SLURM_CONF kept; in the temporary directory (a resize
    writes ``slurm_job_*_resize.sh`` where it runs).  A command that does not answer
    within ``timeout`` (slurmctld busy with a failure) returns 124 and says so."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SALLOC_", "SBATCH_")) or k == "SLURM_CONF"}
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=tempfile.gettempdir())
    except (subprocess.TimeoutExpired, OSError) as err:
        why = f"no answer in {timeout:g} s" if isinstance(err, subprocess.TimeoutExpired) \
            else str(err)
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]}: {why}")


def say(line: str) -> None:
    print(f"mpirl.elastic: {line}", file=sys.stderr, flush=True)


def drive(backend: Backend, per_node: int, max_nodes: int, command: list[str], *,
          min_nodes: int = 1, max_restarts: int = 10, timeout_s: float | None = None,
          job: str = "", poll_s: float = 0.5) -> int:
    """Run ``command`` elastically; its exit status (124 past ``timeout_s``)."""
    if per_node < 1 or not 1 <= min_nodes <= max_nodes:
        raise ElasticError(f"--min-nodes {min_nodes} with {max_nodes} nodes at most; "
                           f"allowed: 1 <= min-nodes <= {max_nodes}")
    if not command:
        raise ElasticError("nothing to run: give the command after --, e.g. -- python -m "
                           "mpirl.run --commit-every 10")
    job = job or f"elastic-{time.strftime('%Y%m%d-%H%M%S')}"
    deadline = time.monotonic() + timeout_s if timeout_s else None
    root = commit_root()
    for attempt in range(max_restarts + 1):
        hosts = backend.live()[:max_nodes]
        if len(hosts) < min_nodes:
            say(f"{len(hosts)} live node{'s' * (len(hosts) != 1)} "
                f"({', '.join(hosts) or 'none'}); --min-nodes {min_nodes}: giving up "
                f"(commits kept in {job_dir(job, root)})")
            return 1
        code, stopped = _attempt(backend, job, attempt, hosts, per_node, max_nodes, command,
                                 deadline, poll_s)
        if code in (0, 124):
            if code == 0:
                shutil.rmtree(job_dir(job, root), ignore_errors=True)
                say(f"job {job} done after {attempt + 1} attempt{'s' * (attempt > 0)}")
            return code
        lost = [h for h in hosts if h not in backend.live(hosts)]
        for host in lost:       # its memory went with it (a no-op on a real cluster)
            shutil.rmtree(host_dir(job, host, root), ignore_errors=True)
        if lost:
            say(f"attempt {attempt} ended (exit {code}): {', '.join(lost)} lost; "
                "relaunching on the nodes left from the newest commit")
        elif stopped:
            say(f"attempt {attempt} stopped at a commit; relaunching with the nodes back")
        else:
            say(f"attempt {attempt} failed (exit {code}) with all its nodes up: the job's "
                "own failure, not a node's; not relaunching")
            return code
    say(f"{max_restarts} restarts spent (--max-restarts); giving up")
    return 1


def _attempt(backend: Backend, job: str, attempt: int, hosts: list[str], per_node: int,
             max_nodes: int, command: list[str], deadline: float | None,
             poll_s: float) -> tuple[int, bool]:
    """One launch on ``hosts``: (exit status, whether the driver stopped it for a rejoin)."""
    env = {**os.environ, JOB_VAR: job, ATTEMPT_VAR: str(attempt)}
    say(f"job {job}, attempt {attempt}: {len(hosts) * per_node} ranks on {', '.join(hosts)}")
    proc = backend.start(hosts, per_node, command, env)
    stopped = False
    try:
        while proc.poll() is None:
            time.sleep(poll_s)
            if deadline is not None and time.monotonic() > deadline:
                say("time limit reached: killing the job on every node")
                backend.kill(proc)
                return 124, stopped
            if not stopped and len(hosts) < max_nodes:
                back = backend.back(hosts)
                if back:
                    say(f"{', '.join(back)} live again: stopping attempt {attempt} at its "
                        "next rollout (its ranks commit) to relaunch with "
                        f"{'them' if len(back) > 1 else 'it'}")
                    proc.send_signal(signal.SIGTERM)
                    stopped = True
    except BaseException:           # Ctrl-C, or the driver's own failure: no job left behind
        backend.kill(proc)
        raise
    lines = backend.report(hosts, per_node)
    if proc.returncode != 0 and not stopped:
        for line in lines:
            print(line, file=sys.stderr, flush=True)
    return proc.returncode, stopped


# -- Slurm -------------------------------------------------------------------------------
#: node states (scontrol's State=, '+'-joined) in which no step can run there
DEAD_STATES = {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING",
               "POWERED_DOWN", "POWERING_DOWN", "UNKNOWN"}


class Slurm:
    """The nodes of this Slurm allocation (submitted with ``--no-kill``).  A node is live
    while Slurm does not report it down and it runs a one-task probe step within
    ``probe_s``: slurmctld notices a dead node only after ``SlurmdTimeout``, the probe
    as soon as its step cannot start (a probe that times out counts as dead: the time
    from a node's death to the relaunch is about ``probe_s``).

    Slurm takes a failed node out of the allocation.  When it is back (its slurmd
    registered, the node idle), it joins again by Slurm's job expansion: a one-node
    allocation on it that depends on this job (``salloc --no-shell
    --dependency=expand:JOB``) is granted and emptied into this job (``scontrol update
    jobid=NEW NumNodes=0``, then ``jobid=JOB NumNodes=ALL``), and the node is live
    again.  The site's slurm.conf must have ``SchedulerParameters=permit_job_expansion``
    (the emulated cluster's has); without it the node stays out and the driver says
    why.  While an attempt runs, the nodes out of it are checked every ``check_s``."""

    def __init__(self, probe_s: float = 10.0, per_node: int = 1, check_s: float = 5.0,
                 grow_s: float = 30.0) -> None:
        nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
        self.job = os.environ.get("SLURM_JOB_ID", "")
        if not nodelist or not self.job:
            raise ElasticError("not inside a Slurm allocation (no SLURM_JOB_NODELIST): "
                               "submit experiments/slurm/elastic.sbatch with sbatch")
        out = _client("scontrol", "show", "hostnames", nodelist)
        self.hosts = out.stdout.split()
        if not self.hosts:
            raise ElasticError(f"scontrol show hostnames {nodelist}: {out.stderr.strip()}")
        self.probe_s, self.per_node = probe_s, per_node
        self.check_s, self.grow_s = check_s, grow_s
        #: an expansion must share the job's partition, account and QOS
        self.same = [f"--{opt}={os.environ[var]}" for opt, var in (
            ("partition", "SLURM_JOB_PARTITION"), ("account", "SLURM_JOB_ACCOUNT"),
            ("qos", "SLURM_JOB_QOS")) if os.environ.get(var)]
        self._checked = time.monotonic()
        self._refused: dict[str, float] = {}     # host -> when it last failed to join

    def members(self) -> list[str] | None:
        """The nodes in this job's allocation now (Slurm's view); None when Slurm does
        not say."""
        out = _client("scontrol", "show", "job", "-o", self.job)
        nodes = next((w.split("=", 1)[1] for w in out.stdout.split()
                      if w.startswith("NodeList=")), None)
        if out.returncode or nodes is None:
            return None
        if nodes == "(null)":
            return []
        hosts = _client("scontrol", "show", "hostnames", nodes)
        return hosts.stdout.split() if hosts.returncode == 0 else None

    def _state(self, host: str) -> set[str] | None:
        """The node's state flags (``{"IDLE"}``, ``{"ALLOCATED"}``...; a trailing ``*``,
        not responding, kept as ``"*"``), None when Slurm does not say."""
        out = _client("scontrol", "show", "node", "-o", host)
        state = next((w.split("=", 1)[1] for w in out.stdout.split()
                      if w.startswith("State=")), "")
        if out.returncode or not state:
            return None
        return {s.rstrip("*") for s in state.split("+")} | ({"*"} if "*" in state else set())

    @staticmethod
    def _state_ok(flags: set[str] | None) -> bool:
        """No step can run on a node Slurm reports down; when Slurm does not answer,
        the probe decides."""
        return flags is None or not flags & (DEAD_STATES | {"*"})

    def _probe(self, host: str) -> bool:
        return _client("srun", "--overlap", f"--jobid={self.job}", "-N1", "-n1", "-w", host,
                       "true", timeout=self.probe_s).returncode == 0

    def live(self, hosts: list[str] | None = None) -> list[str]:
        states = {h: self._state(h) for h in (self.hosts if hosts is None else hosts)}
        wanted = [h for h, flags in states.items() if self._state_ok(flags)]
        members = self.members()
        if members is not None:    # outside the allocation: an idle node may join it
            wanted = [h for h in wanted if h in members
                      or ("IDLE" in (states[h] or ()) and self._join(h))]
        with ThreadPoolExecutor(max(1, len(wanted))) as pool:
            ok = list(pool.map(self._probe, wanted))
        return [h for h, good in zip(wanted, ok, strict=True) if good]

    def back(self, running: list[str]) -> list[str]:
        if time.monotonic() - self._checked < self.check_s:
            return []
        rest = [h for h in self.hosts if h not in running]
        found = self.live(rest) if rest else []
        self._checked = time.monotonic()
        return found

    def _join(self, host: str) -> bool:
        """Bring ``host`` (idle, outside the allocation) into it by job expansion."""
        if time.monotonic() - self._refused.get(host, -math.inf) < 60:
            return False
        name = f"mpirl-join-{self.job}"
        got = _client("salloc", "--no-shell", f"--immediate={math.ceil(self.grow_s)}", "-N1",
                      f"--ntasks-per-node={self.per_node}", "-w", host, *self.same,
                      f"--dependency=expand:{self.job}", "-J", name, timeout=self.grow_s + 10)
        new = next((w for w in got.stderr.split() if w.isdigit()), "")
        steps = [got]
        if got.returncode == 0 and new:     # Slurm merges at the first; the second may fail
            steps += [_client("scontrol", "update", f"jobid={new}", "NumNodes=0"),
                      _client("scontrol", "update", f"jobid={self.job}", "NumNodes=ALL")]
        _client("scancel", "--name", name)     # empty now, or not merged: not kept
        if new and host in (self.members() or ()):
            say(f"{host} is back and joined the allocation (expansion job {new})")
            return True
        self._refused[host] = time.monotonic()
        reason = next((line for done in steps if done.returncode
                       for line in reversed(done.stderr.strip().splitlines())),
                      "its node did not merge")
        say(f"{host} is back but did not join the allocation ({reason}; Slurm's job "
            "expansion needs SchedulerParameters=permit_job_expansion); retrying in 60 s")
        return False

    def start(self, hosts: list[str], per_node: int, command: list[str],
              env: dict) -> subprocess.Popen:
        from .launch import mpiexec_path  # noqa: PLC0415

        launcher = os.environ.get("MPIRL_ELASTIC_LAUNCH", "")
        if launcher:           # a site's own: srun --mpi=pmi2 ... (given the hosts)
            argv = [*launcher.split(), "--overlap", "-N", str(len(hosts)), "-n",
                    str(len(hosts) * per_node), "-w", ",".join(hosts), *command]
        else:                  # hydra starts its proxies with srun inside the allocation
            argv = [mpiexec_path(), "-hosts", ",".join(hosts), "-ppn", str(per_node),
                    "-n", str(len(hosts) * per_node), *command]
        return subprocess.Popen(argv, env={**env, "SLURM_OVERLAP": "1"})

    def kill(self, proc: subprocess.Popen) -> None:
        end_process(proc, grace_s=10)

    def report(self, hosts: list[str], per_node: int) -> list[str]:
        return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpirl.elastic", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks-per-node", type=int,
                        default=int(os.environ.get("SLURM_NTASKS_PER_NODE", "1") or 1),
                        help="ranks on each node (default $SLURM_NTASKS_PER_NODE or 1)")
    parser.add_argument("--min-nodes", type=int, default=1,
                        help="give up below this many live nodes (default 1)")
    parser.add_argument("--max-restarts", type=int, default=10,
                        help="relaunches at most (default 10)")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="kill the job after SECONDS (exit 124)")
    parser.add_argument("--probe-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="a node whose probe step has not run after SECONDS is dead "
                             "(default 10)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND...")
    args = parser.parse_args(argv)
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    try:
        if args.probe_timeout <= 0:
            raise ElasticError(f"--probe-timeout {args.probe_timeout:g}; allowed: > 0 s")
        backend = Slurm(args.probe_timeout, args.ranks_per_node)
        return drive(backend, args.ranks_per_node, len(backend.hosts), command,
                     min_nodes=args.min_nodes, max_restarts=args.max_restarts,
                     timeout_s=args.timeout)
    except ElasticError as err:
        print(f"mpirl.elastic: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
