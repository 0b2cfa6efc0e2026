"""Domain randomization: each env steps with its own physical parameter, checked by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.wrappers import AutoResetWrapper, DomainRandomization, EpisodeWrapper, GroupWrapper


def uniform_torque(base, key):
    """A torque limit in [0.5, 2] instead of the base 2.0."""
    return jax.random.uniform(key, (), minval=0.5, maxval=2.0)


def test_each_env_uses_its_own_torque():
    base = envs.make("pendulum")
    env = GroupWrapper(AutoResetWrapper(EpisodeWrapper(DomainRandomization(base, "max_torque", uniform_torque), 50)),
                       2, 3)
    state = env.reset(jax.random.PRNGKey(0))
    torques = np.asarray(state.info["randomized"])
    assert torques.shape == (2, 3) and len(np.unique(torques)) == 6
    theta, theta_dot = (np.asarray(x) for x in jnp.moveaxis(state.pipeline_state, -1, 0))
    state = env.step(state, jnp.ones((2, 3, 1)))
    # Pendulum dynamics by hand (g=10, m=l=1, dt=0.05): each env's own torque enters.
    expected = theta_dot + (15.0 * np.sin(theta) + 3.0 * torques) * 0.05
    np.testing.assert_allclose(np.asarray(state.pipeline_state)[..., 1], np.clip(expected, -8, 8), rtol=1e-5)
    assert base.max_torque == 2.0  # the shared env object is left as it was


def test_randomization_survives_auto_reset_and_jit():
    env = GroupWrapper(AutoResetWrapper(EpisodeWrapper(
        DomainRandomization(envs.make("pendulum"), "max_torque", uniform_torque), 2)), 1, 4)
    state = jax.jit(env.reset)(jax.random.PRNGKey(1))
    before = np.asarray(state.info["randomized"])
    step = jax.jit(env.step)
    for _ in range(3):  # crosses an auto-reset at step 2
        state = step(state, jnp.zeros((1, 4, 1)))
    np.testing.assert_array_equal(state.info["randomized"], before)


def test_unknown_attribute_is_named():
    with pytest.raises(ValueError, match="Cannot randomize 'gravity': Pendulum has no such attribute"):
        DomainRandomization(envs.make("pendulum"), "gravity", uniform_torque)
