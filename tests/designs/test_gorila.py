"""gorila and async over sharded parameter servers, under mpiexec: shards of the same
push sequence end identical to one server (Adam and SGD), the leaving protocol ends
every shard, every push is applied or dropped, and each server carries only its shard;
gorila over replay ranks (--gorila-replay service) accounts for every transition."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from conftest import kill_an_actor, train
from mpirun import ROOT, run_mpi

CHECK = str(ROOT / "tests" / "mpi" / "check_sharded.py")


def _digests(lines: list[str]) -> dict[str, str]:
    return dict(line.split() for line in lines if line.startswith(("worker ", "servers ")))


#: check_sharded.py's cases by rank count (S servers, one worker): the same push
#: sequences over one server and over three shards, and a worker stopped by shard 0 alone
SHARDED = {2: ["1:adam:25", "1:sgd:25"], 4: ["3:adam:25", "3:sgd:25", "3:adam:10:leave"]}


@pytest.fixture(scope="module")
def sharded() -> dict[str, list[str]]:
    """Every case of SHARDED, one launch per rank count (one case after another: a launch
    costs a torch import per rank); each case's printed lines, its prefix removed, by
    case, and under "" every line of the launches that no case's prefix claims."""
    lines: dict[str, list[str]] = {"": []}
    for nranks, cases in SHARDED.items():
        output = run_mpi(nranks, [CHECK, *cases], timeout_s=120).output.splitlines()
        prefixes = tuple(f"[{case}] " for case in cases)
        for case, prefix in zip(cases, prefixes, strict=True):
            lines[case] = [line[len(prefix):] for line in output if line.startswith(prefix)]
        lines[""] += [line for line in output if not line.startswith(prefixes)]
    return lines


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_sharded_servers_end_identical_to_one(sharded, kind):
    one = _digests(sharded[f"1:{kind}:25"])
    three = _digests(sharded[f"3:{kind}:25"])
    assert one["worker"] == one["servers"] == three["worker"] == three["servers"]


def test_a_worker_stopped_by_shard_0_leaves_the_others(sharded):
    lines = sharded["3:adam:10:leave"]
    applied = sorted(line for line in lines if "applied" in line)
    # shard 0 stopped the worker at its 11th push; shards 1 and 2 applied it, then
    # took the leaving push (answered STOP): every shard ended
    assert applied == ["shard 0 applied 10", "shard 1 applied 11", "shard 2 applied 11"]
    assert not [line for line in sharded[""] if "applied" in line], sharded[""]
    d = _digests(lines)
    assert d["worker"] == d["servers"]


@pytest.mark.parametrize("nranks, servers, mode", [(3, 1, "gorila"), (5, 3, "gorila"),
                                                    (5, 2, "async")])
def test_every_push_is_applied_or_dropped_and_each_server_holds_its_shard(
        tmp_path, nranks, servers, mode):
    extra = (["--learning-starts", "64", "--replay-batch", "32", "--replay-capacity", "2000"]
             if mode == "gorila" else ["--topology", "star", "--checkpoint-every", "0"])
    _, s = train(tmp_path, nranks, "--mode", mode, "--servers", str(servers),
                 "--total-steps", "1500", *extra)
    assert s["gradients_sent"] == s["gradients_applied"] + s["gradients_dropped"]
    assert s["env_steps"] >= 1500 and s["updates"] > 0
    staleness = np.load(tmp_path / "r" / "staleness.npy")
    assert len(staleness) == s["gradients_applied"] and staleness.min() >= 0
    recv = []
    for r in range(servers):
        with h5py.File(tmp_path / "r" / f"rank{r:04d}.h5", "r") as f:
            assert f.attrs["role"] == "server"
            u = f["updates"][:]
            recv.append(u["bytes_recv"].sum() / len(u))
    # every server receives its shard of each push: 1/S of the gradient each
    per_push = np.asarray(recv)
    assert per_push.sum() == pytest.approx(s["gradient_bytes"] + 8 * 9 * servers, rel=0.01)
    assert per_push.max() / per_push.min() < 1.05
    with h5py.File(tmp_path / "r" / f"rank{servers:04d}.h5", "r") as f:
        u = f["updates"][:]
        assert f.attrs["role"] == "worker" and len(u) > 0
        assert (u["bytes_sent"] >= s["gradient_bytes"]).all()


def test_servers_at_least_the_rank_count_are_refused(tmp_path):
    result = run_mpi(3, ["-m", "mpirl.run", "--mode", "gorila", "--servers", "3",
                         "--run-dir", str(tmp_path)], timeout_s=60, check=False)
    assert result.returncode == 2 and result.output.count("mpirl.run: error:") == 1
    assert "servers=3 with 3 ranks leaves no worker; allowed: 1..2" in result.output
    assert not any(tmp_path.iterdir())


def test_a_killed_worker_ends_the_job_naming_it(tmp_path):
    kill_an_actor(tmp_path, "gorila", 4, "--servers", "2", "--env-arg", "actions=5",
                  "--learning-starts", "64", "--replay-batch", "16")


@pytest.mark.parametrize("nranks, servers, replays", [(4, 1, 1), (7, 2, 2)])
def test_the_replay_service_takes_every_transition_and_serves_every_worker(
        tmp_path, nranks, servers, replays):
    _, s = train(tmp_path, nranks, "--mode", "gorila", "--gorila-replay", "service",
                 "--servers", str(servers), "--replay-ranks", str(replays),
                 "--learning-starts", "64", "--replay-batch", "32", "--replay-capacity",
                 "1200", "--total-steps", "4000")
    run_dir = tmp_path / "r"
    # (the run checks sent = inserted = stored + evicted and priorities sent = applied
    # + stale itself; here the replay ranks' logs must say the same)
    assert s["transitions_sent"] == s["transitions_inserted"] >= 4000
    assert s["replay_evicted"] > 0 and s["priority_updates"] > 0
    assert s["gradients_sent"] == s["gradients_applied"] + s["gradients_dropped"]
    inserted = sampled = 0
    for r in range(servers, servers + replays):
        with h5py.File(run_dir / f"rank{r:04d}.h5", "r") as f:
            assert f.attrs["role"] == "replay"
            u = f["updates"][:]
        inserted += u["inserted"].sum()
        sampled += u["sampled"].sum()
        assert (u["replay_size"] <= 1200 // replays).all()
    assert inserted == s["transitions_inserted"] and sampled == s["transitions_sampled"]
    # every push trained on one sampled batch of 32 (a last batch may go unused)
    assert s["gradients_sent"] * 32 <= sampled <= (s["gradients_sent"] + nranks) * 32
    workers = range(servers + replays, nranks)
    for r in workers:
        with h5py.File(run_dir / f"rank{r:04d}.h5", "r") as f:
            assert f.attrs["role"] == "worker"
            u = f["updates"][:]
        assert len(u) > 0 and np.isfinite(u["value_loss"]).all()
        # each push carries the gradient's shards; the blocks and requests travel too
        assert u["bytes_sent"].sum() > len(u) * s["gradient_bytes"]
