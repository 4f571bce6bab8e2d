"""An elastic job on the emulated cluster: ``python -m mpirl.cluster exec --elastic``.

The emulated cluster as a backend of the elastic driver (:func:`mpirl.elastic.drive`):
a node is live when it is powered on and its link is up
(:func:`mpirl.cluster.net.live_hosts`), as a host discovery script would report it, so
a node booted again is seen at once and rejoins; attempts start through
:func:`mpirl.cluster.launch.mpiexec_argv` on the chosen nodes, and a failed one names
the node that died first (:class:`mpirl.cluster.launch.NodeWatch`).
"""

from __future__ import annotations

import subprocess

from ..elastic import ElasticError, drive
from .launch import NodeWatch, _kill_job, mpiexec_argv
from .net import Cluster, ClusterError, live_hosts


class Emulated:
    def __init__(self, spec: Cluster, mpi: str = "mpich") -> None:
        self.spec, self.mpi = spec, mpi
        self.watch: NodeWatch | None = None

    def live(self, hosts: list[str] | None = None) -> list[str]:
        now = live_hosts(self.spec)
        return [h for h in now if hosts is None or h in hosts]

    def back(self, running: list[str]) -> list[str]:
        return [h for h in live_hosts(self.spec) if h not in running]

    def start(self, hosts: list[str], per_node: int, command: list[str],
              env: dict) -> subprocess.Popen:
        argv, job_env = mpiexec_argv(self.spec, len(hosts) * per_node, per_node, command,
                                     self.mpi, hosts=hosts)
        self.watch = NodeWatch(self.spec, hosts)
        return subprocess.Popen(argv, env={**env, **job_env})

    def kill(self, proc: subprocess.Popen) -> None:
        _kill_job(self.spec, proc)

    def report(self, hosts: list[str], per_node: int) -> list[str]:
        if self.watch is None:
            return []
        self.watch.stop()
        return self.watch.died_first(per_node, len(hosts) * per_node)


def run_elastic(spec: Cluster, per_node: int, max_nodes: int, command: list[str], *,
                min_nodes: int = 1, max_restarts: int = 10, mpi: str = "mpich",
                timeout_s: float | None = None) -> int:
    try:
        return drive(Emulated(spec, mpi), per_node, max_nodes, command, min_nodes=min_nodes,
                     max_restarts=max_restarts, timeout_s=timeout_s)
    except ElasticError as err:
        raise ClusterError(str(err)) from None
