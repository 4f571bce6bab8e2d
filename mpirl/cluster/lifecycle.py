"""The emulated cluster's lifecycle: ``up``, ``down`` and ``status`` of the whole of it,
its network (:mod:`.net`) and its Slurm (:mod:`.slurm`) together.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import sys
import time
from pathlib import Path

from . import slurm
from .net import (DEFAULT_SUBNET, Cluster, ClusterError, check_name, check_rate, in_ns,
                  kill_namespace, link_bytes, link_state, load, namespaces, off_marker, pids_in,
                  save, set_rate, sh, spell_rate, state_dir)

MAX_NODES = 64


def check_subnet(subnet: str) -> str:
    try:
        net = ipaddress.ip_network(subnet)
    except ValueError as err:
        raise ClusterError(f"--subnet {subnet!r}: {err}; allowed: a private IPv4 /24, "
                           f"e.g. {DEFAULT_SUBNET}") from None
    if net.version != 4 or net.prefixlen != 24 or not net.is_private:
        raise ClusterError(f"--subnet {subnet}; allowed: a private IPv4 /24, "
                           f"e.g. {DEFAULT_SUBNET}")
    return str(net)


def check_can_build() -> None:
    """Root, iproute2 and tc are needed: say which is missing, in one line."""
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        raise ClusterError("the emulated cluster needs root (network namespaces, veth "
                           "links and tc qdiscs); run it as root")
    missing = [tool for tool in ("ip", "tc", "unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        raise ClusterError(f"the emulated cluster needs {', '.join(missing)} on PATH "
                           "(Debian: apt-get install iproute2 util-linux)")


# -- up ----------------------------------------------------------------------------------
def up(name: str, nodes: int, rate: str, subnet: str = DEFAULT_SUBNET) -> Cluster:
    """Create the cluster; on any failure, take down what was made and raise."""
    name, rate, subnet = check_name(name), check_rate(rate), check_subnet(subnet)
    if not 1 <= nodes <= MAX_NODES:  # (host numbers 1..64, the login node 254)
        raise ClusterError(f"--nodes {nodes}; allowed: 1 to {MAX_NODES}")
    check_can_build()
    if (state_dir(name) / "cluster.json").exists() or namespaces(name):
        raise ClusterError(f"cluster {name!r} is already up (or left over from a crash); "
                           "run python -m mpirl.cluster down first")
    spec = Cluster(name=name, nodes=nodes, rate="off", subnet=subnet)
    try:
        sh("ip", "netns", "add", spec.switch)
        in_ns(spec.switch, "ip", "link", "add", "br0", "type", "bridge")
        in_ns(spec.switch, "ip", "link", "set", "br0", "up")
        for ns, port, address in [(spec.login, "vlogin", spec.login_address),
                                  *((spec.namespace(h), f"v{i}", spec.address(i))
                                    for i, h in enumerate(spec.hosts()))]:
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth",
               "peer", "name", port, "netns", spec.switch)
            in_ns(ns, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
            in_ns(ns, "ip", "link", "set", "lo", "up")
            in_ns(ns, "ip", "link", "set", "eth0", "up")
            in_ns(spec.switch, "ip", "link", "set", port, "master", "br0")
            in_ns(spec.switch, "ip", "link", "set", port, "up")
        save(spec)
        write_agent(spec)
        if rate != "off":
            try:
                set_rate(spec, rate)
            except ClusterError as err:
                raise ClusterError(f"{err} (the link cap needs the kernel's tbf qdisc, "
                                   "module sch_tbf)") from None
    except BaseException:
        down(name)
        raise
    return spec


def write_agent(spec: Cluster) -> Path:
    """The launch agent hydra (``-launcher-exec``) and PRRTE (``plm_ssh_agent``) call
    in place of ssh: ``agent [ssh options] HOST COMMAND...`` runs COMMAND on HOST, in
    its namespace, under its own hostname (a UTS namespace: Open MPI tells nodes apart
    by hostname)."""
    hosts = " ".join(spec.hosts())
    text = f"""#!/bin/sh
# launch agent of the emulated cluster {spec.name!r} (written by python -m mpirl.cluster up)
while [ $# -gt 0 ] && [ "${{1#-}}" != "$1" ]; do
    case "$1" in -o|-p|-l|-i|-F) shift ;; esac
    shift
done
host="$1"; shift
case " {hosts} " in *" $host "*) ;; *)
    echo "mpirl cluster agent: no node $host in cluster {spec.name} (nodes: {hosts})" >&2
    exit 255 ;;
esac
if [ -e "{spec.state_dir}/off/$host" ]; then
    echo "mpirl cluster agent: node $host is powered off (python -m mpirl.cluster boot $host)" >&2
    exit 255
