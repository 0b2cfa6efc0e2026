"""Fault injectors for tests: the point mass with a step counter (kept across auto-resets,
restarted by a reset) that decides when its outputs turn NaN."""

import jax.numpy as jnp

import envs
from envs.wrappers import Wrapper


class StepCountedFault(Wrapper):
    def __init__(self):
        super().__init__(envs.make("point_mass"))

    def reset(self, key):
        state = self.env.reset(key)
        return state.replace(info={**state.info, "t": jnp.zeros(())})

    def step(self, state, action):
        t = state.info["t"] + 1
        state = self.corrupt(self.env.step(state, action), t)
        return state.replace(info={**state.info, "t": t})

    def corrupt(self, state, t):
        raise NotImplementedError


class NaNRewardAfter(StepCountedFault):
    """The reward turns NaN after `after` steps."""

    def __init__(self, after: int):
        super().__init__()
        self.after = after

    def corrupt(self, state, t):
        return state.replace(reward=jnp.where(t > self.after, jnp.nan, state.reward))


class NaNObservationsBetween(StepCountedFault):
    """Observations are NaN while the counter is in [start, stop). The policy turns a NaN
    observation into a NaN action, so the env's physics stay NaN until it is reset."""

    def __init__(self, start: int, stop: int):
        super().__init__()
        self.start, self.stop = start, stop

    def corrupt(self, state, t):
        return state.replace(obs=jnp.where((t >= self.start) & (t < self.stop), jnp.nan, state.obs))


def nan_observations_36_38():
    """`NaNObservationsBetween(36, 38)` by import path (`env.name="fault_envs:nan_observations_36_38"`),
    so spawned worker processes build the same faulty env."""
    return NaNObservationsBetween(36, 38)


class DoubledReward(Wrapper):
    """Not a fault: the point mass with its reward doubled, a user's own env that no registered name builds."""

    def __init__(self):
        super().__init__(envs.make("point_mass"))

    def step(self, state, action):
        state = self.env.step(state, action)
        return state.replace(reward=2.0 * state.reward)
