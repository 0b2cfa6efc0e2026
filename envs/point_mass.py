"""Point-mass reach in pure JAX: push a 2-D mass to a random target inside an arena.

The episode terminates (done without truncation) when the mass leaves the arena, so this task
also exercises the termination path of GAE and auto-reset. Reward is 1 - distance/arena per step
inside the arena, minus a small control cost; leaving costs -10 once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from envs.core import Env, State


class PointMass(Env):
    def __init__(self, arena: float = 1.0, dt: float = 0.05, force: float = 2.0, damping: float = 0.5):
        self.arena = arena
        self.dt = dt
        self.force = force
        self.damping = damping

    observation_size = 6
    action_size = 2

    def reset(self, key: jax.Array) -> State:
        pos_key, target_key = jax.random.split(key)
        pos = jax.random.uniform(pos_key, (2,), minval=-0.5, maxval=0.5) * self.arena
        target = jax.random.uniform(target_key, (2,), minval=-0.8, maxval=0.8) * self.arena
        physics = {"pos": pos, "vel": jnp.zeros(2), "target": target}
        zero = jnp.zeros(())
        return State(physics, self._obs(physics), zero, zero, {"distance": jnp.linalg.norm(pos - target)}, {})

    def step(self, state: State, action: jax.Array) -> State:
        p = state.pipeline_state
        action = jnp.clip(action, -1.0, 1.0)
        vel = p["vel"] * (1.0 - self.damping * self.dt) + self.force * action * self.dt
        pos = p["pos"] + vel * self.dt
        physics = {"pos": pos, "vel": vel, "target": p["target"]}
        distance = jnp.linalg.norm(pos - p["target"])
        left_arena = jnp.any(jnp.abs(pos) > self.arena)
        reward = jnp.where(left_arena, -10.0, 1.0 - distance / self.arena - 0.01 * jnp.sum(action**2))
        return state.replace(
            pipeline_state=physics,
            obs=self._obs(physics),
            reward=reward,
            done=left_arena.astype(jnp.float32),
            metrics={**state.metrics, "distance": distance},
        )

    @staticmethod
    def _obs(p) -> jax.Array:
        return jnp.concatenate([p["pos"], p["vel"], p["target"] - p["pos"]])
