"""Elastic commits and restarts, the ranks' side (docs/faults.md, "Elastic training"):
attempts launched as the driver launches them (``MPIRL_ELASTIC_JOB``/``_ATTEMPT``),
under real mpiexec, on one host.  The driver and a node's loss:
tests/cluster/test_elastic_cluster.py."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest
import torch

from PIL import Image

from analysis.elastic import attempts_table, load_job
from analysis.elastic import main as elastic_main
from mpirl.config import Config, ConfigError
from mpirl.telemetry.read import load_run
from tests.mpirun import run_mpi, start_mpi

CARTPOLE = ["-m", "mpirl.run", "--env", "CartPole-v1", "--num-envs", "2",
            "--rollout-steps", "32", "--commit-every", "4", "--checkpoint-every", "0"]


def launch(tmp_path, number: int, total: int) -> tuple[list[str], dict]:
    """mpirl.run's arguments, and what the driver sets, for attempt ``number`` of job
    ``t`` with a budget of ``total`` env steps."""
    return ([*CARTPOLE, "--total-steps", str(total), "--run-dir", str(tmp_path / "runs"),
             "--run-name", "job"],
            {"MPIRL_ELASTIC_JOB": "t", "MPIRL_ELASTIC_ATTEMPT": str(number),
             "MPIRL_COMMIT_DIR": str(tmp_path / "memory")})


def attempt(tmp_path, nranks: int, number: int, total: int):
    argv, env = launch(tmp_path, number, total)
    return run_mpi(nranks, argv, env=env, timeout_s=120)


def test_a_restart_at_fewer_ranks_continues_from_the_commit(tmp_path, capsys):
    """3 ranks stopped by SIGTERM once rank 0 passed update 20 (as the driver stops an
    attempt for a rejoin): every rank stops at its next rollout and commits.  A restart
    at 2 ranks loads that commit (the stop checkpoint's parameters), numbers its updates
    on, spends the rest of the budget at 128 env steps per update, and, finished, frees
    its node's commit."""
    argv, env = launch(tmp_path, 0, 10_000_000)
    first = start_mpi(3, argv, env=env)
    first.reached(tmp_path / "runs/job/attempt0", 0, 20)
    first.signal(signal.SIGTERM)
    assert first.wait(120) == 143, first.tail()
    host = load_run(tmp_path / "runs/job/attempt0").meta["hostnames"][0]
    commit = torch.load(tmp_path / "memory/t" / host / "commit.pt", weights_only=True)
    at = commit["update"]
    assert at >= 20 and commit["ranks"] == 3 and commit["counters"]["env_steps"] == at * 192
    stopped = torch.load(tmp_path / "runs/job/attempt0/checkpoints/rank0000.pt",
                         weights_only=True)
    assert torch.equal(commit["learner"]["params"], stopped["params"])

    job = attempt(tmp_path, 2, 1, at * 192 + 10 * 128)
    assert "attempt 1: 2 ranks" in job.output and f"continuing from update {at} " \
        f"({at * 192} env steps)" in job.output, job.tail()
    second = load_run(tmp_path / "runs/job/attempt1")
    assert sorted(second.updates["update"].unique()) == list(range(at + 1, at + 11))
    assert second.summary["env_steps"] == at * 192 + 10 * 128
    record = json.loads((tmp_path / "runs/job/attempt1/elastic.json").read_text())
    assert record["restored"]["update"] == at and record["restored"]["committed_by_ranks"] == 3
    assert record["ranks"] == 2
    assert record["commits"] == sum(1 for u in range(at + 1, at + 11) if u % 4 == 0)
    assert not (tmp_path / "memory/t" / host).exists()        # done: freed
    table = attempts_table(load_job(tmp_path / "runs/job"))
    assert table["ranks"].tolist() == [3, 2] and table.loc[1, "lost_updates"] == 0
    the_attempts_read_back_as_one_job(tmp_path, capsys)


def the_attempts_read_back_as_one_job(tmp_path, capsys):
    """``python -m analysis.elastic``: one row per attempt, and the figure."""
    figure = tmp_path / "elastic.png"
    assert elastic_main([str(tmp_path / "runs/job"), "-o", str(figure)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split()[:4] == ["attempt", "ranks", "nodes", "first_update"]
    assert printed[2].split()[:2] == ["1", "2"] and f"figure: {figure}" in printed[-1]
    with Image.open(figure) as image:
        assert image.size[0] > 500 and len(np.unique(np.asarray(image.convert("L")))) > 10
    with pytest.raises(SystemExit):
        elastic_main([str(tmp_path / "runs")])     # not a job's directory: one line, exit 2
    assert "no attempt directories" in capsys.readouterr().err


def test_a_restart_with_no_commit_anywhere_starts_afresh(tmp_path):
    job = attempt(tmp_path, 2, 3, 10 * 128)
    assert "no node holds a commit: starting afresh" in job.output, job.tail()
    assert load_run(tmp_path / "runs/job/attempt3").updates["update"].min() == 1


@pytest.mark.parametrize("fields, env, message", [
    ({"commit_every": -1}, {}, "commit_every=-1"),
    ({"commit_every": 5, "mode": "async", "topology": "star"}, {},
     "commit_every with mode='async'.*allowed with --commit-every: mode sync"),
    ({"commit_every": 5, "on_failure": "shrink"}, {}, "commit_every with on_failure='shrink'"),
    ({}, {"MPIRL_ELASTIC_JOB": "j"}, "commit_every=0 under an elastic driver"),
    ({"commit_every": 5}, {"MPIRL_ELASTIC_JOB": "j", "MPIRL_ELASTIC_ATTEMPT": "x"},
     "MPIRL_ELASTIC_ATTEMPT='x'; allowed: 0, 1, 2"),
])
def test_bad_elastic_settings_are_refused_at_start(monkeypatch, tmp_path, fields, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cfg = Config(run_dir=str(tmp_path), **fields)
    with pytest.raises(ConfigError, match=message):
        cfg.validate(2)


def test_an_attempt_never_writes_over_an_earlier_one(monkeypatch, tmp_path):
    (tmp_path / "job/attempt1").mkdir(parents=True)
    (tmp_path / "job/attempt1/config.yaml").write_text("{}")
    monkeypatch.setenv("MPIRL_ELASTIC_JOB", "j")
    monkeypatch.setenv("MPIRL_ELASTIC_ATTEMPT", "1")
    with pytest.raises(ConfigError, match="job/attempt1 already holds a run"):
        Config(run_dir=str(tmp_path), run_name="job", commit_every=5).validate(2)
