"""Observation history and the inference-heavy transformer policy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.wrappers import AutoResetWrapper, EpisodeWrapper, HistoryWrapper
from jaxrose import get_preset, train
from jaxrose.config import ConfigError, NetworkConfig, replace
from jaxrose.networks import make_actor_critic
from jaxrose.normalization import init as init_stats


def test_history_holds_the_last_observations_oldest_first():
    base = envs.make("point_mass")
    env = HistoryWrapper(base, 3)
    state, plain = env.reset(jax.random.PRNGKey(0)), base.reset(jax.random.PRNGKey(0))
    seen = [plain.obs] * 3  # the reset observation fills the history
    np.testing.assert_array_equal(state.obs, jnp.concatenate(seen))
    for t in range(5):
        action = jnp.array([0.3, -0.2 * t])
        state, plain = env.step(state, action), base.step(plain, action)
        seen = seen[1:] + [plain.obs]
        np.testing.assert_allclose(state.obs, jnp.concatenate(seen), rtol=1e-6)
    assert env.observation_size == 3 * base.observation_size


def test_auto_reset_refills_the_history():
    env = AutoResetWrapper(EpisodeWrapper(HistoryWrapper(envs.make("pendulum"), 4), episode_length=2))
    state = env.reset(jax.random.PRNGKey(1))
    first = state.obs
    for _ in range(2):
        state = env.step(state, jnp.ones(1))
    np.testing.assert_array_equal(state.obs, first)


def test_transformer_policy_uses_every_observation_in_its_history():
    config = NetworkConfig(policy="transformer", history=4, transformer_depth=2, transformer_width=16,
                           transformer_heads=2, value_hidden=(8,))
    net = make_actor_critic(4 * 6, 2, config)
    params, stats = net.init(jax.random.PRNGKey(0)), init_stats(24)
    obs = jax.random.normal(jax.random.PRNGKey(1), (5, 24))
    assert net.policy_logits(params, stats, obs).shape == (5, 4)
    grad = jax.grad(lambda o: jnp.sum(net.policy_logits(params, stats, o)))(obs)
    per_token = np.abs(np.asarray(grad).reshape(5, 4, 6)).sum(axis=(0, 2))
    assert np.all(per_token > 0), per_token  # the oldest observation still matters


def test_transformer_settings_are_validated():
    with pytest.raises(ConfigError, match=r"network\.transformer_width \(30\) must be divisible"):
        NetworkConfig(policy="transformer", transformer_width=30, transformer_heads=4)
    with pytest.raises(ConfigError, match=r"network\.history must be >= 1"):
        NetworkConfig(history=0)


@pytest.mark.slow
def test_transformer_preset_learns(tmp_path):
    config = replace(get_preset("point-mass-transformer"), **{
        "run.total_env_steps": 80_000, "run.num_evals": 4, "run.out_dir": str(tmp_path),
        "run.progress_bar": False, "run.tensorboard": False})
    result = train(config, write_outputs=False)
    first, last = result.evaluations[0]["eval/episode_return"], result.final_return
    assert last > first + 60.0, (first, last)
