"""The emulated cluster (``python -m mpirl.cluster``): real namespaces, veth links, tbf
caps, MPICH and Open MPI across nodes, a multi-node Slurm, a node killed mid-run.

Needs root, iproute2 and tc (and Slurm for its tests); without them the tests skip, and
under CI (MPIRL_CI=1) they fail.  The tests' cluster has its own name and subnet, so a
user's cluster (default name ``mpirl``) is left alone."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import BATCH, ROOT, TINY, require, run_sweep
from mpirl.cluster import launch, lifecycle, net
from mpirl.launch import cpu_count
from mpirl.telemetry.read import open_run
from mpirun import start_mpi

NAME = "mpirltest"
SUBNET = "10.231.77.0/24"
CLI = [sys.executable, "-m", "mpirl.cluster", "--name", NAME]
#: a short sync run: a few dozen updates of CartPole's 36 KiB-ish gradient
RUN = ["python", "-m", "mpirl.run", "--mode", "sync", "--total-steps", "1280", *BATCH,
       "--log-every", "10"]


def why_not() -> str | None:
    if os.geteuid() != 0:
        return "the emulated cluster needs root"
    missing = [t for t in ("ip", "tc", "unshare", "nsenter") if shutil.which(t) is None]
    return f"no {', '.join(missing)} on PATH" if missing else None


def slurm_why_not() -> str | None:
    missing = [t for t in ("slurmctld", "slurmd", "munged", "sbatch") if shutil.which(t) is None]
    return f"no {', '.join(missing)} on PATH (apt-get install slurm-wlm munge)" if missing \
        else None


def cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture(scope="module")
def cluster():
    """Two nodes at 1 Gbit/s with a Slurm on them, for the whole module; down after.
    The name is claimed meanwhile, so a second test session waits instead of taking
    this one's cluster down."""
    require(why_not())
    require(slurm_why_not())
    with lifecycle.claimed(NAME):
        cli("down")
        up = cli("up", "--nodes", "2", "--rate", "1gbit", "--subnet", SUBNET, "--slurm")
        assert up.returncode == 0, up.stdout + up.stderr
        try:
            yield net.load(NAME)
        finally:
            down = cli("down")
            assert down.returncode == 0, down.stderr
            assert net.namespaces(NAME) == [] and not net.state_dir(NAME).exists()


def cluster_job(tmp_path, nranks: int, *args: str, name: str = "r", timeout_s: float = 180,
                extra: tuple = ()):
    """``mpirl.cluster exec`` of RUN on the test cluster, to its end; returns the job."""
    command = [*CLI, "exec", "-n", str(nranks), *extra, "--timeout", str(timeout_s), "--",
               *RUN, *args, "--run-dir", str(tmp_path), "--run-name", name]
    job = start_mpi(nranks, [], command=command)
    job.wait(timeout_s + 30)
    return job


def test_status_shows_nodes_caps_and_links(cluster):
    st = json.loads(cli("status", "--json").stdout)
    assert [n["host"] for n in st["nodes"]] == ["node0", "node1"]
    assert [n["address"] for n in st["nodes"]] == ["10.231.77.1", "10.231.77.2"]
    assert {n["cap"] for n in st["nodes"]} == {"1gbit"} and st["rate"] == "1gbit"
    assert {n["link"] for n in st["nodes"]} == {"up"}
    assert st["slurm"]["nodes"] == {"node0": "idle", "node1": "idle"}
    text = cli("status").stdout
    assert "node1" in text and "10.231.77.2" in text and "received" in text


