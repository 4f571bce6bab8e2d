"""Checkpoints and --resume.  sync: a killed run continues to the same parameters, its
log continues in place with no update twice or missing; SIGTERM checkpoints and stops.
sync-replay: the same with each rank's replay in its checkpoint.  async/quorum: a killed
run (a worker or the server dies) resumes from the newest complete snapshot generation
and completes its budget with every push counted once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import h5py
import numpy as np
import pytest
import torch

from conftest import BATCH, launch_runs, train_many
from mpirl.config import Config
from mpirl.resilience import checkpoint
from mpirl.resilience.sentinel import read_status, status_dir
from mpirl.telemetry.progress import read_progress
from mpirl.telemetry.read import load_run
from mpirun import run_mpi, start_mpi

RUN = ["--total-steps", "2560", *BATCH, "--checkpoint-every", "5", "--log-flush-every", "7"]


def same_rows(a: np.ndarray, b: np.ndarray) -> bool:
    """Log rows bit for bit (NaN columns included: a server's losses, approx_kl without
    the clipped objective), as a resume copies them."""
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


def summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def test_killed_run_resumes_to_the_same_parameters_and_a_complete_log(tmp_path):
    killed = run_mpi(3, ["-m", "mpirl.run", *RUN, "--run-dir", str(tmp_path), "--run-name",
                         "cut", "--fail", "1@37"], timeout_s=180, check=False)
    assert killed.returncode != 0 and not (tmp_path / "cut" / "summary.json").exists()
    # the resume and the uninterrupted run in one launch (tests/mpi/runs.py), the resume
    # first: it starts in fresh processes, as a user's resume does
    both = launch_runs(3, [["--resume", str(tmp_path / "cut")],
                           [*RUN, "--run-dir", str(tmp_path), "--run-name", "full"]])
    assert "injected failure" not in both.output       # --fail is not carried over
    full, cut = summary(tmp_path / "full"), summary(tmp_path / "cut")
    assert cut["param_digest"] == full["param_digest"]     # bit-identical continuation
    assert (cut["updates"], cut["env_steps"]) == (full["updates"], full["env_steps"])
    for r in range(3):
        with h5py.File(tmp_path / "cut" / f"rank{r:04d}.h5", "r") as f, \
                h5py.File(tmp_path / "full" / f"rank{r:04d}.h5", "r") as g:
            updates = f["updates"]["update"]
            assert list(updates) == list(range(1, full["updates"] + 1))   # none twice, none lost
            assert np.array_equal(f["episodes"]["return"], g["episodes"]["return"])
            assert np.all(np.diff(f["updates"]["t_s"]) > 0)   # one clock across the resume
    # progress.csv holds each line once (those written after the checkpoint were dropped)
    cut_lines, full_lines = (read_progress(tmp_path / name) for name in ("cut", "full"))
    assert same_rows(cut_lines["env_steps"], full_lines["env_steps"])
    # run.h5 lists each start: the first, then the resume from the last checkpoint (every
    # 5th update) before update 37, on this machine's host for each of the 3 ranks
    with h5py.File(tmp_path / "cut" / "run.h5", "r") as f, \
            h5py.File(tmp_path / "full" / "run.h5", "r") as g:
        starts, once = json.loads(f.attrs["attempts_json"]), json.loads(g.attrs["attempts_json"])
        assert [a["from_update"] for a in starts] == [None, 35] and len(once) == 1
        assert starts[0]["hostnames"] == json.loads(f.attrs["hostnames_json"])
        assert all(len(a["hostnames"]) == 3 and a["cluster"]["ranks_on"] for a in starts)
        assert starts[0]["start_unix_s"] == f.attrs["start_unix_s"] < starts[1]["start_unix_s"]
    assert load_run(tmp_path / "cut").meta["attempts"] == starts       # as analysis reads it


def test_ctrl_c_checkpoints_on_every_rank_and_the_run_resumes(tmp_path):
    """Ctrl-C (SIGINT to mpiexec, which forwards it): exit 130, as shells report it, and
    the whole resume command printed; resumed with a larger budget, which config.yaml
    keeps, saying where it resumed."""
    args = ["--total-steps", "24000", *BATCH, "--checkpoint-every", "1000", "--log-every", "5"]
    out, stopped_at = stop_with_sigterm(2, args, tmp_path / "t", progress_lines=2,
                                        sig=signal.SIGINT)
    assert f"continue with  mpirun -np 2 python -m mpirl.run --resume {tmp_path / 't'}" in out
    assert 0 < stopped_at < 750
    for r in range(2):
        assert (tmp_path / "t" / "checkpoints" / f"rank{r:04d}.pt").is_file()
        with h5py.File(tmp_path / "t" / f"rank{r:04d}.h5", "r") as f:   # closed cleanly
            assert f["updates"]["update"][-1] == stopped_at
    resumed = run_mpi(2, ["-m", "mpirl.run", "--resume", str(tmp_path / "t"),
                          "--total-steps", "25600"], timeout_s=240)
    assert "resuming with total_steps 24000 -> 25600 (saved to" in resumed.output
    assert f"resumed {tmp_path / 't'} at update {stopped_at} (" in resumed.output
    assert summary(tmp_path / "t")["env_steps"] == 25600
    assert Config.from_yaml(tmp_path / "t" / "config.yaml").total_steps == 25600


# -- sync-replay: a replay in every checkpoint ---------------------------------------------
#: DQN on CartPole at 3 ranks: the replays warm up over 200 rollouts (rows and episodes of
#: update 0), checkpoints every 30 rollouts; 2 updates per rollout after
REPLAY_RUN = ["--mode", "sync-replay", "--env", "CartPole-v1", "--num-envs", "1",
              "--rollout-steps", "1", "--hidden", "64", "64", "--activation", "relu", "--lr",
              "0.001", "--max-grad-norm", "0", "--seed", "1", "--n-step", "1",
              "--replay-batch", "128", "--learning-starts", "600", "--replay-capacity",
              "50000", "--total-steps", "1500", "--update-repeat", "2", "--checksum-every",
              "10", "--checkpoint-every", "30", "--log-flush-every", "7", "--log-every", "25"]


def test_killed_sync_replay_run_resumes_to_the_same_parameters_and_a_complete_log(tmp_path):
    """Killed at update 10 (rollout 205), it resumes from the checkpoint of rollout 180,
    inside the warm-up: the warm-up rows and episodes written after it (all of update 0)
    are cut by the row counts the checkpoint keeps, and the replays, the sampling RNG
    and the envs continue where they were."""
    killed = run_mpi(3, ["-m", "mpirl.run", *REPLAY_RUN, "--run-dir", str(tmp_path),
                         "--run-name", "cut", "--fail", "1@10"], timeout_s=180, check=False)
    assert killed.returncode != 0 and not (tmp_path / "cut" / "summary.json").exists()
    both = launch_runs(3, [["--resume", str(tmp_path / "cut")],
                           [*REPLAY_RUN, "--run-dir", str(tmp_path), "--run-name", "full"]])
    assert f"resumed {tmp_path / 'cut'} at update 0 (540 env steps)" in both.output
    full, cut = summary(tmp_path / "full"), summary(tmp_path / "cut")
    assert cut["param_digest"] == full["param_digest"]     # bit-identical continuation
    for key in ("updates", "env_steps", "transitions_inserted", "transitions_sampled"):
        assert cut[key] == full[key], key
    for r in range(3):
        with h5py.File(tmp_path / "cut" / f"rank{r:04d}.h5", "r") as f, \
                h5py.File(tmp_path / "full" / f"rank{r:04d}.h5", "r") as g:
            for name in ("update", "env_steps", "replay_size", "value_loss"):
                assert same_rows(f["updates"][name], g["updates"][name]), name
            assert same_rows(f["episodes"]["return"], g["episodes"]["return"])
            assert (f["episodes"]["update"] == 0).any()      # the warm-up had episodes
            assert np.all(np.diff(f["updates"]["t_s"]) > 0)
    # progress.csv: the lines the killed run wrote after its checkpoint are not kept twice
    cut_lines, full_lines = (read_progress(tmp_path / name) for name in ("cut", "full"))
    for column in ("update", "env_steps", "episodes", "mean_return"):
        assert same_rows(cut_lines[column], full_lines[column]), column


def test_sigterm_stops_a_sync_replay_run_with_a_checkpoint_and_it_resumes(tmp_path):
    """SIGTERM (Slurm's time limit) mid-run: every rank checkpoints its replay at the same
    rollout and exits 143 with the resume command; checkpoints of different rollouts are
    refused in one line; resumed with a larger budget."""
    args = [*REPLAY_RUN, "--total-steps", "60000", "--checkpoint-every", "0"]
    run_dir = tmp_path / "t"
    out, stopped_at = stop_with_sigterm(2, args, run_dir, progress_lines=3)
    saved = [checkpoint.load(run_dir, r) for r in range(2)]
    for state in saved:
        replay = state["memory.replay"]
        assert len(replay["stamp"]) == replay["inserted"] > 0   # the replay, whole
        assert (state["update"], state["env_steps"]) == (stopped_at, saved[0]["env_steps"])
    steps = saved[0]["env_steps"]
    assert steps >= 100               # after progress.csv's header and 2 lines, 50 apart
    # rank 1's file one rollout behind: a job killed while its ranks wrote them
    checkpoint.save(run_dir, 1, {**saved[1], "rollouts": saved[1]["rollouts"] - 1})
    refused = run_mpi(2, ["-m", "mpirl.run", "--resume", str(run_dir)], timeout_s=120,
                      check=False)
    assert refused.returncode == 2 and "checkpoints are of different rollouts" in \
        refused.output, refused.output[-2000:]
    # rank 1's file of another format (no rollout count): said so, not "cannot be read"
    checkpoint.save(run_dir, 1, {k: v for k, v in saved[1].items() if k != "rollouts"})
    refused = run_mpi(2, ["-m", "mpirl.run", "--resume", str(run_dir)], timeout_s=120,
                      check=False)
    assert refused.returncode == 2 and "rank 1: rank0001.pt records no rollouts" in \
        refused.output, refused.output[-2000:]
    checkpoint.save(run_dir, 1, saved[1])
    resumed = run_mpi(2, ["-m", "mpirl.run", "--resume", str(run_dir),
                          "--total-steps", str(steps + 1500)], timeout_s=240)
    assert f"resumed {run_dir} at update {stopped_at} ({steps} env steps)" in resumed.output
    done = summary(run_dir)
    assert done["env_steps"] == done["transitions_inserted"] == steps + 1500


def test_resume_is_refused_where_it_cannot_work(tmp_path):
    result = run_mpi(2, ["-m", "mpirl.run", "--resume", str(tmp_path / "nothing")],
                     timeout_s=60, check=False)
    assert result.returncode == 2 and "no " in result.output and "config.yaml" in result.output
    # and a run half as long, whose rank 1 ends at an earlier update
    train_many(tmp_path, 2, {"two": RUN, "half": [*RUN, "--total-steps", "1280"]})
    result = run_mpi(3, ["-m", "mpirl.run", "--resume", str(tmp_path / "two")], timeout_s=60,
                     check=False)
    assert result.returncode == 2 and "no checkpoint for ranks [2]" in result.output
    # rank 1's checkpoint from the other run: the ranks would resume apart (a job killed
    # while its ranks wrote their checkpoints leaves them so); refused on every rank
    progress_before = (tmp_path / "two" / "progress.csv").read_text()
    shutil.copy(tmp_path / "half" / "checkpoints" / "rank0001.pt",
                tmp_path / "two" / "checkpoints" / "rank0001.pt")
    result = run_mpi(2, ["-m", "mpirl.run", "--resume", str(tmp_path / "two")], timeout_s=60,
                     check=False)
    assert result.returncode == 2, result.tail()
    assert "checkpoints are of different rollouts (rank 0: update 80 (rollout 80), " \
        "rank 1: update 40 (rollout 40))" in result.output, result.tail()
    # rank 1's file cut short (a disk filled while it was written): every rank is told
    ckpt = tmp_path / "two" / "checkpoints" / "rank0001.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    result = run_mpi(2, ["-m", "mpirl.run", "--resume", str(tmp_path / "two")], timeout_s=60,
                     check=False)
    assert result.returncode == 2 and "resume=" in result.output, result.tail()
    assert ": rank 1: " in result.output, result.tail()
    assert (tmp_path / "two" / "progress.csv").read_text() == progress_before


# -- async / quorum --------------------------------------------------------------------------
PS_RUN = ["--topology", "star", "--total-steps", "3000", *BATCH, "--log-flush-every", "2",
          "--log-every", "5"]


def rows(path, table="updates"):
    with h5py.File(path, "r", libver="latest", swmr=True) as f:   # also a crashed file
        return f[table][...]


def check_parameter_server_run(run_dir, nranks, mode, total_steps):
    """The finished run: budget spent, sent == applied + dropped, and every rank's log
    holds each of its rows exactly once."""
    s = summary(run_dir)
    assert s["env_steps"] >= total_steps
    assert s["gradients_sent"] == s["gradients_applied"] + s["gradients_dropped"]
    pushes = 0
    for r in range(1, nranks):
        with h5py.File(run_dir / f"rank{r:04d}.h5", "r") as f:     # closed cleanly
            u, episodes = f["updates"][...], f["episodes"]["update"]
        # a worker's rows are its pushes 1..P, none twice, none missing, on one clock
        assert list(u["update"]) == list(range(1, len(u) + 1))
        assert np.all(np.diff(u["t_s"]) > 0)
        assert np.all(np.diff(episodes) >= 0) and episodes[-1] <= len(u)
        pushes += len(u)
    assert pushes == s["gradients_sent"]
    with h5py.File(run_dir / "rank0000.h5", "r") as f:
        u = f["updates"][...]
    # the server: one row per push taken, each once; versions never go back
    assert len(u) == s["gradients_sent"]
    assert int((u["dropped"] == 0).sum()) == s["gradients_applied"]
    assert np.all(np.diff(u["update"]) >= 0) and u["update"][-1] == s["updates"]
    assert np.all(np.diff(u["t_s"]) > 0)
    if mode == "async":      # one step per applied push: versions 1..updates, each once
        assert s["gradients_applied"] == s["updates"]
        assert sorted(u["update"][u["dropped"] == 0]) == list(range(1, s["updates"] + 1))
    else:                    # every round's step closes with the push that completed it
        assert set(range(1, s["updates"] + 1)) <= set(u["update"].tolist())
    assert len(np.load(run_dir / "staleness.npy")) == s["gradients_applied"]
    return s


@pytest.mark.parametrize("mode, nranks, every, fail", [
    ("async", 3, 25, "1@31:exit"),                         # a worker dies
    ("quorum", 4, 10, "0@40:exit"),                        # the server dies
])
def test_killed_parameter_server_run_resumes_with_every_push_counted_once(
        tmp_path, mode, nranks, every, fail):
    args = ["-m", "mpirl.run", "--mode", mode, *PS_RUN, "--checkpoint-every", str(every)]
    if mode == "quorum":     # and the server's observation statistics, which travel back
        args += ["--quorum", "2", "--obs-norm"]
    # The case wanted has server rows after the cut to undo.  Which snapshot is the last
    # complete one is the machine's doing: a worker far ahead of the other (30 pushes
    # against 21, seen) can die right after the cut completes, leaving no row after it.
    # Such a killed run is a valid run but not this case: it is run again, twice at most.
    for attempt in range(3):
        run_dir = tmp_path / f"cut{attempt}"
        killed = run_mpi(nranks, [*args, "--run-dir", str(tmp_path), "--run-name",
                                  run_dir.name, "--fail", fail], timeout_s=180, check=False)
        assert killed.returncode != 0 and not (run_dir / "summary.json").exists(), \
            killed.tail()
        generation = checkpoint.latest_complete(run_dir, nranks)
        assert generation is not None and generation >= 2, checkpoint.generations(run_dir)
        server = torch.load(checkpoint.path_for(run_dir, 0, generation), weights_only=True)
        assert server["generation"] == generation
        before = {r: rows(run_dir / f"rank{r:04d}.h5") for r in range(nranks)}
        if len(before[0]) > server["rows"]:     # the log has rows after the cut to undo
            break
    else:
        pytest.fail(f"3 killed runs left no server row after their last snapshot: "
                    f"{len(before[0])} rows, cut at {server['rows']}")
    states = {r: torch.load(checkpoint.path_for(run_dir, r, generation), weights_only=True)
              for r in range(1, nranks)}
    episodes_before = {r: rows(run_dir / f"rank{r:04d}.h5", "episodes")
                       for r in range(1, nranks)}
    resumed = run_mpi(nranks, ["-m", "mpirl.run", "--resume", str(run_dir)], timeout_s=180)
    assert "injected failure" not in resumed.output
    s = check_parameter_server_run(run_dir, nranks, mode, 3000)
    assert s["snapshots"] > server["snapshots"]
    if mode == "quorum":     # restored at the cut: each env step's observation merged once
        last = checkpoint.latest_complete(run_dir, nranks)
        final = torch.load(checkpoint.path_for(run_dir, 0, last), weights_only=True)
        assert final["obs_stats"][0].item() == final["env_steps"] > server["env_steps"]
    # the logs were continued in place: the rows up to the cut are the killed run's own,
    # and so are each worker's episodes up to its checkpoint (none added, none lost)
    after = rows(run_dir / "rank0000.h5")
    assert same_rows(after[:server["rows"]], before[0][:server["rows"]])
    for r, state in states.items():
        cut = state["pushes"]
        assert server["received"][r] == cut      # the cut is consistent
        assert same_rows(rows(run_dir / f"rank{r:04d}.h5")[:cut], before[r][:cut])
        episodes, old = rows(run_dir / f"rank{r:04d}.h5", "episodes"), episodes_before[r]
        assert np.array_equal(episodes[episodes["update"] <= cut], old[old["update"] <= cut])
    # only the newest complete generations are kept
    assert len(checkpoint.generations(run_dir)) <= 2


def stop_with_sigterm(nranks: int, args: list[str], run_dir, *, progress_lines: int,
                      rank: int | None = None,
                      sig: int = signal.SIGTERM) -> tuple[str, int]:
    """Start a run, send ``sig`` once progress.csv has ``progress_lines`` lines (to
    mpiexec, which forwards it to every rank, or to ``rank`` alone), check that it
    stopped (exit 128 + sig, the resume command); return its output and the update it
    stopped after."""
    with start_mpi(nranks, ["-m", "mpirl.run", *args, "--run-dir", str(run_dir.parent),
                            "--run-name", run_dir.name]) as job:
        progress = run_dir / "progress.csv"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (
                progress.is_file() and progress.read_text().count("\n") >= progress_lines):
            time.sleep(0.2)
        # what Slurm does at the time limit: to mpiexec, or to one rank (its pid: from the
        # status file it publishes for its sentinel)
        if rank is None:
            job.signal(sig)
        else:
            os.kill(read_status(status_dir(run_dir) / f"rank{rank:04d}")["pid"], sig)
        job.wait(60, what=f"the run did not stop within 60 s of signal {sig}")
    out = job.output
    assert job.returncode == 128 + sig, out[-2000:]
    assert "stopped by a signal after update" in out and "--resume" in out
    return out, int(out.split("stopped by a signal after update ")[1].split(";")[0])


# async: the launcher forwards SIGTERM to every rank; quorum: only worker 2 gets it and
# must tell the server in its next push
@pytest.mark.parametrize("mode, signalled", [("async", None), ("quorum", 2)])
def test_sigterm_stops_a_parameter_server_run_with_a_snapshot_and_it_resumes(
        tmp_path, mode, signalled):
    args = ["--mode", mode, "--topology", "star", "--total-steps", "12000",
            "--num-envs", "2", "--rollout-steps", "8", "--checkpoint-every", "1000",
            "--log-every", "5"]
    run_dir = tmp_path / "t"
    out, stopped_at = stop_with_sigterm(3, args, run_dir, progress_lines=3, rank=signalled)
    assert 0 < stopped_at < 700
    # one snapshot (the stop's), written by every rank; logs closed at its cut
    assert checkpoint.generations(run_dir) == [1] and checkpoint.complete(run_dir, 1, 3)
    server = torch.load(checkpoint.path_for(run_dir, 0, 1), weights_only=True)
    assert server["version"] == stopped_at
    with h5py.File(run_dir / "rank0000.h5", "r") as f:
        assert len(f["updates"]) == server["rows"]
    for r in (1, 2):
        state = torch.load(checkpoint.path_for(run_dir, r, 1), weights_only=True)
        assert server["received"][r] == state["pushes"]
        with h5py.File(run_dir / f"rank{r:04d}.h5", "r") as f:
            assert f["updates"]["update"][-1] == state["pushes"]
    if mode == "async":    # rank 2's file cut short: refused on every rank, config.yaml kept
        ckpt, config = checkpoint.path_for(run_dir, 2, 1), (run_dir / "config.yaml")
        whole, before = ckpt.read_bytes(), config.read_text()
        ckpt.write_bytes(whole[:1000])
        refused = run_mpi(3, ["-m", "mpirl.run", "--resume", str(run_dir), "--total-steps",
                              "13000"], timeout_s=120, check=False)
        said = ": rank 2: rank0002.pt cannot be read (RuntimeError: "
        assert refused.returncode == 2 and said in refused.output, refused.tail()
        assert config.read_text() == before
        ckpt.write_bytes(whole)
    resumed = run_mpi(3, ["-m", "mpirl.run", "--resume", str(run_dir)], timeout_s=240)
    assert f"resumed {run_dir} from checkpoint generation 1" in resumed.output
    assert "resuming with" not in resumed.output          # no flag given: nothing changed
    check_parameter_server_run(run_dir, 3, mode, 12000)


def test_parameter_server_resume_needs_a_complete_generation(tmp_path):
    run_dir = tmp_path / "r"
    (run_dir / "checkpoints" / "g000001").mkdir(parents=True)
    Config.from_dict({"mode": "async", "topology": "star"}).save(run_dir / "config.yaml")
    for r in (0, 1):      # rank 2's file is missing: generation 1 is incomplete
        (run_dir / "checkpoints" / "g000001" / f"rank{r:04d}.pt").write_bytes(b"")
    result = run_mpi(3, ["-m", "mpirl.run", "--resume", str(run_dir)], timeout_s=60,
                     check=False)
    assert result.returncode == 2, result.tail()
    assert "no checkpoint generation that all 3 ranks wrote (found generations [1]" \
        in result.output
