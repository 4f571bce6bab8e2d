"""``python -m mpirl.run`` as users call it: under mpiexec, tiny budgets, real files."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT, SHORT, SMALL, train
from mpirl.launch import THREAD_DEFAULTS, apply_mpi_defaults, mpiexec_path
from mpirun import run_mpi

#: 16 updates of 3 ranks x 2 envs x 16 steps, a progress line every 4, checksums every 3
TINY_RUN = ["--total-steps", "1536", "--num-envs", "2", "--rollout-steps", "16",
            "--log-every", "4", "--checksum-every", "3"]


def read_progress(run_dir):
    with open(run_dir / "progress.csv") as f:
        return list(csv.DictReader(f))


# Two topologies: what is checked here (config, progress, counts) does not depend on the
# exchange; every registered topology runs in mpirl.run in test_sync's 2-rank check.
@pytest.mark.parametrize("name", ["native", "hierarchical"])
def test_sync_run_writes_config_and_progress(tmp_path, name):
    result = run_mpi(3, ["-m", "mpirl.run", *TINY_RUN, "--topology", name,
                         "--run-dir", str(tmp_path), "--run-name", "r"], timeout_s=180)
    run_dir = tmp_path / "r"
    assert f"run files: {run_dir}" in result.output
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["topology"] == name and saved["total_steps"] == 1536
    rows = read_progress(run_dir)
    # 1536 steps / (3 ranks * 2 envs * 16 steps) = 16 updates, logged every 4
    assert [int(r["update"]) for r in rows] == [4, 8, 12, 16]
    assert int(rows[-1]["env_steps"]) == 1536
    assert 0 < float(rows[-1]["comm_share"]) < 1
    summary = yaml.safe_load((run_dir / "summary.json").read_text())
    assert summary["updates"] == 16 and summary["gradients_sent"] == 48


@pytest.mark.parametrize("mode, role", [("impala", "learner"), ("seed", "learner")])
def test_progress_of_an_actor_learner_design_shows_its_reporters_waiting(tmp_path, mode,
                                                                          role):
    """The reporting rank sees no worker's exchange: its line shows its own waiting share
    (not a 0% exchange share) and the actors' (as their unrolls or requests said), and
    progress.csv keeps both."""
    result = run_mpi(3, ["-m", "mpirl.run", "--mode", mode, "--total-steps", "2000",
                         "--log-every", "10", "--run-dir", str(tmp_path), "--run-name", "r"],
                     timeout_s=180)
    lines = [line for line in result.output.splitlines() if line.startswith("update")]
    assert lines and all(f"{role} waits" in line and " comm " not in line for line in lines)
    assert all("actors wait" in line for line in lines[1:])
    rows = read_progress(tmp_path / "r")
    assert {r["wait_role"] for r in rows} == {role}
    assert all(0.0 <= float(r["wait_share"]) <= 1.0 for r in rows)
    # each actor's share is of its own logged time: never more than all of it
    assert all(0.0 <= float(r["actors_wait_share"]) <= 1.0 for r in rows[1:])
    if mode == "seed":           # an actor waits for every step's actions: most of its time
        assert float(rows[-1]["actors_wait_share"]) > 0.2


def test_sync_run_learns_cartpole(tmp_path):
    """The default learner must actually learn: returns rise well above a random policy's."""
    result = run_mpi(2, ["-m", "mpirl.run", "--total-steps", "40960", "--log-every", "40",
                         "--run-dir", str(tmp_path), "--run-name", "learn"], timeout_s=300)
    rows = read_progress(tmp_path / "learn")
    first, best = float(rows[0]["mean_return"]), max(float(r["mean_return"]) for r in rows)
    assert first < 60, result.output   # a random CartPole policy averages about 22
    assert best > 3 * first and best > 100, result.output


