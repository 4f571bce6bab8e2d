"""apex under mpiexec: transitions through replay ranks, sampled by priority, with
priorities sent back; every count adds up, the replays' logs say the same as the
summary, the training-intensity bound holds, and a killed actor ends the job."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from conftest import kill_an_actor, train

#: a small apex run: learning starts early, small batches
APEX = ["--mode", "apex", "--learning-starts", "128", "--replay-batch", "32",
        "--actor-refresh-steps", "64"]


def _rows(run_dir, rank):
    with h5py.File(run_dir / f"rank{rank:04d}.h5", "r") as f:
        return f.attrs["role"], f["updates"][:]


@pytest.mark.parametrize("nranks, replays", [(3, 1), (6, 2)])
def test_every_transition_is_inserted_and_every_count_adds_up(tmp_path, nranks, replays):
    job, s = train(tmp_path, nranks, *APEX, "--replay-ranks", str(replays),
                   "--replay-capacity", "1200", "--total-steps", "4000")
    run_dir = tmp_path / "r"
    # (the run itself checks sent = inserted = stored + evicted and priorities sent =
    # applied + stale, and fails otherwise; here the logs must say the same)
    assert s["transitions_sent"] == s["transitions_inserted"] >= 4000
    assert s["replay_evicted"] > 0                        # 1200 / R slots each: FIFO at work
    assert s["env_steps"] >= 4000 and s["updates"] > 0
    assert s["reply_progress"] == "thread"     # auto: the learner shares its node here
    beside = "replay rank 1" if replays == 1 else "replay ranks 1, 2"
    assert (f"the learner's parameter replies move on a progress thread ({beside} on its "
            "node)") in job.output
    assert s["transitions_sampled"] >= 32 * s["updates"]
    inserted = sampled = applied = 0
    for r in range(1, 1 + replays):
        role, u = _rows(run_dir, r)
        assert role == "replay"
        inserted += u["inserted"].sum()
        sampled += u["sampled"].sum()
        applied += u["prio_updates"].sum()
        assert (u["replay_size"] <= 1200 // replays).all() and u["replay_s"].sum() > 0
    assert inserted == s["transitions_inserted"] and sampled == s["transitions_sampled"]
    assert applied == s["priority_updates"] > 0
    role, u = _rows(run_dir, 0)
    assert role == "learner" and list(u["update"]) == list(range(1, s["updates"] + 1))
    assert np.isfinite(u["value_loss"]).all() and (u["sampled"] == 32).all()
    assert (u["policy_lag_max"] >= 0).all()
    lag = np.load(run_dir / "policy_lag.npy")
    assert len(lag) == 32 * s["updates"] and lag.min() >= 0
    assert lag.mean() == pytest.approx(s["mean_policy_lag"])
    role, u = _rows(run_dir, nranks - 1)
    assert role == "actor" and (u["inserted"] == 16).all()      # 2 envs x 8 steps per block
    assert u["env_s"].sum() > 0 and u["send_s"].sum() >= 0
    assert s["bytes_per_env_step"] > 0


def test_a_learner_fed_over_the_network_gets_no_progress_thread_unless_asked(tmp_path):
    """--reply-progress auto (the default) gives the learner a progress thread only where
    a replay rank shares its node (every run above: "thread"); MPIR_CVAR_NOLOCAL=1 makes
    MPICH take every rank for a node of its own, and the replies then move inside its
    calls, unless --reply-progress thread asks for the thread."""
    nolocal = {"MPIR_CVAR_NOLOCAL": "1"}
    job, s = train(tmp_path, 3, *APEX, "--total-steps", "1000", env=nolocal)
    assert s["reply_progress"] == "calls" and s["updates"] > 0
    assert ("--reply-progress auto: the learner's parameter replies move inside its own "
            "MPI calls (no replay rank on its node)") in job.output        # at start
    assert "replies, which moved inside the learner's own MPI calls" in job.output
    job, s = train(tmp_path, 3, *APEX, "--total-steps", "1000", "--reply-progress", "thread",
                   name="asked", env=nolocal)
    assert s["reply_progress"] == "thread" and "--reply-progress auto" not in job.output
    assert "replies, which moved on the learner's progress thread" in job.output


def test_training_intensity_bounds_samples_per_insert(tmp_path):
    _, s = train(tmp_path, 4, *APEX, "--train-intensity", "1", "--total-steps", "4000")
    # a replay answers only while sampled + batch <= 1 x inserted (once its actors have
    # left, it answers the learner's last request with what it has: one batch more)
    assert s["transitions_sampled"] <= s["transitions_inserted"] + 32
    assert s["transitions_sampled"] >= s["transitions_inserted"] // 2


def test_a_killed_actor_ends_the_job_naming_it(tmp_path):
    kill_an_actor(tmp_path, "apex", 4, "--env-arg", "actions=5", "--learning-starts", "64",
                  "--replay-batch", "16")
