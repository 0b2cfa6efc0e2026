"""Data parallel on several (virtual CPU) devices equals the single-device run for the same seed."""

import jax
import numpy as np
import pytest

from jaxrose.config import ConfigError, replace
from jaxrose.sequential import SequentialExecutor


def run(config, iterations=2):
    executor = SequentialExecutor(config)
    state = executor.init(jax.random.PRNGKey(11))
    for _ in range(iterations):
        state, metrics = executor.step(state)
    return executor, state, jax.device_get(metrics)


def test_four_devices_equal_one(tiny_config):
    """Tolerance, not bit equality: sharding changes the order of reductions (observation statistics,
    advantage normalisation, gradient sums) at float32 rounding level."""
    assert jax.local_device_count() >= 4, "conftest sets JAX_NUM_CPU_DEVICES=4"
    config = replace(tiny_config, **{"env.num_groups": 4})
    _, single, single_metrics = run(config)
    executor, sharded, sharded_metrics = run(replace(config, **{"run.devices": 4}))
    # The env state really lives on four devices, one group each.
    leaf = jax.tree.leaves(sharded.env_state)[0]
    assert len(leaf.sharding.device_set) == 4 and leaf.addressable_shards[0].data.shape[0] == 1
    for a, b in zip(jax.tree.leaves(single.learner.params), jax.tree.leaves(sharded.learner.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)
    for a, b in zip(jax.tree.leaves(single.env_state), jax.tree.leaves(sharded.env_state), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)
    assert sharded_metrics["train/total_loss"] == pytest.approx(single_metrics["train/total_loss"], rel=1e-3, abs=1e-4)


def test_groups_must_divide_over_devices(tiny_config):
    with pytest.raises(ConfigError, match=r"env\.num_groups \(2\) must be a multiple of run\.devices \(4\)"):
        replace(tiny_config, **{"run.devices": 4})


def test_more_devices_than_present_is_an_error(tiny_config):
    config = replace(tiny_config, **{"env.num_groups": 8, "env.num_envs": 32, "run.devices": 8})
    with pytest.raises(ConfigError, match="run.devices is 8 but this process sees 4"):
        SequentialExecutor(config)


def test_a_chunked_plan_over_four_devices_equals_the_sequential_run_there(tiny_config):
    """A plan's chunks compile with the state's shardings (one compiled for one device would refuse the
    sharded env state) and compute, bit for bit, what the one-program iteration computes on the same devices."""
    from jaxrose.plan import sequential_plan, split_chunk
    from jaxrose.plan_executor import PlanExecutor

    config = replace(tiny_config, **{"env.num_groups": 4, "run.devices": 4})
    _, expected, _ = run(config)
    program = SequentialExecutor(config).program
    plan = split_chunk(sequential_plan(program), "iteration", "prepare_batch")
    executor = PlanExecutor(config, plan)
    state = executor.init(jax.random.PRNGKey(11))
    executor.compile(state)
    for _ in range(2):
        state, _ = executor.step(state)
    assert len(jax.tree.leaves(state.env_state)[0].sharding.device_set) == 4
    for a, b in zip(jax.tree.leaves(expected.learner.params), jax.tree.leaves(state.learner.params), strict=True):
        np.testing.assert_array_equal(a, b)
