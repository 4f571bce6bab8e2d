"""An emulated cluster on one machine: nodes as network namespaces with capped links.

``python -m mpirl.cluster up|down|status|exec|login|rate|cut|kill`` (docs/cluster.md).
:mod:`.net` builds and removes the namespaces and links, :mod:`.launch` runs MPI jobs
across them, :mod:`.slurm` runs a multi-node Slurm on them.
"""

from .net import Cluster, ClusterError, down, link_bytes, load, status, up

__all__ = ["Cluster", "ClusterError", "down", "link_bytes", "load", "status", "up"]
