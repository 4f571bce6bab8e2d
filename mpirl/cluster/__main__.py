"""``python -m mpirl.cluster``: bring an emulated cluster up, use it, take it down.

  python -m mpirl.cluster up --nodes 4 --rate 1gbit [--slurm]
  python -m mpirl.cluster exec -n 8 --ranks-per-node 2 -- python -m mpirl.run --topology star
  python -m mpirl.cluster exec -n 8 --ranks-per-node 2 --placement cyclic -- ...  # round robin
  python -m mpirl.cluster login -- sbatch -N 2 --ntasks 4 experiments/slurm/run.sbatch
  python -m mpirl.cluster status
  python -m mpirl.cluster rate 100mbit          # change every link's cap, live
  python -m mpirl.cluster cut node1 [--restore] # a node's link down (or up again)
  python -m mpirl.cluster kill node1            # every process on a node: SIGKILL
  python -m mpirl.cluster kill node1 --keep-runtime   # only its ranks (MPI's view of it)
  python -m mpirl.cluster kill node1 --power-off      # and it stays down until 'boot'
  python -m mpirl.cluster boot node1                  # a node that was off is back
  python -m mpirl.cluster exec --elastic -n 8 --ranks-per-node 2 -- \
      python -m mpirl.run --commit-every 10        # relaunched on the nodes left
  python -m mpirl.cluster down                  # everything removed; idempotent
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from . import elastic, launch, lifecycle, net, slurm
from .net import ClusterError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mpirl.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default=os.environ.get("MPIRL_CLUSTER_NAME",
                                                         net.DEFAULT_NAME),
                        help="which cluster (namespaces <name>-node<i>; default "
                             f"$MPIRL_CLUSTER_NAME or {net.DEFAULT_NAME})")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("up", help="create the nodes, links and caps (and Slurm)")
    p.add_argument("--nodes", type=int, default=4, help="how many nodes (default 4)")
    p.add_argument("--rate", default="off",
                   help="each node's link cap, each way: off, or e.g. 100mbit, 1gbit")
    p.add_argument("--subnet", default=net.DEFAULT_SUBNET,
                   help=f"the nodes' private /24 (default {net.DEFAULT_SUBNET})")
    p.add_argument("--slurm", action="store_true",
                   help="also start a Slurm whose nodes are these (own munge and config)")
    sub.add_parser("down", help="remove everything (idempotent)")
    p = sub.add_parser("status", help="nodes, caps, link states, bytes through each link")
    p.add_argument("--json", action="store_true", help="as JSON")
    p = sub.add_parser("exec", help="run an MPI job across the nodes (mpiexec on the login node)")
    p.add_argument("-n", type=int, required=True, dest="nranks", help="ranks")
    p.add_argument("--ranks-per-node", type=int, default=None,
                   help="ranks on each node (default: spread evenly)")
    p.add_argument("--placement", choices=launch.PLACEMENTS, default="block",
                   help="block: ranks 0..M-1 on node0, M..2M-1 on node1...; cyclic: rank r "
                        "on node r mod N, round robin over the N nodes used (default block)")
    p.add_argument("--mpi", choices=launch.MPIS, default="mpich",
                   help="mpich (this environment's) or openmpi (make ulfm-env's)")
    p.add_argument("--ulfm", action="store_true",
                   help="openmpi: fault tolerance on (for mpirl.run --on-failure shrink)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="kill the job on every node after SECONDS (exit 124)")
    p.add_argument("--elastic", action="store_true",
                   help="when a node dies, relaunch on the nodes left from the newest "
                        "commit (mpirl.run --commit-every K); when one comes back, "
                        "relaunch with it: -n is the most ranks, at --ranks-per-node each")
    p.add_argument("--min-nodes", type=int, default=1,
                   help="--elastic: give up below this many live nodes (default 1)")
    p.add_argument("--max-restarts", type=int, default=10,
                   help="--elastic: relaunches at most (default 10)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND...")
    p = sub.add_parser("login", help="run a command on the login node (Slurm clients: sbatch...)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND...")
    p = sub.add_parser("rate", help="change every link's cap")
    p.add_argument("rate", help="off, or e.g. 100mbit, 1gbit")
    p = sub.add_parser("cut", help="take a node's link down (a pulled cable)")
    p.add_argument("node")
    p.add_argument("--restore", action="store_true", help="bring it up again")
    p = sub.add_parser("kill", help="SIGKILL every process on a node (a node that died)")
    p.add_argument("node")
    p.add_argument("--keep-runtime", action="store_true",
                   help="only what the MPI runtime's daemon there started (its ranks): "
                        "the node's loss as MPI sees it, the daemon kept alive")
    p.add_argument("--power-off", action="store_true",
                   help="the node stays down (no job starts there) until 'boot NODE'")
    p = sub.add_parser("boot", help="a node that was powered off is back, empty")
    p.add_argument("node")
    return parser


def _command(cmd: list[str]) -> list[str]:
    return cmd[1:] if cmd and cmd[0] == "--" else cmd


def print_status(st: dict) -> None:
    print(f"cluster {st['name']}: {len(st['nodes'])} nodes on {st['subnet']}, "
          f"link cap {st['rate']} each way")
    print(f"  {'node':6} {'address':14} {'link':5} {'cap':10} {'sent':>14} {'received':>14} "
          f"{'procs':>5}")
    for n in st["nodes"]:
        print(f"  {n['host']:6} {n['address']:14} {n['link']:5} {n['cap']:10} "
              f"{n['sent']:>14,} {n['received']:>14,} {n['processes']:>5}")
    if st["slurm"] is not None:
        nodes = ", ".join(f"{h} {s}" for h, s in st["slurm"]["nodes"].items())
        print(f"  slurm: {nodes or 'no answer'} (SLURM_CONF={st['slurm']['conf']})")


def cmd_up(args) -> int:
    spec = lifecycle.up(args.name, args.nodes, args.rate, args.subnet)
    if args.slurm:
        try:
            spec.slurm = True
            net.save(spec)
            slurm.start(spec)
        except BaseException:
            lifecycle.down(args.name)
            raise
    print(f"cluster {spec.name}: {spec.nodes} nodes up ({', '.join(spec.hosts())}), link cap "
          f"{spec.rate}{', Slurm up' if spec.slurm else ''}; "
          "python -m mpirl.cluster down removes it")
    return 0


def cmd_down(args) -> int:
    removed = lifecycle.down(args.name)
    print(f"cluster {args.name}: " + (f"removed {len(removed)} things" if removed
                                      else "nothing to remove"))
    return 0


def cmd_status(args) -> int:
    st = lifecycle.status(args.name)
    print(json.dumps(st, indent=1)) if args.json else print_status(st)
    return 0


def cmd_exec(args) -> int:
    if args.elastic:
        return _exec_elastic(args)
    return launch.run(net.load(args.name), args.nranks, args.ranks_per_node,
                      _command(args.cmd), mpi=args.mpi, ulfm=args.ulfm,
                      timeout_s=args.timeout, order=args.placement)


def _exec_elastic(args) -> int:
    if args.placement != "block":
        raise ClusterError(f"--elastic --placement {args.placement}: an elastic job is "
                           "relaunched in blocks; allowed: --placement block")
    spec = net.load(args.name)
    per_node = args.ranks_per_node or -(-args.nranks // spec.nodes)
    if per_node < 1 or args.nranks < 1 or args.nranks % per_node:
        raise ClusterError(f"--elastic -n {args.nranks} at --ranks-per-node {per_node}: every "
                           "node runs the same number of ranks; allowed: n a multiple of "
                           "ranks per node")
    launch.placement(spec, args.nranks, per_node)       # fits the cluster
    return elastic.run_elastic(spec, per_node, args.nranks // per_node, _command(args.cmd),
                               min_nodes=args.min_nodes, max_restarts=args.max_restarts,
                               mpi=args.mpi, timeout_s=args.timeout)


def cmd_login(args) -> int:
    spec = net.load(args.name)
    cmd = _command(args.cmd)
    if not cmd:
        raise ClusterError("nothing to run: give the command after --")
    env = launch.job_env(spec, "mpich", spec.hosts(), None, order=None)
    if spec.slurm:
        env["SLURM_CONF"] = str(slurm.paths(spec.name)["conf"])
    return subprocess.call(launch.on_login(spec, cmd), env=env)


def cmd_rate(args) -> int:
    spec = net.load(args.name)
    net.set_rate(spec, args.rate)
    print(f"cluster {spec.name}: link cap {spec.rate} each way on {spec.nodes} nodes")
    return 0


def cmd_cut(args) -> int:
    net.cut(net.load(args.name), args.node, restore=args.restore)
    print(f"cluster {args.name}: {args.node}'s link {'up' if args.restore else 'down'}")
    return 0


def cmd_kill(args) -> int:
    spec = net.load(args.name)
    if args.power_off and args.keep_runtime:
        raise ClusterError("--power-off with --keep-runtime: a node without power keeps "
                           "nothing running; choose one")
    if args.power_off:
        pids = net.power_off(spec, args.node)
        print(f"cluster {args.name}: {args.node}: powered off, killed {len(pids)} processes; "
              f"python -m mpirl.cluster boot {args.node} brings it back")
        return 0
    pids = net.kill_node(spec, args.node, keep_runtime=args.keep_runtime)
    kept = " (its MPI runtime daemon kept)" if args.keep_runtime else ""
    print(f"cluster {args.name}: {args.node}: killed {len(pids)} processes{kept}")
    return 0


def cmd_boot(args) -> int:
    spec = net.load(args.name)
    net.power_on(spec, args.node)
    if spec.slurm:
        slurm.start_node(spec, args.node)
    print(f"cluster {args.name}: {args.node}: powered on"
          + (", its slurmd started" if spec.slurm else ""))
    return 0


COMMANDS = {"up": cmd_up, "down": cmd_down, "status": cmd_status, "exec": cmd_exec,
            "login": cmd_login, "rate": cmd_rate, "cut": cmd_cut, "kill": cmd_kill,
            "boot": cmd_boot}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        args.name = net.check_name(args.name)
        return COMMANDS[args.command](args)
    except ClusterError as err:
        print(f"mpirl.cluster: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
