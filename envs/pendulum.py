"""Pendulum swing-up in pure JAX: a tiny continuous-control task for fast CPU tests.

Dynamics and reward follow the classic Gym pendulum: start hanging at a random angle, torque in
[-2, 2], reward -(angle² + 0.1·velocity² + 0.001·torque²) per step; the best return is near 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from envs.core import Env, State


class Pendulum(Env):
    def __init__(self, max_torque: float = 2.0, max_speed: float = 8.0, dt: float = 0.05):
        self.max_torque = max_torque
        self.max_speed = max_speed
        self.dt = dt

    observation_size = 3
    action_size = 1

    def reset(self, key: jax.Array) -> State:
        angle_key, speed_key = jax.random.split(key)
        theta = jax.random.uniform(angle_key, (), minval=-jnp.pi, maxval=jnp.pi)
        theta_dot = jax.random.uniform(speed_key, (), minval=-1.0, maxval=1.0)
        physics = jnp.stack([theta, theta_dot])
        zero = jnp.zeros(())
        return State(physics, self._obs(physics), zero, zero, {"upright": zero}, {})

    def step(self, state: State, action: jax.Array) -> State:
        theta, theta_dot = state.pipeline_state
        torque = self.max_torque * jnp.clip(action[0], -1.0, 1.0)
        angle = (theta + jnp.pi) % (2 * jnp.pi) - jnp.pi
        reward = -(angle**2 + 0.1 * theta_dot**2 + 0.001 * torque**2)
        g, m, length = 10.0, 1.0, 1.0
        theta_dot = theta_dot + (3 * g / (2 * length) * jnp.sin(theta) + 3.0 / (m * length**2) * torque) * self.dt
        theta_dot = jnp.clip(theta_dot, -self.max_speed, self.max_speed)
        physics = jnp.stack([theta + theta_dot * self.dt, theta_dot])
        upright = (jnp.cos(physics[0]) > 0.95).astype(jnp.float32)
        return state.replace(
            pipeline_state=physics, obs=self._obs(physics), reward=reward, metrics={**state.metrics, "upright": upright}
        )

    @staticmethod
    def _obs(physics: jax.Array) -> jax.Array:
        theta, theta_dot = physics
        return jnp.stack([jnp.cos(theta), jnp.sin(theta), theta_dot])
