"""Env groups spread over real worker processes: same parameters as the sequential executor."""

import os

import jax
import numpy as np
import pytest

from jaxrose.config import replace
from jaxrose.graph import build_graph
from jaxrose.group_runtime import GroupSpreadExecutor
from jaxrose.plan import Plan, PlanError, sequential_plan, split_chunk, split_groups, spread_groups
from jaxrose.plan_executor import PlanExecutor
from jaxrose.ppo_program import ITERATION_INPUTS
from jaxrose.sequential import SequentialExecutor
from jaxrose.transport import measure_hand_off
from jaxrose.workers import WorkerError


def runtime_segments(runtime) -> set[str]:
    """The shared-memory segments of the runtime's transport buffers."""
    buffers = [runtime._broadcast, *runtime._results]
    return {spec.segment for b in buffers if b is not None for spec in b.describe()["specs"]}


def existing(segments: set[str]) -> set[str]:
    return {s for s in segments if os.path.exists(os.path.join("/dev/shm", s))}


def spread_plan(config, groups=4, processes=("g0", "g1")):
    program = SequentialExecutor(config).program
    graph = build_graph(program, ITERATION_INPUTS)
    plan = split_chunk(split_groups(sequential_plan(program), groups, config.env.num_envs), "iteration",
                       "prepare_batch")
    return spread_groups(plan, program, graph, plan.chunks[0].name, processes), program, graph


def test_spread_groups_equals_sequential(tiny_config):
    config = replace(tiny_config, **{"env.num_groups": 4})
    sequential = SequentialExecutor(config)
    state = sequential.init(jax.random.PRNGKey(3))
    expected = []
    for _ in range(3):
        state, metrics = sequential.step(state)
        expected.append(jax.device_get(metrics))

    plan, _, _ = spread_plan(config)
    assert plan.processes == ["g0", "g1", "main"]
    runtime = GroupSpreadExecutor(config, Plan.from_json(plan.to_json()), timeout=120)
    try:
        other = runtime.init(jax.random.PRNGKey(3))
        runtime.compile(other)
        for k in range(3):
            other, metrics = runtime.step(other)
            got = jax.device_get(metrics)
            for name, value in expected[k].items():
                np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
        # Parameters: the same arithmetic on the same values, so bitwise on CPU.
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(other.learner), jax.device_get(state.learner))
        # The env state lives in the group processes; materialize brings back exactly the sequential one.
        live = runtime.materialize(other)
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(live.env_state), jax.device_get(state.env_state))
        # Restarting from a materialized state (as after a checkpoint restore) continues identically.
        state, _ = sequential.step(state)
        runtime.reload()  # as in a fresh executor: the state's env state is loaded
        other, _ = runtime.step(live)
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(other.learner), jax.device_get(state.learner))
        segments = runtime_segments(runtime)
        assert existing(segments) == segments and len(segments) > 0
        processes = [w.process for w in runtime.workers]
    finally:
        runtime.close()
    assert not [p for p in processes if p.is_alive()]
    assert not existing(segments), "shared-memory segments leaked"


def test_group_processes_run_a_spread_chunk_with_its_loops_unrolled(tiny_config):
    """A spread chunk whose rollout-step loop the plan unrolled: the group processes build their
    program with it unrolled and the parameters stay the sequential run's."""
    from jaxrose.plan import unroll_loop

    config = replace(tiny_config, **{"env.num_groups": 4})
    sequential = SequentialExecutor(config)
    state = sequential.init(jax.random.PRNGKey(3))
    for _ in range(2):
        state, _ = sequential.step(state)
    plan, program, _ = spread_plan(config)
    plan = unroll_loop(plan, program, "rollout_step")
    assert plan.spread_chunk.unrolled == ("rollout_step",)
    from jaxrose.group_runtime import group_chunk_program

    group_program = group_chunk_program(config, plan, 0)
    inner = [n for n in group_program.body if n.name == "unroll"][0].body[1]
    assert inner.name == "rollout_step" and inner.unroll == inner.length
    runtime = GroupSpreadExecutor(config, Plan.from_json(plan.to_json()), timeout=120)
    try:
        other = runtime.init(jax.random.PRNGKey(3))
        for _ in range(2):
            other, _ = runtime.step(other)
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(other.learner), jax.device_get(state.learner))
    finally:
        runtime.close()


def test_illegal_spreads_are_refused(tiny_config):
    config = replace(tiny_config, **{"env.num_groups": 4})
    program = SequentialExecutor(config).program
    graph = build_graph(program, ITERATION_INPUTS)
    plan = split_groups(sequential_plan(program), 4, config.env.num_envs)
    with pytest.raises(PlanError, match="not group-local"):  # the learner reduces across groups
        spread_groups(plan, program, graph, "iteration", ("g0", "g1"))
    cut = split_chunk(plan, "iteration", "prepare_batch")
    with pytest.raises(PlanError, match="evenly"):
        spread_groups(cut, program, graph, cut.chunks[0].name, ("g0", "g1", "g2"))
    with pytest.raises(PlanError, match="opens the iteration"):
        spread_groups(cut, program, graph, cut.chunks[1].name, ("g0", "g1"))
    with pytest.raises(PlanError, match="two or more"):
        spread_groups(cut, program, graph, cut.chunks[0].name, ("g0",))
    ungrouped = split_chunk(sequential_plan(program), "iteration", "prepare_batch")
    with pytest.raises(PlanError, match="split the envs"):
        spread_groups(ungrouped, program, graph, ungrouped.chunks[0].name, ("g0", "g1"))


