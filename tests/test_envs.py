"""The env contract for every tiny env, the registry, and the wrappers against hand-checked behaviour."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.wrappers import AutoResetWrapper, EpisodeWrapper, GroupWrapper, wrap_for_training

TINY_ENVS = ["pendulum", "point_mass"]


@pytest.mark.parametrize("name", TINY_ENVS)
def test_contract(name):
    env = envs.make(name)
    state = jax.jit(env.reset)(jax.random.PRNGKey(0))
    assert state.obs.shape == (env.observation_size,)
    step = jax.jit(env.step)
    for i in range(20):
        action = jax.random.uniform(jax.random.PRNGKey(i), (env.action_size,), minval=-1, maxval=1)
        state = step(state, action)
        assert state.obs.shape == (env.observation_size,)
        assert state.reward.shape == () and state.done.shape == ()
        assert np.all(np.isfinite(state.obs)) and np.isfinite(state.reward)


# One contract test for every registered env. CPU CI runs the tiny envs and one MJX env (Playground's cartpole, the cheapest to compile);
# the other MJX envs compile for a minute or more each on a CPU and run on the GPU machine.
CPU_MJX = {"dmc_cartpole_balance"}


def _contract_params():
    for name in envs.names():
        if name in TINY_ENVS:
            yield pytest.param(name)
        elif name in CPU_MJX:
            yield pytest.param(name, marks=pytest.mark.slow)
        else:
            yield pytest.param(name, marks=pytest.mark.gpu)


@pytest.mark.parametrize("name", list(_contract_params()))
def test_training_stack_contract(name):
    """jit reset and step through the training wrappers, observation size as declared, no NaN, and
    auto-reset back to the first observation when the episode ends."""
    env = envs.make(name)
    train_env = wrap_for_training(env, episode_length=3, num_groups=2, envs_per_group=2)
    state = jax.jit(train_env.reset)(jax.random.PRNGKey(0))
    assert state.obs.shape == (2, 2, env.observation_size)
    first_obs = state.obs
    step = jax.jit(train_env.step)
    for i in range(3):
        action = jax.random.uniform(jax.random.PRNGKey(i), (2, 2, env.action_size), minval=-1, maxval=1)
        state = step(state, action)
        assert np.all(np.isfinite(state.obs)) and np.all(np.isfinite(state.reward))
    # After 3 steps every episode has ended (truncated, or terminated earlier and reset since).
    assert np.all(np.asarray(state.done) == 1.0)
    np.testing.assert_allclose(state.obs, first_obs)
    # The state's types are a fixed point: step fed its own output never compiles again.
    assert step._cache_size() == 1
    # brax's wrappers add metric keys at reset ('reward') and scan over step: step carries them. The keys
    # are the output's structure, which tracing gives without compiling the bare env's step (MJX: ~20 s).
    raw = jax.eval_shape(env.reset, jax.random.PRNGKey(1))
    raw = raw.replace(metrics={**raw.metrics, "reward": jax.ShapeDtypeStruct((), jnp.float32)})
    stepped = jax.eval_shape(env.step, raw, jax.ShapeDtypeStruct((env.action_size,), jnp.float32))
    assert set(stepped.metrics) == set(raw.metrics)


def test_training_state_is_strongly_typed_so_a_rollout_compiles_once():
    """An env writing a Python scalar into its state (brax's ant does: `done = 0.0`) makes step's
    output weakly typed where reset's was not; through the training wrappers every leaf comes out
    strongly typed, so a jitted step fed its own output keeps one compiled program."""

    class ScalarDone(envs.make("point_mass").__class__):
        def step(self, state, action):
            return super().step(state, action).replace(done=0.0)

    env = ScalarDone()
    raw_step = jax.jit(jax.vmap(env.step))
    state = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(0), 2))
    assert raw_step(state, jnp.zeros((2, env.action_size))).done.weak_type  # the defect the wrapper removes

    train_env = wrap_for_training(env, episode_length=5, num_groups=1, envs_per_group=2)
    state = jax.jit(train_env.reset)(jax.random.PRNGKey(0))
    step = jax.jit(train_env.step)
    for _ in range(3):
        state = step(state, jnp.zeros((1, 2, env.action_size)))
        assert not any(leaf.weak_type for leaf in jax.tree.leaves(state))
    assert step._cache_size() == 1


def test_unknown_env_lists_known_names():
    with pytest.raises(ValueError, match="Unknown environment 'antt'.*pendulum.*point_mass"):
        envs.make("antt")
    assert {"ant", "humanoid", "pendulum", "point_mass"} <= set(envs.names())


def test_env_by_import_path_and_a_bad_path_is_named():
    env = envs.make("fault_envs:nan_observations_36_38")  # what spawned workers can rebuild by name
    assert type(env).__name__ == "NaNObservationsBetween"
    assert env.observation_size == envs.make("point_mass").observation_size
    with pytest.raises(ValueError, match="cannot load 'nope' from module 'fault_envs'"):
        envs.make("fault_envs:nope")
    with pytest.raises(ValueError, match="cannot load 'x' from module 'no_such_module'"):
        envs.make("no_such_module:x")


def test_episode_wrapper_truncates_and_sums_rewards():
    env = EpisodeWrapper(envs.make("pendulum"), episode_length=4)
    state = env.reset(jax.random.PRNGKey(1))
    rewards = []
    for t in range(4):
        state = env.step(state, jnp.zeros(1))
        rewards.append(float(state.reward))
        expected_done = 1.0 if t == 3 else 0.0
        assert float(state.done) == expected_done
        assert float(state.info["truncation"]) == expected_done
    assert float(state.info["episode_metrics"]["length"]) == 4
    np.testing.assert_allclose(float(state.info["episode_metrics"]["sum_reward"]), sum(rewards), rtol=1e-6)


def test_termination_is_not_truncation():
    # Pushing the point mass hard right makes it leave the arena: done without truncation.
    env = EpisodeWrapper(envs.make("point_mass"), episode_length=1000)
    state = env.reset(jax.random.PRNGKey(0))
    for _ in range(200):
        state = env.step(state, jnp.array([1.0, 0.0]))
        if float(state.done):
            break
    assert float(state.done) == 1.0
    assert float(state.info["truncation"]) == 0.0
    assert float(state.reward) == -10.0


def test_auto_reset_restores_first_state_and_keeps_final_obs():
    env = AutoResetWrapper(EpisodeWrapper(envs.make("pendulum"), episode_length=3))
    state = env.reset(jax.random.PRNGKey(2))
    first_obs = state.obs
    plain = EpisodeWrapper(envs.make("pendulum"), episode_length=3)
    plain_state = plain.reset(jax.random.PRNGKey(2))
    for _ in range(3):
        state = env.step(state, jnp.ones(1))
        plain_state = plain.step(plain_state, jnp.ones(1))
    np.testing.assert_allclose(state.obs, first_obs)  # reset happened
    np.testing.assert_allclose(state.info["final_obs"], plain_state.obs)  # the obs before the reset
    state = env.step(state, jnp.ones(1))  # the next episode starts counting again
    assert float(state.info["steps"]) == 1 and float(state.done) == 0.0
    # Episode sums restart after a finished episode.
    assert float(state.info["episode_metrics"]["length"]) == 1


def test_group_wrapper_layout_is_independent_of_grouping():
    base = envs.make("point_mass")
    flat = GroupWrapper(base, 1, 12)
    grouped = GroupWrapper(base, 3, 4)
    key = jax.random.PRNGKey(3)
    s_flat, s_grouped = flat.reset(key), grouped.reset(key)
    assert s_grouped.obs.shape == (3, 4, base.observation_size)
    np.testing.assert_array_equal(s_flat.obs.reshape(12, -1), s_grouped.obs.reshape(12, -1))
    actions = jax.random.uniform(key, (12, 2), minval=-1, maxval=1)
    s_flat = flat.step(s_flat, actions.reshape(1, 12, 2))
    s_grouped = grouped.step(s_grouped, actions.reshape(3, 4, 2))
    np.testing.assert_array_equal(s_flat.obs.reshape(12, -1), s_grouped.obs.reshape(12, -1))


def test_brax_task_observation_size_is_traced_without_compiling():
    # brax's own `observation_size` runs a reset op by op, compiling each operation (37 s for ant on
    # this CPU); the registry's traces it abstractly and must agree with the observation a reset makes.
    import jax

    compiles = []

    def listener(event, seconds, **_):
        if event.endswith("backend_compile_duration"):
            compiles.append(event)

    env = envs.make("hopper")  # the smallest brax MJX model
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        size = env.observation_size
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert len(compiles) <= 3  # traced, not run: at most the key's own tiny ops compile (brax's: ~1000)
    assert size == jax.jit(env.reset)(jax.random.PRNGKey(0)).obs.shape[-1]
    assert env.observation_size is size and type(env).__mro__[1].__module__.startswith("brax.")  # cached; brax's task