fi
exec ip netns exec "{spec.name}-$host" unshare --uts -- \\
    sh -c 'hostname "$0" && eval "$1"' "$host" "$*"
"""
    path = spec.state_dir / "agent"
    path.write_text(text)
    path.chmod(0o755)
    return path


# -- claim -------------------------------------------------------------------------------
#: how long :func:`claimed` waits for another process's claim by default (a test module's
#: or a benchmark's whole cluster life)
CLAIM_WAIT_S = 3600.0
#: the names this process holds (a second claim of one of them would wait on itself)
_HELD: set[str] = set()


def claim_path(name: str) -> Path:
    """The lock file of cluster ``name``: beside its state directory, which ``down``
    removes, so the lock outlives the cluster it guards."""
    return state_dir(check_name(name)).with_suffix(".lock")


@contextlib.contextmanager
def claimed(name: str, wait_s: float = CLAIM_WAIT_S):
    """Hold cluster ``name`` for this process while the block runs: an exclusive
    ``flock`` on :func:`claim_path`, so that a second user of the name (another test
    session, a benchmark script) waits for the first instead of taking its cluster down
    under its running jobs.  The kernel drops the lock when the holder ends, even by
    SIGKILL.  Says once on stderr whom it waits for; past ``wait_s``, ClusterError naming
    the holder.  ``python -m mpirl.cluster down`` typed by hand does not ask: a user
    may always take a cluster down.  A second claim of a name this process holds is
    refused at once (it would wait on itself)."""
    path = claim_path(name)
    if name in _HELD:
        raise ClusterError(f"cluster {name!r} is already claimed by this process "
                           f"(pid {os.getpid()}); claim each name once")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline, said = time.monotonic() + wait_s, ""
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                # the holder writes its pid just after it locks: an empty read is a new
                # holder not yet written, and a changed one is said again
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                if time.monotonic() >= deadline:
                    raise ClusterError(
                        f"cluster {name!r} is claimed by pid {holder or '?'} (a test "
                        f"session or benchmark using it; lock {path}); waited {wait_s:.0f} "
                        "s; wait for it to end or use another --name") from None
                if holder and holder != said:
                    print(f"mpirl.cluster: cluster {name!r} is claimed by pid {holder}; "
                          "waiting for it to end", file=sys.stderr, flush=True)
                    said = holder
                time.sleep(0.5)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _HELD.add(name)
        try:
            yield
        finally:
            _HELD.discard(name)
    finally:
        os.close(fd)          # releases the lock


# -- down --------------------------------------------------------------------------------
@contextlib.contextmanager
def owned(name: str, nodes: int, subnet: str):
    """A cluster of a script's own: the name claimed (:func:`claimed`), whatever is left
    of it taken down, the cluster brought up uncapped and yielded, and taken down at the
    end, also on error."""
    with claimed(name):
        down(name)
        spec = up(name, nodes, "off", subnet)
        try:
            yield spec
        finally:
            down(name)


def down(name: str) -> list[str]:
    """Remove cluster ``name``: its daemons and every process in its namespaces, the
    namespaces (and with them the links) and the state directory.  Idempotent: returns
    what was removed ([] when nothing was there)."""
    check_name(name)
    removed = slurm.stop(name)
    for ns in namespaces(name):
        kill_namespace(ns)
        sh("ip", "netns", "del", ns, check=False)
        removed.append(ns)
    if state_dir(name).exists():
        shutil.rmtree(state_dir(name), ignore_errors=True)
        removed.append(str(state_dir(name)))
    return removed


# -- status ------------------------------------------------------------------------------
def link_caps(spec: Cluster) -> dict[str, str]:
    """The cap tc reports on each node's eth0 ("off" where none)."""
    caps = {}
    for host in spec.hosts():
        out = in_ns(spec.namespace(host), "tc", "-j", "qdisc", "show", "dev", "eth0").stdout
        rate = "off"
        for q in json.loads(out or "[]"):
            if q.get("kind") == "tbf":
                rate = spell_rate(q["options"]["rate"] * 8)
        caps[host] = rate
    return caps


def status(name: str) -> dict:
    spec = load(name)
    caps, traffic, links = link_caps(spec), link_bytes(spec), link_state(spec)
    return {"name": spec.name, "rate": spec.rate, "subnet": spec.subnet,
            "slurm": slurm.status(spec) if spec.slurm else None,
            "nodes": [{"host": host, "namespace": spec.namespace(host),
                       "address": spec.address(i), "cap": caps[host],
                       "link": "off" if off_marker(spec, host).exists() else links[host],
                       "processes": len(pids_in(spec.namespace(host))), **traffic[host]}
                      for i, host in enumerate(spec.hosts())]}