def test_bad_input_is_one_line_and_changes_nothing(cluster):
    cases = [(["up", "--nodes", "2", "--rate", "5furlongs"], "--rate '5furlongs'; allowed"),
             (["up", "--nodes", "0"], "--nodes 0; allowed: 1 to 64"),
             (["up", "--nodes", "2", "--subnet", "8.8.8.0/24"], "allowed: a private IPv4 /24"),
             (["up", "--nodes", "2", "--subnet", SUBNET], "is already up"),
             (["exec", "-n", "5", "--ranks-per-node", "2", "--", "true"],
              "needs 3 nodes; cluster 'mpirltest' has 2"),
             (["exec", "-n", "2"], "nothing to run"),
             (["exec", "--elastic", "-n", "2", "--placement", "cyclic", "--", "true"],
              "--elastic --placement cyclic: an elastic job is relaunched in blocks"),
             (["cut", "node7"], "no node 'node7'; allowed: node0, node1"),
             (["rate", "fast"], "--rate 'fast'; allowed"),
             (["--name", "Bad-Name", "status"], "--name 'Bad-Name'; allowed")]
    for args, says in cases:
        done = cli(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], (args, done.stderr)
    other = subprocess.run([sys.executable, "-m", "mpirl.cluster", "--name", "nosuch", "status"],
                           cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert other.returncode == 2 and "cluster 'nosuch' is not up" in other.stderr
    assert json.loads(cli("status", "--json").stdout)["rate"] == "1gbit"   # unchanged


def test_mpich_run_across_two_nodes_goes_through_the_links(cluster, tmp_path):
    """4 ranks, 2 per node, star: ranks 2 and 3 live on node1, so each update their
    gradients cross node1's link to the root on node0 and the average comes back."""
    before = net.link_bytes(cluster)
    job = cluster_job(tmp_path, 4, "--topology", "star", extra=("--ranks-per-node", "2"))
    assert job.returncode == 0, job.tail()
    after = net.link_bytes(cluster)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    with open_run(tmp_path / "r" / "run.h5") as f:
        assert json.loads(f.attrs["hostnames_json"]) == ["node0", "node0", "node1", "node1"]
        where = json.loads(f.attrs["cluster_json"])
    assert where["name"] == NAME and where["rate"] == "1gbit" and where["mpi"] == "mpich"
    assert where["nodes"] == ["node0", "node1"] and where["ranks_per_node"] == 2
    assert where["ranks_on"] == {"node0": 2, "node1": 2}
    floor = 2 * summary["gradient_bytes"] * summary["updates"]   # two ranks' pushes
    sent = after["node1"]["sent"] - before["node1"]["sent"]
    received = after["node1"]["received"] - before["node1"]["received"]
    assert sent >= floor and received >= floor, (sent, received, floor)


def test_ranks_on_one_node_use_shared_memory(cluster, tmp_path):
    """2 ranks on node0 alone: their exchange never touches a link (a few KB of
    launcher traffic at most, against 2 x 36 KiB per update)."""
    before = net.link_bytes(cluster)
    job = cluster_job(tmp_path, 2, "--topology", "butterfly", extra=("--ranks-per-node", "2"))
    assert job.returncode == 0, job.tail()
    after = net.link_bytes(cluster)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    moved = after["node0"]["sent"] - before["node0"]["sent"]
    assert moved < summary["gradient_bytes"] * summary["updates"] / 10, moved


def test_a_servers_replies_cross_the_link_while_it_computes(cluster):
    """tests/mpi/check_channels.py on 3 ranks round robin (the server and rank 2 on node0,
    rank 1 on node1): MPICH moves the 8 MiB reply over TCP only inside its sender's MPI
    calls, and it lands while the server computes without one (its progress thread)."""
    command = [*CLI, "exec", "-n", "3", "--ranks-per-node", "2", "--placement", "cyclic",
               "--timeout", "180", "--", "python", "tests/mpi/check_channels.py"]
    job = start_mpi(3, [], command=command)
    job.wait(210)
    lines = job.output.splitlines()
    assert "OK progress thread: replies travel while the server makes no MPI call" in lines, \
        job.tail()
    assert job.returncode == 0 and not any(line.startswith("FAIL") for line in lines), \
        job.tail()


def test_exec_ended_by_sigterm_kills_the_ranks_on_every_node(cluster):
    """An outer ``timeout`` ends ``mpirl.cluster exec`` with SIGTERM: exec kills the job's
    ranks on every node before it exits (mpiexec alone left them running)."""
    def ranks() -> set[int]:
        return {pid for host in cluster.hosts()
                for pid in net.rank_processes(net.pids_in(cluster.namespace(host)))}

    command = [*CLI, "exec", "-n", "2", "--", "python", "-c", "import time; time.sleep(300)"]
    job = start_mpi(2, [], command=command)
    with job:
        deadline = time.monotonic() + 60
        while len(ranks()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(ranks()) >= 2, job.tail()
        os.kill(job.pid, signal.SIGTERM)          # exec alone, as `timeout` signals it
        job.wait(60)
    assert job.returncode == 128 + signal.SIGTERM, job.tail()
    assert "SIGTERM: killing the job on every node" in job.output, job.tail()
    deadline = time.monotonic() + 10                # SIGKILLed: gone once reaped
    while ranks() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ranks() == set()


def test_hierarchical_sends_one_leaders_share_over_each_link(cluster, tmp_path):
    """2 nodes x 2 ranks in blocks: the node's ranks reduce in shared memory and only the
    leaders exchange, so each node's link carries one gradient per update (a ring over
    the two leaders: n each way), where a flat ring over the 4 ranks carries 1.5 and a
    butterfly 2 (measured in blocks: 1.06, 1.59, 2.06; the hierarchical job, node0 and
    node1: 1.13 and 1.07, in one later session; the rest is checksums and launcher
    traffic)."""
    before = net.link_bytes(cluster)
    job = cluster_job(tmp_path, 4, "--topology", "hierarchical", "--checksum-every", "2",
                      extra=("--ranks-per-node", "2"))
    assert job.returncode == 0, job.tail()
    after = net.link_bytes(cluster)
    check_leaders_share(tmp_path / "r", {h: after[h]["sent"] - before[h]["sent"]
                                         for h in after}, "block",
                        ["node0", "node0", "node1", "node1"])
    assert "hierarchical: 2 node(s) by shared memory, of 2, 2 ranks; the leaders " \
           "exchange with ring" in job.output, job.tail()


def test_a_sweep_runs_across_the_nodes_numbered_round_robin(cluster, tmp_path):
    """``mpirl.sweep --launcher cluster --ranks-per-node 2 --placement cyclic``: the
    sweep's point (the hierarchical job above, ranks 0 and 2 on node0) runs through the
    cluster's launcher, numbered round robin, and its ``links.json`` (the bytes each
    node's link carried during the point) shows one leader's share over each link: the
    nodes are found by shared memory, so the numbering changes nothing (node0 and node1:
    1.11 and 1.06 gradients per update, launched by exec, in one session)."""
    definition = {"name": "cyclic", "config": {**TINY, "total_steps": 1280, "log_every": 10,
                                               "topology": "hierarchical",
                                               "checksum_every": 2},
                  "grid": {"ranks": [4]}, "timeout_s": 180}
    done = run_sweep(definition, tmp_path, "--launcher", "cluster", "--cluster-name", NAME,
                     "--ranks-per-node", "2", "--placement", "cyclic", timeout_s=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = tmp_path / "cyclic" / "hierarchical-sync-4r-s1"
    links = json.loads((run_dir / "links.json").read_text())
    assert links["rate"] == cluster.rate
    check_leaders_share(run_dir, {h: moved["sent"] for h, moved in links["nodes"].items()},
                        "cyclic", ["node0", "node1", "node0", "node1"])
    log = (tmp_path / "cyclic" / "logs" / "hierarchical-sync-4r-s1.out").read_text()
    assert "hierarchical: 2 node(s) by shared memory, of 2, 2 ranks; the leaders exchange " \
           "with ring" in log, log[-3000:]


def check_leaders_share(run_dir, sent: dict, order: str, hosts: list[str]) -> None:
    """The run in ``run_dir`` placed its ranks on ``hosts`` by ``order`` (both read back
    from run.h5), and each node's link sent (``sent``: bytes by node) about one gradient
    per update."""
    with open_run(run_dir / "run.h5") as f:
        assert json.loads(f.attrs["hostnames_json"]) == hosts
        assert json.loads(f.attrs["cluster_json"])["placement"] == order
    summary = json.loads((run_dir / "summary.json").read_text())
    gradients = summary["gradient_bytes"] * summary["updates"]
    for node in ("node0", "node1"):
        assert 0.95 * gradients < sent[node] < 1.3 * gradients, (node, sent[node] / gradients)


def test_openmpi_run_across_two_nodes_shares_the_cores(cluster, tmp_path):
    """One rank on each node under Open MPI: the nodes are namespaces of one machine, so
    the two ranks divide its cores between their torch threads (counting only a node's
    ranks gave each all the cores: 4 ranks on 2 cores ran a 1 MiB model ~30x slower)."""
    require(None if (ROOT / ".venv-ulfm" / "bin" / "mpiexec").exists()
            else "no .venv-ulfm (make ulfm-env)")
    for _ in range(3):      # Open MPI 5.0.11 sometimes dies in MPI_Init (tests/resilience/
        job = cluster_job(tmp_path, 2, "--topology", "ring",
                          extra=("--mpi", "openmpi", "--ranks-per-node", "1"))
        if job.returncode == 0 or (tmp_path / "r" / "config.yaml").exists():
            break           # test_ulfm.py): a launch that made no run directory is retried
    assert job.returncode == 0, job.tail()
    with open_run(tmp_path / "r" / "run.h5") as f:
        assert json.loads(f.attrs["hostnames_json"]) == ["node0", "node1"]
        assert "Open MPI" in f.attrs["mpi_library"]
        assert json.loads(f.attrs["cluster_json"])["mpi"] == "openmpi"
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["torch_threads"] == max(1, cpu_count() // 2), summary


def test_openmpi_places_ranks_round_robin(cluster):
    """``--mpi openmpi --placement cyclic`` (``--map-by node``): 4 ranks at 2 per node
    land on node0, node1, node0, node1, as MPICH's do (test above)."""
    require(None if (ROOT / ".venv-ulfm" / "bin" / "mpiexec").exists()
            else "no .venv-ulfm (make ulfm-env)")
    where = ("import socket; from mpi4py import MPI; "
             "print(f'rank {MPI.COMM_WORLD.Get_rank()} on {socket.gethostname()}')")
    for _ in range(3):      # Open MPI 5.0.11 sometimes dies in MPI_Init (test_ulfm.py)
        done = cli("exec", "--mpi", "openmpi", "-n", "4", "--ranks-per-node", "2",
                   "--placement", "cyclic", "--timeout", "60", "--", "python", "-c", where,
                   timeout_s=90)
        if done.returncode == 0:
            break
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("rank ")) \
        == ["rank 0 on node0", "rank 1 on node1", "rank 2 on node0", "rank 3 on node1"]


def test_the_cap_bounds_a_transfer_from_below(cluster):
    """At 100 Mbit/s 4 MiB cannot cross a link in under 0.33 s; uncapped it takes a few
    tens of ms.  (A lower bound from the cap, not a speed target.)"""
    probe = ("import time, numpy as np; from mpi4py import MPI; c = MPI.COMM_WORLD; "
             "b = np.zeros(1 << 19); c.Barrier(); t = time.perf_counter(); "
             "c.Send(b, 1) if c.rank == 0 else c.Recv(b, 0); c.Barrier(); "
             "print('took', time.perf_counter() - t) if c.rank == 0 else None")
    took = {}
    try:
        for rate in ("100mbit", "off"):
            assert cli("rate", rate).returncode == 0
            done = cli("exec", "-n", "2", "--timeout", "60", "--", "python", "-c", probe)
            assert done.returncode == 0, done.stderr
            took[rate] = float(done.stdout.split("took")[1])
    finally:
        cli("rate", "1gbit")
    assert took["100mbit"] >= 4 * 2**20 * 8 / 100e6, took
    assert took["off"] < took["100mbit"] / 2, took


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_multi_node_sbatch_through_the_sweep(cluster, tmp_path, launcher):
    """``mpirl.sweep --launcher slurm --submit`` from the login node: one job of 4 ranks
    on 2 nodes (``#SBATCH --nodes=2``), launched by mpiexec or srun inside it."""
    import yaml

    definition = {"name": f"cluster-{launcher}",
                  "config": {"env": "CartPole-v1", "num_envs": 2, "rollout_steps": 8,
                             "log_every": 10, "total_steps": 640},
                  "grid": {"ranks": [4], "topology": ["tree"]},
                  "slurm": {"time": "00:05:00", "nodes": 2, "launcher": launcher}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(definition))
    done = cli("login", "--", sys.executable, "-m", "mpirl.sweep", str(path), "--out",
               str(tmp_path), "--launcher", "slurm", "--submit", "--wait", "240",
               timeout_s=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run = tmp_path / definition["name"] / "tree-sync-4r-s1"
    with open_run(run / "run.h5") as f:
        hosts = json.loads(f.attrs["hostnames_json"])
        scheduler = json.loads(f.attrs["scheduler_json"])
        where = json.loads(f.attrs["cluster_json"])
    assert set(hosts) == {"node0", "node1"}, hosts
    assert scheduler["SLURM_JOB_NUM_NODES"] == "2" and where["name"] == NAME


def test_bench_across_nodes_records_the_cap_and_draws(cluster, tmp_path):
    """mpirl.bench over the 2 nodes at 1 Gbit/s: the file says where it ran, and
    analysis.cluster fits the cost model to it and draws the latency figure."""
    bench = tmp_path / "bench" / "bench-2n-2r-1gbit.h5"
    done = cli("exec", "-n", "2", "--timeout", "120", "--", "python", "-m", "mpirl.bench",
               "--op", "allreduce", "--sizes", "64K", "256K", "1M", "--topologies", "star",
               "ring", "butterfly", "--iters", "20", "--rounds", "1", "--out", str(bench),
               timeout_s=180)
    assert done.returncode == 0, done.stdout + done.stderr
    from mpirl.telemetry.read import load_bench

    table = load_bench(bench)
    assert set(table["rate"]) == {"1gbit"} and set(table["nodes"]) == {2}
    assert table["oversubscribed"].iloc[0] == (2 > os.cpu_count())
    # 1 MiB between two nodes at 1 Gbit/s: at least the 8.4 ms the cap allows one way
    one_mib = table[(table["bytes"] == 1 << 20) & (table["topology"] == "ring")]
    assert one_mib["avg_s"].iloc[0] >= (1 << 20) * 8 / 1e9, one_mib
    from analysis import cluster as figures

    assert figures.main([str(tmp_path / "bench"), "-o", str(tmp_path / "fig")]) == 0
    assert (tmp_path / "fig" / "latency.png").stat().st_size > 10_000
    results = (tmp_path / "fig" / "results.md").read_text()
    assert "| 2 nodes x 1 | 1gbit |" in results
    model = __import__("pandas").read_csv(tmp_path / "fig" / "costmodel.csv")
    assert model["predicted_s"].notna().sum() >= 9


def break_a_long_run(tmp_path, fault: str, *args: str):
    """A 4-rank sync run across both nodes (2 each), broken by ``mpirl.cluster FAULT
    node1`` once rank 2 has reported update 20; returns the ended job, its exit status
    and the seconds from the fault to its end (the test fails past 60 s)."""
    command = [*CLI, "exec", "-n", "4", "--timeout", "120", "--", *RUN, "--topology",
               "butterfly", "--total-steps", "10000000", *args, "--run-dir", str(tmp_path),
               "--run-name", "r"]
    with start_mpi(4, [], command=command) as job:
        job.reached(tmp_path / "r", 2, 20)
        at = time.monotonic()
        assert cli(fault, "node1").returncode == 0
        code = job.wait(60, what=f"the job did not end within 60 s of the {fault} of node1")
        return job, code, time.monotonic() - at


def test_a_cut_link_ends_the_job_within_the_watchdog_deadline_naming_the_node(cluster,
                                                                              tmp_path):
    """node1's link taken down mid-run: no rank dies, every one blocks on a peer it cannot
    reach; the watchdog (10 s) ends the job (exit 4), and the launcher names the node that
    is cut off and its ranks."""
    try:
        job, code, ended = break_a_long_run(tmp_path, "cut", "--watchdog-s", "10")
    finally:
        assert cli("cut", "node1", "--restore").returncode == 0
    assert code == 4, job.tail()
    assert "made no progress for" in job.output and "--watchdog-s 10" in job.output
    assert "mpirl.cluster: node1 (ranks 2, 3) is cut off: its link is down" in job.output
    assert 10 <= ended < 30, ended
    assert net.link_state(cluster) == {"node0": "up", "node1": "up"}


def test_survivors_carry_on_when_a_nodes_ranks_die_under_open_mpi(cluster, tmp_path):
    """A 4-rank butterfly under Open MPI with ULFM (--on-failure shrink), node1's ranks
    (2, 3) SIGKILLed with its runtime daemon kept (``kill --keep-runtime``: a node's loss
    as MPI sees it; Open MPI 5.0's runtime itself ends the job when a daemon dies): the
    ranks on node0 shrink past both and finish the budget, and node1's prted lives."""
    require(None if (ROOT / ".venv-ulfm" / "bin" / "mpiexec").exists()
            else "no .venv-ulfm (make ulfm-env)")
    budget = 4000
    command = [*CLI, "exec", "-n", "4", "--mpi", "openmpi", "--ulfm", "--timeout", "120",
               "--", *RUN, "--topology", "butterfly", "--total-steps", str(budget),
               "--on-failure", "shrink", "--run-dir", str(tmp_path), "--run-name", "r"]
    started = tmp_path / "r" / "config.yaml"
    for _ in range(3):      # Open MPI 5.0.11 sometimes dies in MPI_Init (test_ulfm.py)
        job = start_mpi(4, [], command=command)
        deadline = time.monotonic() + 120
        while not started.exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if started.exists():
            break
        job.wait(30)
    with job:
        job.reached(tmp_path / "r", 2, 10)
        killed = cli("kill", "node1", "--keep-runtime")
        assert killed.returncode == 0 and "runtime daemon kept" in killed.stdout
        assert any(net.process_name(p) == "prted"
                   for p in net.pids_in(cluster.namespace("node1")))
        job.wait(90, what="the survivors did not finish within 90 s")
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["ranks_failed"] == [2, 3] and summary["env_steps"] >= budget, summary
    for rank in (0, 1):
        with open_run(tmp_path / "r" / f"rank{rank:04d}.h5") as f:
            assert len(f["failures"]) >= 1


def test_a_killed_node_ends_the_job_naming_the_node_and_its_ranks(cluster, tmp_path):
    """Every process on node1 (ranks 2, 3, their sentinels, hydra's proxy, slurmd)
    SIGKILLed in the middle of a sync run: MPICH's launcher ends at once, and the ranks on
    node0 are killed with it; the cluster's launcher names node1 and its ranks.  (Last in
    this module: node1's slurmd is gone after it.)"""
    job, code, ended = break_a_long_run(tmp_path, "kill")
    assert code != 0
    assert "mpirl.cluster: node1 (ranks 2, 3) died first" in job.output, job.tail()
    assert ended < 15, ended
    deadline = time.monotonic() + 10       # nothing left behind (sentinels finish first)
    while launch.job_pids(cluster.namespace("node0")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert launch.job_pids(cluster.namespace("node0")) == []
