"""arm_push: a 3-joint planar arm pushes a cube to a random target on a table (MJX).

A clean reference manipulation task, written directly on `mujoco.mjx` (impl='jax'); the model is
`envs/assets/arm_push.xml`.

- **Robot**: three hinges about the vertical axis (links 0.25, 0.25, 0.15 m; reach 0.65 m), torque
  motors with ctrl in [-1, 1] N m, joint damping 0.5. A sphere fingertip (radius 0.02 m) at the
  end is the only part of the arm that touches the cube.
- **Cube**: 5 cm, 0.1 kg, free on the table (sliding friction 0.5).
- **Reset**: the arm points along +y (shoulder pi/2, joints +-0.1 rad of noise, at rest); the cube
  at x in [0.2, 0.35], y in [-0.15, 0.15] m with a random yaw; the target (a mocap body, so each
  env carries its own) at x in [0.2, 0.45], y in [-0.2, 0.2] m, moved out to 0.1 m from the cube
  if it fell closer.
- **Step**: 5 physics steps of 0.01 s (control at 20 Hz); the action is clipped to [-1, 1].
- **Observation** (30): cos and sin of the joint angles (6), joint velocities (3), fingertip xy
  (2), cube position (3), cube quaternion (4), cube linear and angular velocity (6), target xy
  (2), cube - fingertip xy (2), target - cube xy (2).
- **Reward**, in the table plane, after the step (brax's pusher weights):
  `reward_dist + 0.5 * reward_near + 0.1 * reward_ctrl`, with
  `reward_near = -|fingertip - cube|`, `reward_dist = -|cube - target|`,
  `reward_ctrl = -|action|^2`.
- **Success**: `metrics['success']` is 1 while the cube's centre lies within `SUCCESS_DISTANCE`
  (0.05 m) of the target in the table plane.
- **Termination**: only on a non-finite state; episodes otherwise end by truncation.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import mujoco
from mujoco import mjx

from envs.core import Env, State

XML = pathlib.Path(__file__).parent / "assets" / "arm_push.xml"
SUCCESS_DISTANCE = 0.05
LINKS = (0.25, 0.25, 0.15)  # shoulder-elbow, elbow-wrist, wrist-fingertip (m), as in the XML


class ArmPush(Env):
    def __init__(self, n_frames: int = 5):
        self.mj_model = mujoco.MjModel.from_xml_path(str(XML))
        self.sys = mjx.put_model(self.mj_model, impl="jax")
        self.n_frames = n_frames
        self._fingertip = self.mj_model.site("fingertip").id
        self._cube = self.mj_model.body("cube").id
        self._cube_qpos = self.mj_model.jnt_qposadr[self.mj_model.joint("cube").id]
        self._cube_qvel = self.mj_model.jnt_dofadr[self.mj_model.joint("cube").id]

    @property
    def observation_size(self) -> int:
        return 30

    @property
    def action_size(self) -> int:
        return self.mj_model.nu

    def reset(self, key: jax.Array) -> State:
        arm_key, cube_key, yaw_key, target_key = jax.random.split(key, 4)
        arm = jnp.array([jnp.pi / 2, 0.0, 0.0]) + jax.random.uniform(arm_key, (3,), minval=-0.1, maxval=0.1)
        cube = jax.random.uniform(cube_key, (2,), minval=jnp.array([0.2, -0.15]), maxval=jnp.array([0.35, 0.15]))
        yaw = jax.random.uniform(yaw_key, (), minval=-jnp.pi, maxval=jnp.pi)
        target = jax.random.uniform(target_key, (2,), minval=jnp.array([0.2, -0.2]), maxval=jnp.array([0.45, 0.2]))
        offset = target - cube
        distance = jnp.linalg.norm(offset)
        target = jnp.where(distance < 0.1, cube + offset * 0.1 / jnp.maximum(distance, 1e-6), target)

        qpos = jnp.asarray(self.mj_model.qpos0).at[:3].set(arm)
        quat = jnp.array([jnp.cos(yaw / 2), 0.0, 0.0, jnp.sin(yaw / 2)])
        qpos = qpos.at[self._cube_qpos:self._cube_qpos + 7].set(jnp.concatenate([cube, jnp.array([0.025]), quat]))
        data = mjx.make_data(self.mj_model, impl="jax")
        data = data.replace(qpos=qpos, mocap_pos=data.mocap_pos.at[0, :2].set(target))
        data = mjx.forward(self.sys, data)
        zero = jnp.zeros(())
        metrics = {"reward_near": zero, "reward_dist": zero, "reward_ctrl": zero, "success": zero}
        return State(data, self._obs(data), zero, zero, metrics)

    def step(self, state: State, action: jax.Array) -> State:
        action = jnp.clip(action, -1.0, 1.0)

        def physics_step(data, _):
            return mjx.step(self.sys, data.replace(ctrl=action)), None

        data = jax.lax.scan(physics_step, state.pipeline_state, (), self.n_frames)[0]
        # mjx.step computes positions before it integrates: bring them up to the new qpos, so the
        # reward and the observation describe one configuration.
        data = mjx.kinematics(self.sys, data)
        fingertip, cube, target = self._positions(data)
        cube_to_target = jnp.linalg.norm(cube - target)
        # Keys a wrapper added (brax's EvalWrapper adds 'reward') are carried through.
        metrics = {
            **state.metrics,
            "reward_near": -jnp.linalg.norm(fingertip - cube),
            "reward_dist": -cube_to_target,
            "reward_ctrl": -jnp.sum(action ** 2),
            "success": (cube_to_target < SUCCESS_DISTANCE).astype(jnp.float32),
        }
        reward = metrics["reward_dist"] + 0.5 * metrics["reward_near"] + 0.1 * metrics["reward_ctrl"]
        finite = jnp.all(jnp.isfinite(data.qpos)) & jnp.all(jnp.isfinite(data.qvel))
        # A diverged state ends the episode with a zero reward: a NaN one would reach the learner's
        # batch (and the episode's return) although the auto-reset replaces the state itself.
        reward = jnp.where(finite, reward, 0.0)
        metrics.update({k: jnp.where(finite, metrics[k], 0.0) for k in ("reward_near", "reward_dist", "success")})
        return state.replace(pipeline_state=data, obs=self._obs(data), reward=reward,
                             done=1.0 - finite.astype(jnp.float32), metrics=metrics)

    def _positions(self, data: mjx.Data) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Fingertip, cube and target positions in the table plane (xy)."""
        return data.site_xpos[self._fingertip, :2], data.xpos[self._cube, :2], data.mocap_pos[0, :2]

    def _obs(self, data: mjx.Data) -> jax.Array:
        fingertip, cube, target = self._positions(data)
        q = data.qpos[:3]
        cube_pose = data.qpos[self._cube_qpos:self._cube_qpos + 7]
        cube_velocity = data.qvel[self._cube_qvel:self._cube_qvel + 6]
        return jnp.concatenate([jnp.cos(q), jnp.sin(q), data.qvel[:3], fingertip, cube_pose, cube_velocity, target,
                                cube - fingertip, target - cube])
