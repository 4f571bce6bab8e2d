"""L2Run-v0 against the raw OpenSim state: observation layout, reward, both end rules.

Needs the ``osim`` extra, which ``make test`` installs: a missing OpenSim fails here."""

from __future__ import annotations

import math

import gymnasium
import numpy as np
import opensim
import pytest

import mpirl.parts.envs  # noqa: F401  (registers the ids)
from mpirl.parts.envs.l2run import LEG_JOINTS, OBS, OBS_SIZE




@pytest.fixture(scope="module")
def l2run():
    env = gymnasium.make("L2Run-v0").unwrapped
    env.reset(seed=0)
    return env


def raw(env):
    """The quantities the observation must hold, read straight from OpenSim."""
    model, state = env.osim.model, env.osim.state
    model.realizeAcceleration(state)
    joints = model.getJointSet()
    pelvis = joints.get("ground_pelvis")
    out = {"pelvis_rot": pelvis.get_coordinates(0).getValue(state),
           "pelvis_x": pelvis.get_coordinates(1).getValue(state),
           "pelvis_y": pelvis.get_coordinates(2).getValue(state),
           "pelvis_vrot": pelvis.get_coordinates(0).getSpeedValue(state),
           "pelvis_vx": pelvis.get_coordinates(1).getSpeedValue(state),
           "pelvis_vy": pelvis.get_coordinates(2).getSpeedValue(state)}
    for j in LEG_JOINTS:
        out[f"{j}_angle"] = joints.get(j).get_coordinates(0).getValue(state)
        out[f"{j}_speed"] = joints.get(j).get_coordinates(0).getSpeedValue(state)
    com, com_v = model.calcMassCenterPosition(state), model.calcMassCenterVelocity(state)
    out.update(com_x=com[0], com_y=com[1], com_vx=com_v[0], com_vy=com_v[1])
    for b in ("head", "pelvis", "torso", "toes_l", "toes_r", "talus_l", "talus_r"):
        p = model.getBodySet().get(b).getTransformInGround(state).p()
        out[f"{b}_x"], out[f"{b}_y"] = p[0], p[1]
    muscles = model.getMuscles()
    maxf = {muscles.get(i).getName(): muscles.get(i).getMaxIsometricForce() for i in range(18)}
    out["psoas_l"] = maxf["iliopsoas_l"] / env.osim.maxforces[12]
    out["psoas_r"] = maxf["iliopsoas_r"] / env.osim.maxforces[3]
    return out


def test_observation_layout_matches_the_raw_opensim_state(l2run):
    rng = np.random.default_rng(0)
    for _ in range(15):
        obs, *_ = l2run.step(rng.random(18))
        expected = raw(l2run)
        assert obs.shape == (OBS_SIZE,) and obs.dtype == np.float32
        for i, name in enumerate(OBS[:38]):
            assert obs[i] == pytest.approx(expected[name], rel=1e-5, abs=1e-5), name
    assert tuple(obs[38:]) == (100.0, 0.0, 0.0)        # difficulty 0: no obstacle


def test_reward_is_pelvis_advance_minus_ligament_forces(l2run):
    l2run.reset(seed=0)
    rng = np.random.default_rng(1)
    for _ in range(10):
        x0 = raw(l2run)["pelvis_x"]
        obs, reward, *_, info = l2run.step(rng.random(18))
        state = l2run.osim.state
        forces = [opensim.CoordinateLimitForce.safeDownCast(l2run.osim.model.getForceSet().get(n))
                  for n in ("HipLimit_r", "HipLimit_l", "KneeLimit_r", "KneeLimit_l",
                            "AnkleLimit_r", "AnkleLimit_l")]
        ligaments = math.sqrt(sum(f.calcLimitForce(state) ** 2 for f in forces))
        assert reward == pytest.approx(raw(l2run)["pelvis_x"] - x0 - ligaments / 1e7, abs=1e-9)
        assert info["sim_s"] > 0


def test_falling_terminates_below_065_and_time_limit_truncates():
    env = gymnasium.make("L2Run-v0", max_steps=1000).unwrapped
    env.reset(seed=0)
    for step in range(1, 1001):     # no excitation: the model collapses  # noqa: B007
        obs, _, terminated, truncated, _ = env.step(np.zeros(18))
        if terminated or truncated:
            break
    assert terminated and not truncated and obs[2] < 0.65
    assert raw(env)["pelvis_y"] < 0.65 and step < 1000
    short = gymnasium.make("L2Run-v0", max_steps=5).unwrapped
    short.reset(seed=0)
    flags = [short.step(np.full(18, 0.05))[2:4] for _ in range(5)]
    assert flags[-1] == (False, True) and all(f == (False, False) for f in flags[:-1])


def test_difficulty_2_draws_obstacles_and_psoas_from_the_seed():
    env = gymnasium.make("L2Run-v0", difficulty=2).unwrapped
    first, _ = env.reset(seed=5)
    again, _ = env.reset(seed=5)
    other, _ = env.reset(seed=6)
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    env.reset(seed=5)
    assert len(env.obstacles) == 3
    x = raw(env)["pelvis_x"]
    nearest = min((o for o in env.obstacles if o[0] + o[2] >= x), key=lambda o: o[0])
    assert first[38] == pytest.approx(nearest[0] - x, abs=1e-6)
    assert first[40] == pytest.approx(nearest[2]) and 0.05 <= first[40]
    assert first[36] != 1.0 or first[37] != 1.0          # psoas strengths drawn
    assert first[36] == pytest.approx(raw(env)["psoas_l"], rel=1e-6)
    spheres = env.osim.model.getContactGeometrySet()
    for i, (_, _, radius) in enumerate(env.obstacles):      # the obstacles exist in the model
        sphere = opensim.ContactSphere.safeDownCast(spheres.get(f"obstacle{i}_contact"))
        assert sphere.getRadius() == pytest.approx(radius)
    easy = gymnasium.make("L2Run-v0", difficulty=1).unwrapped
    obs, _ = easy.reset(seed=5)
    assert len(easy.obstacles) == 3 and tuple(obs[36:38]) == (1.0, 1.0)


def test_l2run_trains_under_mpiexec_and_logs_every_step_time(tmp_path):
    """The README's command with the smoke budget: 2 ranks, the book's five tricks."""
    import json

    from mpirun import ROOT, run_mpi

    run_mpi(2, ["-m", "mpirl.run", "--config", str(ROOT / "experiments" / "l2run_smoke.yaml"),
                "--run-dir", str(tmp_path), "--run-name", "l2"], timeout_s=600)
    summary = json.loads((tmp_path / "l2" / "summary.json").read_text())
    assert summary["env_steps"] == 576 and summary["updates"] == 9   # 3 batches x repeat 3
    from analysis import load_run

    run = load_run(tmp_path / "l2")
    # one row per action per rank: 3 batches x 32 actions x 1 env, each 3 simulator steps
    assert run.sim_steps.groupby("rank").size().tolist() == [96, 96]
    assert (run.sim_steps["sim_s"] > 0).all()
    assert run.updates.groupby("rank")["env_steps"].sum().tolist() == [288, 288]
