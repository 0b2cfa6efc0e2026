"""MuJoCo Playground's DM Control tasks through jaxrose's contract, against Playground's own env."""

import jax
import numpy as np
import pytest

import envs
from envs.playground import DMC_TASKS, PlaygroundAssetsError, dmc_name, make_playground_env
from envs.wrappers import wrap_for_training


def test_every_dm_control_task_is_registered():
    from mujoco_playground import dm_control_suite

    assert sorted(DMC_TASKS) == sorted(dm_control_suite.ALL_ENVS)
    assert {dmc_name(task) for task in DMC_TASKS} <= set(envs.names())
    assert [dmc_name(t) for t in ("CartpoleBalance", "CheetahRun", "BallInCup", "SwimmerSwimmer6")] == [
        "dmc_cartpole_balance", "dmc_cheetah_run", "dmc_ball_in_cup", "dmc_swimmer_swimmer6"]


@pytest.mark.slow
def test_cartpole_through_training_wrappers_matches_playground():
    """Two groups of two cartpoles step through episodes, auto-reset and the group layout; every
    reward, observation and metric equals what Playground's env computes on its own from the same
    keys and actions."""
    from mujoco_playground import dm_control_suite

    env = envs.make("dmc_cartpole_balance")
    theirs = dm_control_suite.load("CartpoleBalance", config_overrides={"impl": "jax"})
    assert (env.observation_size, env.action_size) == (5, 1)
    assert env.sys.impl.value == "jax"
    train_env = wrap_for_training(env, episode_length=3, num_groups=2, envs_per_group=2)
    key = jax.random.PRNGKey(0)
    state = jax.jit(train_env.reset)(key)
    their_reset, their_step = jax.jit(jax.vmap(theirs.reset)), jax.jit(jax.vmap(theirs.step))
    reference = their_reset(jax.random.split(key, 4))  # GroupWrapper's per-env keys
    flat = lambda x: np.asarray(x).reshape((4,) + x.shape[2:])
    np.testing.assert_array_equal(flat(state.obs), reference.obs)
    step = jax.jit(train_env.step)
    for t in range(5):
        action = jax.random.uniform(jax.random.PRNGKey(t), (4, 1), minval=-1, maxval=1)
        state = step(state, action.reshape(2, 2, 1))
        reference = their_step(reference, action)
        np.testing.assert_allclose(flat(state.reward), reference.reward, rtol=1e-6)
        for name, value in reference.metrics.items():
            np.testing.assert_allclose(flat(state.metrics[name]), value, rtol=1e-6, err_msg=name)
        np.testing.assert_allclose(flat(state.info["final_obs"]), reference.obs, rtol=1e-6, atol=1e-7)
        assert np.all(flat(state.done) == (1.0 if t == 2 else 0.0))
        if t == 2:  # truncated at 3 steps: both restart from their first state
            reference = their_reset(jax.random.split(key, 4))
            np.testing.assert_array_equal(flat(state.obs), reference.obs)
    assert np.all(flat(state.reward) > 0.5)  # balanced near upright: a dense reward near 1, not zeros


def test_missing_menagerie_says_where_it_goes(monkeypatch, tmp_path):
    """A Menagerie task on a machine where git cannot run: a clear error, and nothing written."""
    from mujoco_playground._src import mjx_env

    monkeypatch.setattr(mjx_env, "EXTERNAL_DEPS_PATH", tmp_path)
    monkeypatch.setattr(mjx_env, "MENAGERIE_PATH", tmp_path / "mujoco_menagerie")
    monkeypatch.setenv("PATH", str(tmp_path / "no-git"))
    with pytest.raises(PlaygroundAssetsError, match=r"MuJoCo Menagerie.*could not be found or downloaded.*"
                                                    + str(tmp_path / "mujoco_menagerie")):
        make_playground_env("Go1JoystickFlatTerrain")
