"""NaN/Inf per setting (`run.on_nonfinite`): stop naming the stage, or skip the update and go on.

Fault injectors: an env whose observations turn NaN for a few steps, and an infinite learning rate.
The tiny run has 4 iterations of 16 env steps each (2 unrolls of 8).
"""

import jax
import numpy as np
import pytest

from fault_envs import NaNObservationsBetween
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