@pytest.mark.parametrize("args, fragment", [
    (["--topology", "hypercube"], "choose one of: native, star, tree, butterfly, ring"),
    (["--mode", "eventual"], "mode='eventual' is not allowed"),
    (["--lr", "-0.1"], "lr=-0.1; allowed: (0.0, 1.0]"),
    (["--env", "CartPol-v1"], "not a registered gymnasium id"),
    (["--num-envs", "many"], "argument --num-envs: invalid int value"),
    (["--total-steps", "10"], "less than one update"),
    (["--mode", "async", "--topology", "ring"], "topology='ring' is not allowed with it"),
    (["--mode", "quorum", "--topology", "star", "--quorum", "2"], "quorum=2; allowed with 2"),
    (["--straggler", "7:2"], "straggler rank 7 does not exist"),
    (["--straggler", "1x2"], "expected RANK:FACTOR"),
    (["--env", "Delay-v0", "--env-arg", "cost_s=-1"], "cost_s=-1.0; allowed: seconds in [0, 60]"),
    (["--env", "Delay-v0", "--env-arg", "speed"], "env_arg='speed'; expected KEY=VALUE"),
    (["--env", "L2Run-v0", "--env-arg", "difficulty=5"], "difficulty=5; allowed: 0, 1 or 2"),
    (["--env-arg", "difficulty=1"], "CartPole-v1 takes none"),
    (["--mode", "impala", "--learners", "2"], "learners=2 needs at least 3 ranks"),
    (["--mode", "ga3c"], "needs at least 3 ranks (one actor or more), got 2"),
    (["--mode", "seed", "--inference-policy", "fixed", "--inference-batch", "5"],
     "inference_batch=5 with fixed-size batching can never fill: 1 actors x num_envs 4 = 4"),
    (["--mode", "seed", "--learners", "2"], "learners=2 with mode='seed'; allowed: 1"),
    (["--mode", "impala", "--param-refresh", "never"], "param_refresh='never' is not allowed"),
    (["--mode", "impala", "--rho-bar", "-1"], "rho_bar=-1.0; allowed: >= 0.0"),
])
def test_bad_flags_fail_fast_with_one_message(tmp_path, args, fragment):
    result = run_mpi(2, ["-m", "mpirl.run", *args, "--run-dir", str(tmp_path)],
                     timeout_s=120, check=False)
    assert result.returncode != 0
    assert result.output.count("mpirl.run: error:") == 1, result.output
    assert fragment in result.output, result.output
    assert "Traceback" not in result.output
    assert not any(tmp_path.iterdir()), "a failed start must not create a run directory"


def test_a_run_is_never_written_over_and_a_bad_run_dir_is_one_line(tmp_path):
    train(tmp_path, 2, "--total-steps", "256", name="first")
    log = tmp_path / "first" / "run.h5"
    before = (log.stat().st_mtime_ns, log.stat().st_size)
    again = run_mpi(2, ["-m", "mpirl.run", *SMALL, "--run-dir", str(tmp_path), "--run-name",
                        "first"], timeout_s=120, check=False)
    assert again.returncode == 2
    assert again.output.strip() == (
        f"mpirl.run: error: run_name='first': {tmp_path / 'first'} already holds a run; "
        f"allowed: another --run-name, --resume {tmp_path / 'first'} to continue it, or "
        "remove it first")
    assert (log.stat().st_mtime_ns, log.stat().st_size) == before
    (tmp_path / "afile").write_text("")
    bad = run_mpi(2, ["-m", "mpirl.run", "--run-dir", str(tmp_path / "afile" / "runs")],
                  timeout_s=120, check=False)
    assert bad.returncode == 2 and bad.output.strip() == (
        f"mpirl.run: error: run_dir='{tmp_path / 'afile' / 'runs'}': {tmp_path / 'afile'} is "
        "a file; allowed: a directory (made if missing)")


def test_what_a_run_ignores_or_cannot_do_is_said_in_one_line(tmp_path):
    """A topology a design does not use (left out of the run's name), sharded servers
    with the default --checkpoint-every, and more ranks than cores: each one line."""
    job = run_mpi(3, ["-m", "mpirl.run", "--mode", "seed", "--topology", "ring",
                      "--total-steps", "600", "--log-every", "100", "--run-dir",
                      str(tmp_path / "seed")], timeout_s=180)
    notes = [line for line in job.output.splitlines() if line.startswith("mpirl: note")]
    assert notes == ["mpirl: note: --topology ring plays no part in this run (mode seed)"]
    (name,) = [p.name for p in (tmp_path / "seed").iterdir()]
    assert name.startswith("seed-3r-")
    crowded = len(os.sched_getaffinity(0)) < 3
    warned = [line for line in job.output.splitlines() if "oversubscribed" in line]
    assert warned == (["mpirl: warning: 3 ranks share "
                       f"{len(os.sched_getaffinity(0))} cores (oversubscribed): timings and "
                       "throughput are suspect"] if crowded else [])
    job = run_mpi(3, ["-m", "mpirl.run", "--mode", "async", "--topology", "star", "--servers",
                      "2", "--total-steps", "600", "--log-every", "100", "--run-dir",
                      str(tmp_path / "async")], timeout_s=180)
    notes = [line for line in job.output.splitlines() if line.startswith("mpirl: note")]
    assert notes == ["mpirl: note: sharded servers (--servers 2) take no checkpoint "
                     "snapshots yet: --checkpoint-every 100 has no effect in this run"]


