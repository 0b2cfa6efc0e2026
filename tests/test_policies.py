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


@pytest.mark.parametrize("policy", ["mlp", "transformer"])
def test_bfloat16_compute_keeps_float32_parameters_and_agrees_with_float32(policy):
    """compute_dtype=bfloat16 runs the same parameters in bf16: float32 parameters, float32 logits and
    log-probabilities, within bf16's precision of the float32 network; and the loss's gradient is float32."""
    settings = dict(policy=policy, history=4 if policy == "transformer" else 1, transformer_depth=2,
                    transformer_width=32, transformer_heads=4, policy_hidden=(64, 64), value_hidden=(64, 64))
    obs_size = 3 * settings["history"]
    full = make_actor_critic(obs_size, 2, NetworkConfig(**settings))
    half = make_actor_critic(obs_size, 2, NetworkConfig(**settings, compute_dtype="bfloat16"))
    params, half_params = jax.jit(full.init)(jax.random.PRNGKey(0)), jax.jit(half.init)(jax.random.PRNGKey(0))
    assert jax.tree.structure(params) == jax.tree.structure(half_params)
    assert {leaf.dtype for leaf in jax.tree.leaves(half_params)} == {jnp.dtype(jnp.float32)}
    stats = init_stats(obs_size)
    obs = jax.random.normal(jax.random.PRNGKey(1), (256, obs_size))
    for fn in ("policy_logits", "value"):
        exact, approx = jax.jit(getattr(full, fn))(params, stats, obs), jax.jit(getattr(half, fn))(params, stats, obs)
        assert approx.dtype == jnp.float32 and approx.shape == exact.shape
        assert not np.array_equal(approx, exact)  # bf16 really ran
        scale = float(jnp.max(jnp.abs(exact)))
        np.testing.assert_allclose(approx, exact, atol=0.05 * scale + 1e-3)
    action, extras = jax.jit(half.act)(params, stats, obs, jax.random.PRNGKey(2))
    assert action.dtype == extras["log_prob"].dtype == jnp.float32
    grads = jax.jit(jax.grad(lambda p: jnp.sum(half.value(p, stats, obs))))(params)
    assert {leaf.dtype for leaf in jax.tree.leaves(grads.value)} == {jnp.dtype(jnp.float32)}


def test_compute_dtype_is_validated_and_reaches_the_command_line():
    with pytest.raises(ConfigError, match="network.compute_dtype"):
        NetworkConfig(compute_dtype="float16")
    import tyro

    from jaxrose.config import TrainConfig
    config = tyro.cli(TrainConfig, default=get_preset("point-mass"), args=["--network.compute-dtype", "bfloat16"])
    assert config.network.compute_dtype == "bfloat16"
