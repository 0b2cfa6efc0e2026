"""NaN/Inf per setting (`run.on_nonfinite`): stop naming the stage, or skip the update and go on.

Fault injectors: an env whose observations (or rewards) turn NaN after some steps, and an infinite
learning rate. The tiny run has 4 iterations of 16 env steps each (2 unrolls of 8). In asynchronous
mode its 2 actors each own 1 group of 16 envs and send trajectories of 16 steps: 8 trajectories.
"""

import collections
import contextlib
import multiprocessing
import re

import jax
import numpy as np
import pytest

from fault_envs import NaNObservationsBetween, NaNRewardAfter
from jaxrose import train
from jaxrose.checkpoint import Checkpointer
from jaxrose.config import ConfigError, RunConfig, replace
from jaxrose.nonfinite import NonFiniteError, NonFiniteWarning
from jaxrose.sequential import SequentialExecutor


def run_with_nan_observations(config, mode):
    # Steps 36-37 fall in iteration 3 (steps 33-48); after a reset the window would come back at
    # step 84, past the run's 64 steps.
    config = replace(config, **{"run.on_nonfinite": mode, "run.checkpoint_every": 1, "run.keep_checkpoints": 5,
                                "run.num_evals": 2})
    return train(config, executor=SequentialExecutor(config, env=NaNObservationsBetween(36, 38)))


def params_at(out_dir, step, config):
    executor = SequentialExecutor(config, env=NaNObservationsBetween(36, 38))
    state = Checkpointer(str(out_dir / "checkpoints")).restore(executor.init(jax.random.PRNGKey(0)), config, step=step)
    return jax.tree.leaves(state.learner.params)


def test_nan_observations_stop_the_run_naming_the_stage(tiny_config, tmp_path):
    config = replace(tiny_config, **{"run.out_dir": str(tmp_path)})
    with pytest.raises(NonFiniteError, match=r"Iteration 3 produced NaN or Inf in: env_step_observations.*"
                                             r"last good checkpoint is iteration 2"):
        run_with_nan_observations(config, "stop")


def test_nan_observations_skip_the_update_and_reset_the_broken_envs(tiny_config, tmp_path):
    config = replace(tiny_config, **{"run.out_dir": str(tmp_path)})
    with pytest.warns(NonFiniteWarning, match=r"Iteration 3 produced NaN or Inf in: env_step_observations.*"
                                              r"update was skipped.*1 in a row.* 32 env\(s\) .* were reset"):
        result = run_with_nan_observations(config, "skip")
    # Only iteration 3 was skipped: the reset envs gave finite data in iteration 4.
    assert result.skipped_iterations == [3]
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(result.state))
    second, third, fourth = (params_at(tmp_path, step, config) for step in (2, 3, 4))
    for a, b in zip(second, third, strict=True):
        np.testing.assert_array_equal(a, b)  # the skipped update left the parameters as they were
    assert any(not np.array_equal(a, b) for a, b in zip(third, fourth))


def test_nan_parameters_stop_the_run_naming_the_stage(tiny_config, tmp_path):
    config = replace(tiny_config, **{"run.out_dir": str(tmp_path), "ppo.learning_rate": float("inf")})
    with pytest.raises(NonFiniteError, match=r"Iteration 1 produced NaN or Inf in: sgd_step_params"):
        train(config)


def test_skipping_gives_up_after_max_consecutive_skips(tiny_config, tmp_path):
    # An infinite learning rate (a fault injector) breaks every update: skipping cannot help.
    config = replace(tiny_config, **{"run.out_dir": str(tmp_path), "ppo.learning_rate": float("inf"),
                                     "run.on_nonfinite": "skip", "run.max_consecutive_skips": 2,
                                     "run.checkpoint_every": 1})
    with pytest.warns(NonFiniteWarning, match="in: sgd_step_params.*its update was skipped") as caught:
        with pytest.raises(NonFiniteError, match=r"Iteration 3 produced NaN or Inf in: sgd_step_params.* after 2 "
                                                 r"skipped iterations in a row.*last good checkpoint is iteration 2"):
            train(config)
    assert len([w for w in caught if issubclass(w.category, NonFiniteWarning)]) == 2


def test_on_nonfinite_is_validated():
    with pytest.raises(ConfigError, match="run.on_nonfinite must be 'stop' or 'skip'"):
        RunConfig(on_nonfinite="ignore")
    with pytest.raises(ConfigError, match="run.max_consecutive_skips must be >= 1"):
        RunConfig(max_consecutive_skips=0)


