"""A multi-node Slurm whose nodes are the emulated nodes (``up --slurm``).

Everything is the cluster's own, apart from any Slurm the machine already runs (the
single-node one of ``.ci/slurm-up`` uses /etc/slurm and munge's default socket):

- a munged on its own socket (``<state>/munge/munge.socket``; the machine's munge key,
  created as .ci/slurm-up does when there is none);
- ``<state>/slurm/slurm.conf`` (``AuthInfo=socket=...``), its own state, spool and log
  directories;
- slurmctld on the login node and one slurmd per node, each started in its network
  namespace with ``nsenter --net`` (``ip netns exec`` remounts /sys, and slurmd then
  fails with "Unable to initialize cgroup plugin") under the node's hostname.

Clients (sbatch, squeue, sinfo) must run inside the cluster, where slurmctld's address
is reachable, with ``SLURM_CONF`` pointing at that file: ``python -m mpirl.cluster login --
sbatch ...`` does both, and exports the MPI settings for the links, so jobs inherit them
(hydra's ``-iface eth0`` included, through ``HYDRA_IFACE``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from .net import (SLURM_DAEMONS, Cluster, ClusterError, kill_namespace, namespaces, pids_in,
                  process_name, sh, state_dir)

#: process names of the cluster's daemons (what a job kill leaves alone)
#: CPUs each node declares: more than the machine has, as .ci/slurm-up does, so that
#: several ranks per node fit on a 2-core machine (nothing binds tasks to cores)
NODE_CPUS = max(os.cpu_count() or 1, 8)


def paths(name: str) -> dict[str, Path]:
    root = state_dir(name)
    return {"conf": root / "slurm" / "slurm.conf", "munge": root / "munge",
            "socket": root / "munge" / "munge.socket", "state": root / "slurm" / "state",
            "spool": root / "slurm" / "spool", "log": root / "slurm" / "log",
            "run": root / "slurm" / "run"}


def check_can_run() -> None:
    missing = [t for t in ("slurmctld", "slurmd", "munged", "sbatch") if shutil.which(t) is None]
    if missing:
        raise ClusterError(f"up --slurm needs {', '.join(missing)} on PATH (Debian: apt-get "
                           "install slurm-wlm munge)")


def slurm_conf(spec: Cluster) -> str:
    p = paths(spec.name)
    nodes = "\n".join(f"NodeName={h} NodeAddr={spec.address(i)} CPUs={NODE_CPUS} "
                      "RealMemory=1000 State=UNKNOWN" for i, h in enumerate(spec.hosts()))
    return f"""# written by python -m mpirl.cluster up --slurm (emulated cluster {spec.name})
ClusterName={spec.name}
SlurmctldHost=login({spec.login_address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={p['socket']}
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdParameters=config_overrides
StateSaveLocation={p['state']}
SlurmdSpoolDir={p['spool']}/%n
SlurmctldPidFile={p['run']}/slurmctld.pid
SlurmdPidFile={p['run']}/slurmd.%n.pid
SlurmctldLogFile={p['log']}/slurmctld.log
SlurmdLogFile={p['log']}/slurmd.%n.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=5
Waittime=0
SchedulerType=sched/backfill
SchedulerParameters=permit_job_expansion
MailProg=/bin/true
{nodes}
PartitionName=emulated Nodes={','.join(spec.hosts())} Default=YES MaxTime=INFINITE State=UP
"""


def _on_node(spec: Cluster, host: str, argv: list[str]) -> list[str]:
    ns = spec.login if host == "login" else spec.namespace(host)
    return ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "--",
            "sh", "-c", 'hostname "$0" && exec "$@"', host, *argv]


def client_env(spec: Cluster) -> dict:
    env = dict(os.environ)
    env["SLURM_CONF"] = str(paths(spec.name)["conf"])
    return env


def client(spec: Cluster, *argv: str, timeout: float = 20.0) -> subprocess.CompletedProcess:
    """A Slurm client command (sinfo, squeue...) run on the login node."""
    return subprocess.run(_on_node(spec, "login", list(argv)), capture_output=True, text=True,
                          env=client_env(spec), timeout=timeout)


def _munge_key() -> None:
    key = Path("/etc/munge/munge.key")
    if key.exists() and key.stat().st_size:
        return
    key.parent.mkdir(parents=True, exist_ok=True)
    if shutil.which("mungekey"):
        sh("mungekey", "--create", f"--keyfile={key}", "--force")
    else:
        key.write_bytes(os.urandom(1024))
    shutil.chown(key, "munge", "munge")
    key.chmod(0o400)


def start(spec: Cluster, wait_s: float = 60.0) -> None:
    """Start munged, slurmctld and the slurmds; wait until every node is idle."""
    check_can_run()
    p = paths(spec.name)
    for key in ("state", "spool", "log", "run"):
        p[key].mkdir(parents=True, exist_ok=True)
    for host in spec.hosts():
        (p["spool"] / host).mkdir(exist_ok=True)
    p["munge"].mkdir(parents=True, exist_ok=True)
    shutil.chown(p["munge"], "munge", "munge")
    _munge_key()
    sh("runuser", "-u", "munge", "--", "munged", f"--socket={p['socket']}",
       f"--pid-file={p['munge'] / 'munged.pid'}", f"--log-file={p['munge'] / 'munged.log'}",
       f"--seed-file={p['munge'] / 'munged.seed'}")
    p["conf"].write_text(slurm_conf(spec))
    conf = str(p["conf"])
    sh(*_on_node(spec, "login", ["slurmctld", "-f", conf]))
    for host in spec.hosts():
        sh(*_on_node(spec, host, ["slurmd", "-f", conf, "-N", host]))
    deadline = time.monotonic() + wait_s
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        out = client(spec, "sinfo", "-h", "-N", "-o", "%N %T")
        states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
        if len(states) == spec.nodes and all(s == "idle" for s in states.values()):
            return
        time.sleep(0.5)
    log = p["log"] / "slurmctld.log"
    tail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
    raise ClusterError(f"Slurm on cluster {spec.name!r}: nodes not idle after {wait_s:g} s "
                       f"({states or 'sinfo gave nothing'}); {tail[0] if tail else ''}")


def start_node(spec: Cluster, host: str) -> None:
    """Start ``host``'s slurmd again (a node booted after a power loss); Slurm's
    ``ReturnToService=2`` takes it back once it registers."""
    sh(*_on_node(spec, host, ["slurmd", "-f", str(paths(spec.name)["conf"]), "-N", host]))


def stop(name: str) -> list[str]:
    """Stop the cluster's Slurm daemons and munged (nothing if none run)."""
    stopped = []
    for ns in namespaces(name):
        daemons = [pid for pid in pids_in(ns) if process_name(pid) in SLURM_DAEMONS]
        if daemons:
            kill_namespace(ns)       # every process there goes anyway when the node goes
            stopped.append(f"slurm daemons in {ns}")
    pidfile = paths(name)["munge"] / "munged.pid"
    if pidfile.exists():
        try:
            pid = int(pidfile.read_text().split()[0])
            if process_name(pid) == "munged":
                os.kill(pid, 15)
                stopped.append(f"munged {pid}")
        except (ValueError, IndexError, ProcessLookupError):
            pass
    return stopped


def status(spec: Cluster) -> dict:
    out = client(spec, "sinfo", "-h", "-N", "-o", "%N %T")
    return {"conf": str(paths(spec.name)["conf"]),
            "nodes": dict(line.split() for line in out.stdout.splitlines() if line.strip())}
