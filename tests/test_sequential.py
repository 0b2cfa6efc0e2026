"""The sequential executor: determinism, no retrace, resume equivalence, settings errors."""

import dataclasses

import jax
import numpy as np
import pytest

from jaxrose import train
from jaxrose.checkpoint import CheckpointError
from jaxrose.config import ConfigError, EnvConfig, PPOConfig, TrainConfig, replace
from jaxrose.sequential import SequentialExecutor


def leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def assert_trees_equal(a, b):
    for x, y in zip(leaves(a), leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_same_seed_same_params(tiny_config):
    results = []
    for _ in range(2):
        executor = SequentialExecutor(tiny_config)
        state, _ = executor.run(executor.init(jax.random.PRNGKey(4)), 3)
        results.append(state.learner.params)
    assert_trees_equal(*results)
    executor = SequentialExecutor(tiny_config)
    other, _ = executor.run(executor.init(jax.random.PRNGKey(5)), 3)
    assert not all(np.array_equal(x, y) for x, y in zip(leaves(results[0]), leaves(other.learner.params)))


def test_second_iteration_does_not_retrace(tiny_config):
    traces = []

    class CountingExecutor(SequentialExecutor):
        def _iteration(self, state):
            traces.append(1)
            return super()._iteration(state)

    executor = CountingExecutor(tiny_config)
    state = executor.init(jax.random.PRNGKey(0))
    for _ in range(3):
        state, metrics = executor.step(state)
    jax.block_until_ready(metrics)
    assert len(traces) == 1


def test_iteration_metrics_are_finite_and_counted(tiny_config):
    executor = SequentialExecutor(tiny_config)
    state, history = executor.run(executor.init(jax.random.PRNGKey(0)), 2)
    assert int(state.iteration) == 2
    for name in ("train/total_loss", "train/policy_loss", "train/value_loss", "train/approx_kl"):
        assert np.isfinite(history[-1][name]), name
    assert executor.env_steps_per_iteration == 16 * 4 * 8


def test_resume_equals_straight_run(tiny_config, tmp_path):
    """N iterations, checkpoint, restore, N more == 2N straight: bitwise on CPU, env state and RNG included."""
    straight = train(replace(tiny_config, **{"run.out_dir": str(tmp_path / "straight")}))
    assert int(straight.state.iteration) == 4

    half = replace(tiny_config, **{"run.out_dir": str(tmp_path / "half"), "run.total_env_steps": 1024,
                                   "run.num_evals": 2})
    first = train(half)
    assert int(first.state.iteration) == 2
    resumed = train(replace(tiny_config, **{"run.out_dir": str(tmp_path / "resumed"),
                                            "run.resume": str(tmp_path / "half")}))
    assert int(resumed.state.iteration) == 4
    assert_trees_equal(straight.state, resumed.state)
    assert straight.final_return == resumed.final_return
    assert (tmp_path / "straight" / "learning_curve.png").exists()
    assert (tmp_path / "straight" / "metrics.jsonl").read_text().count("\"eval/episode_return\":") == 3


def test_resume_with_other_settings_is_refused(tiny_config, tmp_path):
    train(replace(tiny_config, **{"run.out_dir": str(tmp_path / "a")}))
    other = replace(tiny_config, **{"ppo.learning_rate": 0.1, "run.resume": str(tmp_path / "a"),
                                    "run.out_dir": str(tmp_path / "b")})
    with pytest.raises(CheckpointError, match="different ppo settings"):
        train(other)


def test_resume_from_missing_checkpoint(tiny_config, tmp_path):
    with pytest.raises(CheckpointError, match="No checkpoint found"):
        train(replace(tiny_config, **{"run.resume": str(tmp_path / "nothing"), "run.out_dir": str(tmp_path / "o")}))


@pytest.mark.parametrize("changes, field", [
    ({"num_envs": 30, "num_groups": 4}, "env.num_groups"),
    ({"num_envs": 0}, "env.num_envs"),
    ({"episode_length": 0}, "env.episode_length"),
])
def test_env_settings_errors_name_the_field(changes, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        EnvConfig(**changes)


def test_minibatch_layout_error_names_the_fix():
    with pytest.raises(ConfigError, match=r"ppo\.batch_size \* ppo\.num_minibatches .* multiple of env\.num_envs"):
        TrainConfig(env=EnvConfig(num_envs=48), ppo=PPOConfig(batch_size=16, num_minibatches=4))


def test_ppo_settings_errors():
    with pytest.raises(ConfigError, match=r"ppo\.discounting"):
        PPOConfig(discounting=1.5)
    with pytest.raises(ConfigError, match=r"ppo\.unroll_length"):
        PPOConfig(unroll_length=0)


def test_configs_are_frozen(tiny_config):
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny_config.env.num_envs = 3  # type: ignore[misc]


def test_schedule_matches_brax_formula():
    # brax: num_training_steps_per_epoch = ceil(num_timesteps / (max(num_evals - 1, 1) * env_steps_per_step)).
    from jaxrose.presets import get_preset

    ant = get_preset("ant-mlp")
    assert ant.env_steps_per_iteration == 2048 * 32 * 5 == 327_680
    assert ant.iterations_per_eval == int(np.ceil(50_000_000 / (10 * 327_680))) == 16
    assert ant.unrolls_per_iteration == 16


def test_minibatch_segments_must_divide_an_iteration():
    """Checked with the settings, not at compile time (where it aborted a run whose evaluation compiled beside)."""
    segments = TrainConfig().ppo.segments_per_iteration
    with pytest.raises(ConfigError, match=rf"ppo\.minibatch_segments \(100\) must divide an iteration's {segments}"):
        TrainConfig(ppo=PPOConfig(minibatch_segments=100))
    with pytest.raises(ConfigError, match=r"ppo\.minibatch_segments"):
        TrainConfig(ppo=PPOConfig(minibatch_segments=2 * segments))
    assert TrainConfig(ppo=PPOConfig(minibatch_segments=segments // 4)).ppo.minibatch_segments == segments // 4