def test_skip_with_groups_spread_over_processes_equals_sequential(tiny_config, tmp_path):
    """The group processes hold the live env state: a skip resets their broken envs too, and the run
    stays bitwise the sequential one (CPU)."""
    from test_group_runtime import spread_plan

    config = replace(tiny_config, **{"env.name": "fault_envs:nan_observations_36_38", "env.num_groups": 4,
                                     "run.on_nonfinite": "skip", "run.num_evals": 2})
    plan_file = tmp_path / "plan.json"
    spread_plan(config)[0].save(str(plan_file))
    results = {}
    for name, extra in (("sequential", {}), ("spread", {"run.plan": str(plan_file)})):
        run = replace(config, **{"run.out_dir": str(tmp_path / name), **extra})
        with pytest.warns(NonFiniteWarning, match="Iteration 3 .*env_step_observations.*32 env"):
            results[name] = train(run)
    assert results["sequential"].skipped_iterations == results["spread"].skipped_iterations == [3]
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(results["spread"].state.learner),
                 jax.device_get(results["sequential"].state.learner))


def async_config(config, tmp_path, mode, **changes):
    # Without run-ahead every actor waits for the update of its own trajectory, which fixes the update
    # numbers these tests name; `test_async_nan_with_run_ahead_...` covers actors that run ahead.
    return replace(config, **{"run.mode": "async", "run.actors": 2, "run.max_policy_lag": 1, "run.on_nonfinite": mode,
                              "run.actor_run_ahead": 0,
                              "run.checkpoint_every": 1, "run.keep_checkpoints": 10, "run.num_evals": 2,
                              "run.out_dir": str(tmp_path), **changes})


def saved_steps(out_dir) -> dict[int, dict]:
    """Every checkpoint on disk, as saved (flat {path: array}), by step."""
    import orbax.checkpoint as ocp

    folder = out_dir / "checkpoints"
    with ocp.CheckpointManager(str(folder)) as manager:
        return {step: manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
                for step in manager.all_steps()}


def assert_all_finite(steps: dict[int, dict]) -> None:
    for step, arrays in steps.items():
        for path, x in arrays.items():
            assert np.isfinite(x).all() or not np.issubdtype(x.dtype, np.inexact), (step, path)


# Each actor's third trajectory (steps 33-48 of its envs) holds the NaN (NaN observations make NaN
# actions, so the rewards follow); the first four updates, two trajectories per actor, are good,
# and a checkpoint is due every 2 updates (512 env steps).
@pytest.mark.parametrize("fault, stage", [(NaNObservationsBetween(36, 38), "env_step_observations"),
                                          (NaNRewardAfter(35), "env_step_rewards")])
def test_async_nan_in_a_trajectory_stops_naming_the_stage_and_keeps_the_last_good_checkpoint(
        tiny_config, tmp_path, fault, stage):
    config = async_config(tiny_config, tmp_path, "stop")
    with pytest.raises(NonFiniteError, match=rf"Update 5 received NaN or Inf in: {stage}[^(]* \(actor[01]'s trajectory, "
                                             rf"collected with the parameters of update 3\)") as caught:
        train(config, executor=SequentialExecutor(config, env=fault))
    named = int(re.search(r"last good checkpoint is update (\d+)", str(caught.value)).group(1))
    steps = saved_steps(tmp_path)
    # The snapshot after update 4 may still have been waiting for an actor's state: 2 or 4.
    assert named in (2, 4) and max(steps) == named
    assert_all_finite(steps)  # no checkpoint holds the bad data or an env state it came from
    assert not multiprocessing.active_children()


def test_async_nan_observations_skip_the_trajectory_and_reset_the_actors_broken_envs(tiny_config, tmp_path):
    config = async_config(tiny_config, tmp_path, "skip")
    with pytest.warns(NonFiniteWarning, match=r"Update 5 received NaN or Inf in: env_step_observations.*dropped and "
                                              r"actor[01]'s envs with a non-finite state are reset") as caught:
        result = train(config, executor=SequentialExecutor(config, env=NaNObservationsBetween(36, 38)))
    warned = [str(w.message) for w in caught if issubclass(w.category, NonFiniteWarning)]
    assert len(warned) == 2 and all("1 in a row" in w for w in warned)  # counted per actor
    # Both actors' third trajectories were dropped; the reset envs gave finite data afterwards,
    # and the dropped env steps count against the budget as a skipped synchronous iteration does.
    run = result.async_result
    assert result.skipped_iterations == [5, 5] and sorted(s["actor"] for s in run.skipped) == [0, 1]
    assert run.updates == 6 and run.env_steps == config.num_iterations * config.env_steps_per_iteration
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(run.learner))
    steps = saved_steps(tmp_path)
    assert max(steps) == 6
    assert_all_finite(steps)
    assert not multiprocessing.active_children()


