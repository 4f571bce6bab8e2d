"""``L2Run-v0``: NIPS 2017 "Learning to Run" on OpenSim, to the challenge's specification.

A planar musculoskeletal model (osim-rl's ``gait9dof18musc.osim``: 9 degrees of freedom,
18 muscles) must run as far as it can.  Built on the PyPI ``opensim`` package (4.6) and
osim-rl 2.1.5's :class:`osim.env.osim.OsimModel` (model loading, muscle excitations,
integration); the task itself is defined here, because osim-rl 2.1.5's ``L2RunEnv``
differs from the specification (43 numbers with zero pads, no ligament penalty, ends
below 0.6 m).

Observation (41 float numbers; indices are :data:`OBS`):

====== ==================================================================================
0-2    pelvis rotation (rad), pelvis x, pelvis y (m): the ``ground_pelvis`` coordinates
3-5    their velocities
6-11   joint angles of hip, knee, ankle: right leg, then left (rad)
12-17  their angular velocities (same order)
18-19  centre of mass x, y
20-21  centre of mass velocity x, y
22-35  x, y of head, pelvis, torso, left toes, right toes, left talus, right talus
36-37  psoas strength, left and right (1 unless difficulty 2)
38-40  next obstacle ahead: x distance from the pelvis, y of its centre, radius
       (100, 0, 0 when none is left)
====== ==================================================================================

Action: 18 muscle excitations, clipped to [0, 1] (the model's muscle order).
Reward per step: the pelvis's x advance minus the ligament forces used in that step
divided by 10^7 (the norm of the hip, knee and ankle ``CoordinateLimitForce`` forces).
Terminated when the pelvis drops below 0.65 m; truncated after ``max_steps`` (1000
steps of 0.01 s: 10 s of simulated time).

Difficulty 0: no obstacles, psoas strength 1 (the simplified setting the book trained
on).  1: three obstacles (x ~ U(1, 5) m, radius 0.05 + Exp(0.05) m, centre height
U(-0.25, 0.25) x radius), drawn at every reset.  2: obstacles, and each psoas strength
~ 1 - N(0, 0.1), at least 0.5 (the setting the challenge graded).  Draws come from the
env's seeded generator, so ``reset(seed=s)`` fixes them.

Each step's wall time (actuation, integration and observation) is ``info["sim_s"]``:
mpirl logs it per step, since OpenSim steps are slow and heavy-tailed.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import time

import gymnasium
import numpy as np

OBS_SIZE = 41
ACT_SIZE = 18
#: names of the observation's entries, in order
OBS = (["pelvis_rot", "pelvis_x", "pelvis_y", "pelvis_vrot", "pelvis_vx", "pelvis_vy"]
       + [f"{j}_{s}" for j in ("hip_r", "knee_r", "ankle_r", "hip_l", "knee_l", "ankle_l")
          for s in ("angle",)]
       + [f"{j}_{s}" for j in ("hip_r", "knee_r", "ankle_r", "hip_l", "knee_l", "ankle_l")
          for s in ("speed",)]
       + ["com_x", "com_y", "com_vx", "com_vy"]
       + [f"{b}_{c}" for b in ("head", "pelvis", "torso", "toes_l", "toes_r", "talus_l",
                               "talus_r") for c in ("x", "y")]
       + ["psoas_l", "psoas_r", "obstacle_dx", "obstacle_y", "obstacle_r"])
assert len(OBS) == OBS_SIZE
LEG_JOINTS = ("hip_r", "knee_r", "ankle_r", "hip_l", "knee_l", "ankle_l")
BODIES = ("head", "pelvis", "torso", "toes_l", "toes_r", "talus_l", "talus_r")
LIGAMENT_PREFIXES = ("HipLimit_", "KneeLimit_", "AnkleLimit_")
FOOT_CONTACTS = ("r_heel", "l_heel", "r_toe", "l_toe")
PELVIS_MIN_Y = 0.65
LIGAMENT_SCALE = 1e-7
NO_OBSTACLE = (100.0, 0.0, 0.0)
MAX_OBSTACLES = 3

KWARGS = {
    "difficulty": (int, lambda v: v in (0, 1, 2), "0, 1 or 2"),
    "max_steps": (int, lambda v: v >= 1, "an int >= 1"),
    "integrator_accuracy": (float, lambda v: 0.0 < v < 1.0, "a number in (0, 1)"),
}

INSTALL_HINT = ("L2Run-v0 needs OpenSim and osim-rl: pip install -e '.[osim]' "
                "(make test installs it)")


def load_osim():
    """``(opensim, OsimModel)`` with OpenSim quiet and osim-rl made to work with 4.6."""
    try:
        import opensim
        with contextlib.redirect_stderr(io.StringIO()):   # old gym's import-time notice
            from osim.env.osim import OsimModel
    except ImportError as err:
        raise ImportError(f"{INSTALL_HINT} ({err})") from None
    opensim.Logger.setLevelString("error")      # no per-step integrator log
    _accept_actuator_index(opensim)
    return opensim, OsimModel


def _accept_actuator_index(opensim) -> None:
    """osim-rl 2.1.5 calls ``PrescribedController.prescribeControlForActuator(index, f)``;
    OpenSim 4.6 accepts only the actuator's name there.  Wrap the method (once) so that
    an index is translated to the name of the controller's actuator at that index (its
    ``actuators`` socket lists them in the order ``addActuator`` added them)."""
    cls = opensim.PrescribedController
    if getattr(cls.prescribeControlForActuator, "_mpirl_by_index", False):
        return
    by_name = cls.prescribeControlForActuator

    def prescribe(self, which, function):
        if isinstance(which, int):
            which = self.getSocket("actuators").getConnecteeAsObject(which).getName()
        return by_name(self, which, function)

    prescribe._mpirl_by_index = True
    cls.prescribeControlForActuator = prescribe


def model_path() -> str:
    import osim
    return os.path.join(os.path.dirname(osim.__file__), "models", "gait9dof18musc.osim")


class L2RunEnv(gymnasium.Env):
    metadata = {"render_modes": []}

    def __init__(self, difficulty: int = 0, max_steps: int = 1000,
                 integrator_accuracy: float = 1e-3) -> None:
        if difficulty not in (0, 1, 2):
            raise ValueError(f"difficulty={difficulty!r}; allowed: 0, 1, 2")
        self.opensim, OsimModel = load_osim()
        self.difficulty, self.max_steps = difficulty, max_steps
        self.observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (OBS_SIZE,), np.float32)
        self.action_space = gymnasium.spaces.Box(0.0, 1.0, (ACT_SIZE,), np.float32)

        class Model(OsimModel):
            def __init__(self, *args, **kwargs):
                # osim-rl keeps these lists on the class: one per instance instead
                self.maxforces, self.curforces = [], []
                super().__init__(*args, **kwargs)

        self.osim = Model(model_path(), False, integrator_accuracy=integrator_accuracy)
        model = self.osim.model
        joints = model.getJointSet()
        self.pelvis = self.opensim.PlanarJoint.safeDownCast(joints.get("ground_pelvis"))
        self.coords = [model.getJointSet().get(j).get_coordinates(0) for j in LEG_JOINTS]
        self.bodies = [model.getBodySet().get(b) for b in BODIES]
        forces = model.getForceSet()
        self.ligaments = [self.opensim.CoordinateLimitForce.safeDownCast(forces.get(i))
                          for i in range(forces.getSize())
                          if forces.get(i).getName().startswith(LIGAMENT_PREFIXES)]
        muscles = [model.getMuscles().get(i).getName() for i in range(ACT_SIZE)]
        self.psoas = (muscles.index("iliopsoas_l"), muscles.index("iliopsoas_r"))
        # difficulty 0 has no obstacles: leaving their bodies out of the model makes each
        # step ~1.8x faster (measured: 34 vs 18 steps/s with random excitations)
        self.n_obstacles = MAX_OBSTACLES if difficulty >= 1 else 0
        self._add_obstacles()
        model.initSystem()
        self.obstacles: list[tuple[float, float, float]] = []
        self.strength = [1.0] * ACT_SIZE
        self._applied_strength = [1.0] * ACT_SIZE      # the model file's own strengths
        self._steps = 0
        self.pelvis_x = self.pelvis_y = 0.0     # float64, from the last observe()

    # -- obstacles: spheres on locked planar joints, in contact with the feet -----------
    def _add_obstacles(self) -> None:
        osm, model = self.opensim, self.osim.model
        for i in range(self.n_obstacles):
            body = osm.Body(f"obstacle{i}", 1e-4, osm.Vec3(0), osm.Inertia(1, 1, 1e-4, 0, 0, 0))
            joint = osm.PlanarJoint(f"obstacle{i}_joint", model.getGround(), osm.Vec3(0),
                                    osm.Vec3(0), body, osm.Vec3(0), osm.Vec3(0))
            model.addBody(body)
            model.addJoint(joint)
            sphere = osm.ContactSphere(1e-4, osm.Vec3(0), body)
            sphere.setName(f"obstacle{i}_contact")
            model.addContactGeometry(sphere)
            force = osm.HuntCrossleyForce()
            force.setName(f"obstacle{i}_force")
            for geometry in (f"obstacle{i}_contact", *FOOT_CONTACTS):
                force.addGeometry(geometry)
            force.setStiffness(1e6 / 0.1)
            force.setDissipation(1e-5)
            force.setStaticFriction(0.0)
            force.setDynamicFriction(0.0)
            force.setViscousFriction(0.0)
            model.addForce(force)

    def _draw_course(self) -> None:
        rng, self.obstacles = self.np_random, []
        if self.difficulty >= 1:
            xs = rng.uniform(1.0, 5.0, MAX_OBSTACLES)
            ys = rng.uniform(-0.25, 0.25, MAX_OBSTACLES)
            rs = 0.05 + rng.exponential(0.05, MAX_OBSTACLES)
            self.obstacles = sorted(zip(xs.tolist(), (ys * rs).tolist(), rs.tolist(), strict=True))
        self.strength = [1.0] * ACT_SIZE
        if self.difficulty >= 2:
            for index in self.psoas:
                self.strength[index] = max(0.5, 1.0 - float(rng.normal(0.0, 0.1)))

    def _place_course(self) -> None:
        """Obstacle sizes and muscle strengths are properties: set before the state is
        built (only when they change: a changed property makes OpenSim rebuild the
        system).  Positions are (locked) joint coordinates: set in the state."""
        osm, model = self.opensim, self.osim.model
        for i, (_, _, radius) in enumerate(self.obstacles[:self.n_obstacles]):
            osm.ContactSphere.safeDownCast(
                model.getContactGeometrySet().get(f"obstacle{i}_contact")).setRadius(radius)
            osm.HuntCrossleyForce.safeDownCast(
                model.getForceSet().get(f"obstacle{i}_force")).setStiffness(1e6 / radius)
        if self.strength != self._applied_strength:
            self.osim.set_strength(self.strength)
            self._applied_strength = list(self.strength)

    def _lock_obstacles(self) -> None:
        osm, state = self.opensim, self.osim.state
        for i in range(self.n_obstacles):
            joint = osm.PlanarJoint.safeDownCast(
                self.osim.model.getJointSet().get(f"obstacle{i}_joint"))
            x, y = self.obstacles[i][:2] if i < len(self.obstacles) else (0.0, -0.1)
            for k, value in ((0, 0.0), (1, x), (2, y)):
                coordinate = joint.getCoordinate(k)
                coordinate.setLocked(state, False)
                coordinate.setValue(state, value, False)
                coordinate.setLocked(state, True)
        self.osim.model.assemble(state)
        self.osim.reset_manager()

    # -- gymnasium API -----------------------------------------------------------------------
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._draw_course()
        self._place_course()
        self.osim.reset()
        self._lock_obstacles()
        self._steps = 0
        return self.observe(), {}

    def step(self, action):
        start = time.perf_counter()
        self.osim.actuate(np.clip(np.asarray(action, dtype=np.float64), 0.0, 1.0))
        self.osim.integrate()
        x_before = self.pelvis_x
        obs = self.observe()
        ligaments = self.ligament_force()
        sim_s = time.perf_counter() - start
        reward = self.pelvis_x - x_before - LIGAMENT_SCALE * ligaments
        self._steps += 1
        terminated = self.pelvis_y < PELVIS_MIN_Y
        truncated = not terminated and self._steps >= self.max_steps
        return obs, reward, terminated, truncated, {"sim_s": sim_s, "ligament_force": ligaments}

    # -- reading the state -----------------------------------------------------------------
    def ligament_force(self) -> float:
        """Norm of the ligament (coordinate limit) forces in the current state."""
        state = self.osim.state
        return math.sqrt(sum(lig.calcLimitForce(state) ** 2 for lig in self.ligaments))

    def observe(self) -> np.ndarray:
        model, state = self.osim.model, self.osim.state
        model.realizeAcceleration(state)
        pelvis = [self.pelvis.getCoordinate(i) for i in range(3)]
        com, com_v = model.calcMassCenterPosition(state), model.calcMassCenterVelocity(state)
        x = self.pelvis_x = float(pelvis[1].getValue(state))
        self.pelvis_y = float(pelvis[2].getValue(state))
        obs = ([c.getValue(state) for c in pelvis] + [c.getSpeedValue(state) for c in pelvis]
               + [c.getValue(state) for c in self.coords]
               + [c.getSpeedValue(state) for c in self.coords]
               + [com[0], com[1], com_v[0], com_v[1]])
        for body in self.bodies:
            p = body.getTransformInGround(state).p()
            obs += [p[0], p[1]]
        obs += [self.strength[self.psoas[0]], self.strength[self.psoas[1]]]
        ahead = next(((ox - x, oy, r) for ox, oy, r in self.obstacles if ox + r >= x),
                     NO_OBSTACLE)
        obs += list(ahead)
        return np.asarray(obs, dtype=np.float32)   # rewards and ends use the float64 values