def test_plan_in_one_process_ignores_nothing(tiny_config):
    """The spread plan run by the one-process PlanExecutor is the sequential run too (validation path)."""
    config = replace(tiny_config, **{"env.num_groups": 4})
    plan, _, _ = spread_plan(config)
    a, b = PlanExecutor(config, plan), SequentialExecutor(config)
    sa, sb = a.init(jax.random.PRNGKey(0)), b.init(jax.random.PRNGKey(0))
    sa, _ = a.step(sa)
    sb, _ = b.step(sb)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(sa.learner), jax.device_get(sb.learner))


def test_killed_group_process_is_a_clear_error(tiny_config):
    config = replace(tiny_config, **{"env.num_groups": 4})
    plan, _, _ = spread_plan(config)
    runtime = GroupSpreadExecutor(config, plan, timeout=60)
    try:
        state = runtime.init(jax.random.PRNGKey(0))
        state, _ = runtime.step(state)
        segments = runtime_segments(runtime)
        runtime.workers[1].process.kill()
        with pytest.raises(WorkerError, match="g1 .* died"):
            runtime.step(state)
    finally:
        runtime.close()
    assert segments and not existing(segments)


def test_host_hand_off_is_exact_and_timed(monkeypatch):
    tree = {"obs": np.arange(4096 * 87, dtype=np.float32).reshape(4096, 87), "done": np.ones(4096, np.float32)}
    cost = measure_hand_off(tree, "host", repeats=3)
    assert cost["bytes"] == 4096 * 88 * 4
    assert cost["round_trip_median_seconds"] > 0 and cost["gb_per_s_one_way"] > 0
    # Every leaf is compared on the way back: a fault injected into the replies' `obs` is caught.
    import jaxrose.transport as transport

    read = transport.HostBuffers.read
    corrupt = lambda self: {**read(self), "obs": read(self)["obs"] + 1.0}
    monkeypatch.setattr(transport.HostBuffers, "read", corrupt)
    with pytest.raises(AssertionError):
        measure_hand_off(tree, "host", repeats=1)


def test_spread_rollout_cuts_after_the_rollout(tiny_config):
    program = SequentialExecutor(tiny_config).program
    graph = build_graph(program, ITERATION_INPUTS)
    plan = spread_rollout_helper(program, graph, tiny_config)
    assert plan.chunks[0].nodes == ("split_iteration_key", "unroll")  # everything before the learner
    assert plan.chunks[0].group_processes == ("g0", "g1") and plan.num_groups == 4
    assert all(c.process == "main" for c in plan.chunks[1:])


def spread_rollout_helper(program, graph, config):
    from jaxrose.plan import spread_rollout

    return spread_rollout(sequential_plan(program), program, graph, ("g0", "g1"), config.env.num_envs, 2)


def test_a_group_local_stage_that_combines_groups_is_caught(tiny_config):
    """Each group process computes the batch-wide reward scale of its own groups only: the runtime
    refuses to keep one process's value for all (before, process 0's was taken silently)."""
    from custom_programs import ppo_with_a_wrongly_group_local_stage
    from jaxrose.plan import spread_rollout

    program = ppo_with_a_wrongly_group_local_stage(SequentialExecutor(tiny_config))
    plan = spread_rollout(sequential_plan(program), program, build_graph(program, ITERATION_INPUTS), ("g0", "g1"),
                          tiny_config.env.num_envs)
    assert plan.chunks[0].nodes == ("split_iteration_key", "unroll", "scale_rewards")
    runtime = GroupSpreadExecutor(tiny_config, plan, timeout=120, program_factory=ppo_with_a_wrongly_group_local_stage)
    try:
        state = runtime.init(jax.random.PRNGKey(5))
        with pytest.raises(PlanError, match=r"output \['reward_scale'\] differs between group processes"):
            runtime.step(state)
    finally:
        runtime.close()


def test_group_local_batch_preparation_moves_next_to_the_rollout(tiny_config):
    """A stage declared group-local (reward clipping) joins the spread chunk and runs in the group
    processes; the run equals the sequential run of the same program, bit for bit on CPU."""
    from custom_programs import ppo_with_clipped_rewards, ppo_with_clipped_rewards_undeclared
    from jaxrose.plan import spread_rollout

    reference = SequentialExecutor(tiny_config)
    reference = SequentialExecutor(tiny_config, program=ppo_with_clipped_rewards(reference))
    program = reference.program
    graph = build_graph(program, ITERATION_INPUTS)
    plan = spread_rollout(sequential_plan(program), program, graph, ("g0", "g1"), tiny_config.env.num_envs)
    assert plan.chunks[0].nodes == ("split_iteration_key", "unroll", "clip_rewards")
    undeclared = ppo_with_clipped_rewards_undeclared(SequentialExecutor(tiny_config))
    cut = spread_rollout(sequential_plan(undeclared), undeclared, build_graph(undeclared, ITERATION_INPUTS),
                         ("g0", "g1"), tiny_config.env.num_envs)
    assert cut.chunks[0].nodes == ("split_iteration_key", "unroll")  # not declared: stays with the learner

    state = reference.init(jax.random.PRNGKey(5))
    runtime = GroupSpreadExecutor(tiny_config, plan, timeout=120, program_factory=ppo_with_clipped_rewards)
    try:
        other = runtime.init(jax.random.PRNGKey(5))
        for _ in range(2):
            state, _ = reference.step(state)
            other, _ = runtime.step(other)
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(other.learner), jax.device_get(state.learner))
    finally:
        runtime.close()
    # The clipping really ran (in the group processes): without it the parameters differ.
    plain = SequentialExecutor(tiny_config)
    unclipped = plain.init(jax.random.PRNGKey(5))
    for _ in range(2):
        unclipped, _ = plain.step(unclipped)
    assert not np.array_equal(jax.device_get(unclipped.learner.params.policy["params"]["hidden_0"]["kernel"]),
                              jax.device_get(state.learner.params.policy["params"]["hidden_0"]["kernel"]))