def test_async_nan_with_run_ahead_skips_each_broken_trajectory_once_and_saves_only_finite_states(tiny_config, tmp_path):
    # Each actor has started its next rollout before its broken trajectory is checked; it resets its
    # broken envs itself before that next rollout, so only the broken trajectory is dropped, and no
    # rollout or snapshot starts from the broken state.
    config = async_config(tiny_config, tmp_path, "skip", **{"run.actor_run_ahead": 1})
    with pytest.warns(NonFiniteWarning, match=r"received NaN or Inf in: env_step_observations.*dropped") as caught:
        result = train(config, executor=SequentialExecutor(config, env=NaNObservationsBetween(36, 38)))
    warned = [str(w.message) for w in caught if issubclass(w.category, NonFiniteWarning)]
    run = result.async_result
    # By hand: an actor's trajectory is 16 steps of its envs, so steps 36-37 of the fault's counter fall in
    # its 3rd trajectory; the reset restarts the counter, so every 3rd trajectory after breaks again. How
    # many each actor rolls out depends on timing (run-ahead), so count what the learner took from each.
    expected = {i: taken // 3 for i, taken in run.rollouts_per_actor.items()}
    assert sorted(expected) == [0, 1] and min(expected.values()) >= 1  # both actors broke at least once
    assert run.run_ahead == 1 and len(warned) == sum(expected.values()) and all("1 in a row" in w for w in warned)
    assert collections.Counter(s["actor"] for s in run.skipped) == expected
    # Dropped trajectories count against the budget; the last update may take several trajectories.
    steps_per_trajectory = config.env_steps_per_iteration // config.env.num_groups
    kept = sum(g for _, g in run.trajectory_groups) * steps_per_trajectory
    dropped = len(run.skipped) * steps_per_trajectory
    assert run.env_steps == kept + dropped >= config.num_iterations * config.env_steps_per_iteration
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(run.learner))
    assert_all_finite(saved_steps(tmp_path))
    assert not multiprocessing.active_children()


@pytest.mark.parametrize("mode", ["stop", "skip"])
def test_async_nonfinite_update_stops_naming_sgd_step_params(tiny_config, tmp_path, mode):
    # An infinite learning rate breaks every update: stop at the first, or skip two and then stop.
    config = async_config(tiny_config, tmp_path, mode, **{"ppo.learning_rate": float("inf"),
                                                          "run.max_consecutive_skips": 2})
    expected = (r"Update 1 produced NaN or Inf in: sgd_step_params.*" +
                (r"after 2 skipped updates in a row.*" if mode == "skip" else "") +
                r"no checkpoint was saved before it")
    with pytest.warns(NonFiniteWarning) if mode == "skip" else contextlib.nullcontext([]) as caught:
        with pytest.raises(NonFiniteError, match=expected):
            train(config)
    if mode == "skip":
        assert len([w for w in caught if issubclass(w.category, NonFiniteWarning)]) == 2
        assert "it was skipped (the parameters stay those of update 0)" in str(caught[0].message)
    assert not (tmp_path / "checkpoints").exists() or saved_steps(tmp_path) == {}
    assert not multiprocessing.active_children()


def test_async_skips_are_counted_per_actor_and_for_updates_apart():
    # An actor whose every trajectory is broken stops the run even while the other actors' data
    # keeps the updates healthy; a healthy trajectory from that actor starts its count again.
    from jaxrose.nonfinite import NonFinitePolicy

    policy = NonFinitePolicy(RunConfig(on_nonfinite="skip", max_consecutive_skips=2), unit="update")
    broken = "trajectories from actor1"
    for update in (1, 2):
        policy.admit(update, f"Update {update} received NaN", broken)
        policy.healthy("trajectories from actor0")
        policy.healthy("updates")
    with pytest.raises(NonFiniteError, match=r"Update 3 received NaN, after 2 skipped trajectories from actor1 in a "
                                             r"row .*no checkpoint was saved before it"):
        policy.admit(3, "Update 3 received NaN", broken)
    policy.healthy(broken)
    policy.admit(4, "Update 4 received NaN", broken)
    assert policy.skipped == [1, 2, 4]
