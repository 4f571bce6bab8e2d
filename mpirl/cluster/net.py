"""The emulated cluster's network: nodes as Linux network namespaces on one bridge.

Layout (all of it inside the cluster's own namespaces; nothing is attached to the
machine's own namespace, so no address of it changes)::

    <name>-switch          a namespace holding the bridge ``br0`` and one veth end
                           ``v<i>`` per node (the switch's port)
    <name>-node<i>         node i: loopback and a veth ``eth0`` (the node's NIC) on the
                           bridge, address <subnet>.<i+1>/24, hostname ``node<i>`` for
                           the processes the launcher starts there
    <name>-login           the login node, <subnet>.254: where ``mpiexec``, slurmctld
                           and Slurm's clients run, so that killing or cutting off a
                           compute node never takes the launcher with it

A link cap is a token-bucket filter (tc ``tbf``) on both ends of a node's link: egress of
the node's ``eth0`` caps what it sends, egress of the switch's ``v<i>`` what it
receives, so a node's link carries at most RATE each way, as a full-duplex NIC does.
There is no ``netem`` on these machines: latency, jitter and loss cannot be added, only
bandwidth capped.

The cluster's description lives in ``/run/<name>-cluster/cluster.json`` (tmpfs: gone at
reboot, as the namespaces are), with the hydra/PRRTE launch agent and the Slurm files.
:mod:`.lifecycle` builds and removes the cluster out of the pieces here; its
:func:`~.lifecycle.down` finds everything by name (namespaces ``<name>-*``, the state
directory, daemons in those namespaces), not only through that file, so a crashed
:func:`~.lifecycle.up` leaves nothing behind after it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: the cluster's name when none is given (``--name`` or ``MPIRL_CLUSTER_NAME``)
DEFAULT_NAME = "mpirl"
#: a private /24 used only inside the cluster's own namespaces
DEFAULT_SUBNET = "10.231.0.0/24"
#: the login node's host number in the subnet
LOGIN_HOST = 254
STATE_ROOT = Path(os.environ.get("MPIRL_CLUSTER_STATE_ROOT", "/run"))
RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(kbit|mbit|gbit)$")
RATE_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,11}$")


class ClusterError(Exception):
    """A one-line reason the cluster tool cannot do what was asked."""


@dataclass
class Cluster:
    """What ``up`` made: enough to launch on it, show it and take it down."""
    name: str
    nodes: int
    rate: str                    # "off" or tc's spelling, e.g. "100mbit"
    subnet: str
    slurm: bool = False
    created_unix_s: float = field(default_factory=time.time)

    @property
    def state_dir(self) -> Path:
        return state_dir(self.name)

    @property
    def switch(self) -> str:
        return f"{self.name}-switch"

    def hosts(self) -> list[str]:
        return [f"node{i}" for i in range(self.nodes)]

    def namespace(self, host: str) -> str:
        return f"{self.name}-{host}"

    def address(self, i: int) -> str:
        return str(ipaddress.ip_network(self.subnet)[i + 1])

    @property
    def login(self) -> str:
        return f"{self.name}-login"

    @property
    def login_address(self) -> str:
        return str(ipaddress.ip_network(self.subnet)[LOGIN_HOST])

    def describe(self) -> dict:
        """What a run records of where it ran (``cluster_json`` of run.h5)."""
        return {"name": self.name, "nodes": self.hosts(), "rate": self.rate,
                "subnet": self.subnet,
                "bucket_bytes": 0 if self.rate == "off" else tbf_bucket_bytes(self.rate)}


def state_dir(name: str) -> Path:
    return STATE_ROOT / f"{name}-cluster"


def bits_per_s(rate: str) -> float | None:
    """``"100mbit"`` -> 1e8; ``"off"`` -> None."""
    if rate == "off":
        return None
    m = RATE_RE.match(rate)
    return float(m.group(1)) * RATE_UNITS[m.group(2)]


def spell_rate(bits: float) -> str:
    """1e9 -> "1gbit", 1e8 -> "100mbit" (tc's units)."""
    for unit in ("gbit", "mbit", "kbit"):
        if bits >= RATE_UNITS[unit]:
            return f"{bits / RATE_UNITS[unit]:g}{unit}"
    return f"{bits:g}bit"


def check_rate(rate: str) -> str:
    rate = rate.strip().lower()
    if rate in ("off", "none", "0"):
        return "off"
    m = RATE_RE.match(rate)
    if not m or float(m.group(1)) <= 0:
        raise ClusterError(f"--rate {rate!r}; allowed: off, or a positive number with kbit, "
                           "mbit or gbit (e.g. 100mbit, 1gbit)")
    return rate


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise ClusterError(f"--name {name!r}; allowed: a lower-case letter then up to 11 "
                           "letters or digits (namespace names are <name>-node<i>)")
    return name


# -- commands ----------------------------------------------------------------------------
def sh(*argv: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run one command (no shell), its output captured; a failure raises ClusterError
    with the command and its first line of error."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"`{' '.join(argv)}` did not finish within {timeout:g} s") from None
    if check and done.returncode != 0:
        err = (done.stderr or done.stdout).strip().splitlines()
        raise ClusterError(f"`{' '.join(argv)}` failed: {err[0] if err else done.returncode}")
    return done


def in_ns(ns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return sh("ip", "netns", "exec", ns, *argv, check=check)


def namespaces(name: str) -> list[str]:
    """The namespaces of cluster ``name`` that exist now."""
    out = sh("ip", "netns", "list", check=False).stdout
    found = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [ns for ns in found
            if ns in (f"{name}-switch", f"{name}-login") or re.fullmatch(rf"{name}-node\d+", ns)]


def load(name: str) -> Cluster:
    """The cluster ``name`` as ``up`` described it; ClusterError when it is not up."""
    path = state_dir(name) / "cluster.json"
    try:
        spec = Cluster(**json.loads(path.read_text()))
    except FileNotFoundError:
        raise ClusterError(f"cluster {name!r} is not up (no {path}); start it with "
                           f"python -m mpirl.cluster up --nodes K") from None
    missing = [ns for ns in [spec.switch, spec.login, *map(spec.namespace, spec.hosts())]
               if ns not in namespaces(name)]
    if missing:
        raise ClusterError(f"cluster {name!r} is broken: namespace(s) {', '.join(missing)} "
                           "are gone; run python -m mpirl.cluster down, then up")
    return spec


# -- link caps ---------------------------------------------------------------------------
#: the token bucket holds 1 ms of traffic at the cap (at least 32 KiB).  Measured on
#: 2 cores, 4 nodes at 1 Gbit/s, 1 MiB allreduce: a 128 KiB bucket gives the cap's rate
#: (ring 12.9 ms, bandwidth term 12.6 ms); 64, 32 and 16 KiB buckets fall to 2.1, 3.0 and
#: 3.9x slower.  The price: after an idle spell up to one bucket leaves at the veth's own
#: speed (one-way probe, 1 Gbit/s: 64 and 128 KiB in 0.44x and 0.25x their time at the
#: cap; back to back 1.03-1.04x).  Smaller GSO packets make a small bucket faithful on
#: one link (8 KiB packets, 16 KiB bucket: 1.03-1.07x either way) but their per-packet
#: work halves the rate once 4 or 8 nodes send at once (ring 4 MiB: 93 and 253 ms
#: against 55 and 65), and a peak rate (tbf peakrate) did worse: the cost model carries
#: the bucket instead (mpirl.study.costmodel.link_bytes).
TBF_BUCKET_S = 1e-3
TBF_MIN_BUCKET = 32 * 1024
#: bytes a capped link carries per byte of MPI payload: tbf counts each frame's
#: Ethernet, IPv4 and TCP headers (14 + 20 + 32 with timestamps) against the cap, so a
#: 1 Gbit/s link carries 0.956 Gbit/s of payload, as a real NIC does at MTU 1500
WIRE_PER_PAYLOAD_BYTE = (1500 + 14) / (1500 - 20 - 32)


def tbf_bucket_bytes(rate: str) -> int:
    """The token bucket of a link capped at ``rate``: :data:`TBF_BUCKET_S` of traffic."""
    return max(TBF_MIN_BUCKET, int(bits_per_s(rate) / 8 * TBF_BUCKET_S))


def payload_s_per_byte(rate: str) -> float:
    """Seconds a byte of MPI payload takes through a link capped at ``rate`` (the cost
    model's beta there), headers included."""
    return 8 / bits_per_s(rate) * WIRE_PER_PAYLOAD_BYTE


def tbf_args(rate: str) -> list[str]:
    """tc's tbf for ``rate``: a bucket of :func:`tbf_bucket_bytes`, at most 50 ms of
    queue."""
    return ["tbf", "rate", rate, "burst", str(tbf_bucket_bytes(rate)), "latency", "50ms"]


def set_rate(spec: Cluster, rate: str) -> None:
    """Cap every node's link at ``rate`` each way (``off``: remove the caps)."""
    rate = check_rate(rate)
    for i, host in enumerate(spec.hosts()):
        for ns, dev in ((spec.namespace(host), "eth0"), (spec.switch, f"v{i}")):
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root",
               check=False)
            if rate != "off":
                in_ns(ns, "tc", "qdisc", "add", "dev", dev, "root", *tbf_args(rate))
    spec.rate = rate
    save(spec)


def save(spec: Cluster) -> None:
    spec.state_dir.mkdir(parents=True, exist_ok=True)
    tmp = spec.state_dir / "cluster.json.tmp"
    tmp.write_text(json.dumps(asdict(spec), indent=1))
    tmp.replace(spec.state_dir / "cluster.json")


# -- processes ---------------------------------------------------------------------------
def pids_in(ns: str) -> list[int]:
    out = sh("ip", "netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def kill_namespace(ns: str, sig: int = signal.SIGKILL, wait_s: float = 5.0) -> list[int]:
    """Send ``sig`` to every process in ``ns``; wait up to ``wait_s`` for them to go.
    Returns the pids signalled."""
    pids = pids_in(ns)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while pids_in(ns) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


# -- links -------------------------------------------------------------------------------
def link_bytes(spec: Cluster) -> dict[str, dict[str, int]]:
    """Bytes through each node's link since ``up``: ``sent`` (node -> switch) and
    ``received`` (switch -> node), read at the switch's port."""
    out = in_ns(spec.switch, "ip", "-j", "-s", "link", "show").stdout
    ports = {e["ifname"]: e["stats64"] for e in json.loads(out) if "stats64" in e}
    result = {}
    for i, host in enumerate(spec.hosts()):
        stats = ports.get(f"v{i}", {"rx": {"bytes": 0}, "tx": {"bytes": 0}})
        result[host] = {"sent": int(stats["rx"]["bytes"]), "received": int(stats["tx"]["bytes"])}
    return result


def link_state(spec: Cluster) -> dict[str, str]:
    """``up`` or ``down`` for each node's link (a cut link is down at the switch)."""
    out = in_ns(spec.switch, "ip", "-j", "link", "show").stdout
    flags = {e["ifname"]: e.get("flags", []) for e in json.loads(out)}
    return {host: "up" if "UP" in flags.get(f"v{i}", []) else "down"
            for i, host in enumerate(spec.hosts())}


# -- faults ------------------------------------------------------------------------------
def cut(spec: Cluster, host: str, restore: bool = False) -> None:
    """Take node ``host``'s link down at the switch (``restore``: up again)."""
    i = node_index(spec, host)
    in_ns(spec.switch, "ip", "link", "set", f"v{i}", "up" if restore else "down")


#: the MPI runtimes' daemons on each node: Open MPI's PRRTE and MPICH's hydra
RUNTIME_DAEMONS = ("prted", "hydra_pmi_proxy")
#: the cluster's own daemons (its Slurm), which no job started or ends
SLURM_DAEMONS = ("slurmctld", "slurmd", "slurmstepd", "munged")


def kill_node(spec: Cluster, host: str, keep_runtime: bool = False) -> list[int]:
    """SIGKILL every process on node ``host`` (a node that lost power).

    ``keep_runtime``: only what the MPI runtime's daemon there started (the node's ranks
    and their children); the daemon lives.  That is a whole node's loss as MPI sees it,
    on a runtime that survives losing a daemon: Open MPI 5.0's PRRTE ends the job when
    a daemon goes (docs/cluster.md)."""
    node_index(spec, host)
    ns = spec.namespace(host)
    if not keep_runtime:
        return kill_namespace(ns)
    doomed = rank_processes(pids_in(ns))
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return sorted(doomed)


def off_marker(spec: Cluster, host: str) -> Path:
    """The file that says node ``host`` is powered off (the launch agent refuses it)."""
    return spec.state_dir / "off" / host


def power_off(spec: Cluster, host: str) -> list[int]:
    """Node ``host`` loses power and stays off until :func:`power_on`: marked off first
    (no job can start there from then on: the launch agent refuses it, as ssh fails to
    a dead host), then every process on it SIGKILLed."""
    node_index(spec, host)
    off_marker(spec, host).parent.mkdir(parents=True, exist_ok=True)
    off_marker(spec, host).touch()
    return kill_namespace(spec.namespace(host))


def power_on(spec: Cluster, host: str) -> None:
    """Node ``host`` is back (booted, empty): jobs may start there again."""
    node_index(spec, host)
    off_marker(spec, host).unlink(missing_ok=True)


def live_hosts(spec: Cluster) -> list[str]:
    """The nodes a job can run on now, in order: powered on, with their link up (what a
    cluster's health check or a host discovery script reports)."""
    links = link_state(spec)
    return [h for h in spec.hosts()
            if links[h] == "up" and not off_marker(spec, h).exists()]


def rank_processes(pids: list[int]) -> set[int]:
    """Of ``pids`` (one node's processes), the ranks' side: the ranks and what they
    started (sentinels too, whoever their parent is now); not an MPI runtime daemon, not
    the launch agent's shell that started one, not the cluster's Slurm."""
    parent = {pid: _ppid(pid) for pid in pids}
    names = {pid: process_name(pid) for pid in pids}
    runtime = {pid for pid in pids if names[pid] in RUNTIME_DAEMONS}
    launchers: set[int] = set()
    for pid in runtime:             # the daemon's ancestors on this node: the agent's shell
        up = parent[pid]
        while up in parent and up not in launchers:
            launchers.add(up)
            up = parent[up]
    return {pid for pid in pids if names[pid] and names[pid] not in SLURM_DAEMONS
            and pid not in runtime and pid not in launchers}


def process_name(pid: int | str) -> str:
    """A process's name (``/proc/PID/comm``); "" once it has gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _ppid(pid: int) -> int:
    try:            # /proc/PID/stat: "pid (comm) state ppid ...", comm may hold spaces
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def node_index(spec: Cluster, host: str) -> int:
    if host not in spec.hosts():
        raise ClusterError(f"no node {host!r}; allowed: {', '.join(spec.hosts())}")
    return spec.hosts().index(host)