@pytest.mark.parametrize("nranks, args, fragment", [
    (1, ["--mode", "seed"], "mode='seed' with 1 learner needs at least 2 ranks"),
    (4, ["--mode", "impala", "--learners", "3"],
     "learners=3 with 4 ranks leaves 1 actors, and every learner needs one; allowed: 1..2"),
    (6, ["--mode", "apex", "--replay-ranks", "3"],
     "replay_ranks=3 with 6 ranks leaves 2 actors, and every replay rank needs one; "
     "allowed: 1..2"),
    (3, ["--mode", "apex", "--replay-capacity", "50", "--replay-batch", "64",
         "--replay-ranks", "1"],
     "replay_capacity=50 over 1 replay shard(s) holds 50 each, less than replay_batch=64"),
    (3, ["--mode", "apex", "--replay-ranks", "2"],
     "mode='apex' with 1 learner and replay_ranks=2 needs at least 4 ranks"),
    (3, ["--mode", "gorila", "--servers", "3"], "servers=3 with 3 ranks leaves no worker"),
    (3, ["--mode", "sync", "--servers", "2"], "servers=2 with mode='sync'; allowed: 1"),
    (5, ["--mode", "gorila", "--gorila-replay", "service", "--servers", "2",
         "--replay-ranks", "2"],
     "replay_ranks=2 with 5 ranks leaves 1 workers, and every replay rank needs one; "
     "allowed: 1..1"),
    (3, ["--mode", "apex", "--env", "Pendulum-v1", "--dueling"],
     "dueling=True is an option of double DQN; env='Pendulum-v1' has a Box action space, "
     "which selects SAC; allowed: SAC's --tau, --init-alpha, --target-entropy, "
     "--sac-reward-scale"),
    (3, ["--mode", "gorila", "--tau", "0.01"],
     "tau=0.01 is an option of SAC; env='CartPole-v1' has a Discrete action space, which "
     "selects double DQN; allowed: double DQN's --dueling, --apex-eps, --apex-eps-alpha, "
     "--target-update"),
    (2, ["--mode", "seed", "--learner-device", "cuda"],
     "learner_device='cuda' but torch sees no GPU on this machine; allowed here: cpu"),
])
def test_actor_learner_wiring_is_checked_at_start(tmp_path, nranks, args, fragment):
    if "cuda" in args:
        import torch
        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU: cuda is allowed here")
    result = run_mpi(nranks, ["-m", "mpirl.run", *args, "--run-dir", str(tmp_path)],
                     timeout_s=120, check=False)
    assert result.returncode == 2, result.tail()
    assert result.output.count("mpirl.run: error:") == 1, result.output
    assert fragment in result.output, result.output
    assert not any(tmp_path.iterdir())


def test_ranks_launched_with_different_configurations_are_refused(tmp_path):
    """An MPMD launch whose second rank got another seed: refused at start, in one line."""
    cmd = [mpiexec_path(), "-n", "1", sys.executable, "-m", "mpirl.run", *SHORT, "--seed", "1",
           "--run-dir", str(tmp_path), ":", "-n", "1", sys.executable, "-m", "mpirl.run",
           *SHORT, "--seed", "2", "--run-dir", str(tmp_path)]
    result = run_mpi(2, [], command=cmd, timeout_s=120, check=False)
    assert result.returncode == 2, result.tail()
    assert result.output.count("mpirl.run: error:") == 1, result.tail()
    assert "ranks [1] were launched with a configuration different from rank 0's " \
           "(rank 1: seed=2 vs 1)" in result.output, result.tail()
    assert not any(tmp_path.iterdir())


def test_torch_threads_sleep_when_idle_unless_the_user_says_otherwise():
    """OpenMP's waiting threads sleep (a spinning one lost its core to any busy process:
    a 1-rank run 12x slower beside a CI run); a user's own setting is kept."""
    assert apply_mpi_defaults({})["OMP_WAIT_POLICY"] == "PASSIVE" == THREAD_DEFAULTS[
        "OMP_WAIT_POLICY"]
    assert apply_mpi_defaults({"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"
    probe = "import os, mpirl.run, torch; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, env={**env, "PYTHONPATH": str(ROOT)})
    assert done.stdout.split() == ["PASSIVE"], done.stderr      # set before torch loads
