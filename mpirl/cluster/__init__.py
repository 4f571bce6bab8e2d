"""An emulated cluster on one machine: nodes as network namespaces with capped links.

``python -m mpirl.cluster up|down|status|exec|login|rate|cut|kill`` (docs/cluster.md).
:mod:`.net` holds the namespaces, links and caps, :mod:`.launch` runs MPI jobs across
them, :mod:`.slurm` runs a multi-node Slurm on them, and :mod:`.lifecycle` brings the
whole up and down.
"""

from .lifecycle import down, status, up
from .net import Cluster, ClusterError, link_bytes, load

__all__ = ["Cluster", "ClusterError", "down", "link_bytes", "load", "status", "up"]
