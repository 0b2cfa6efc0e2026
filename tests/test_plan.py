"""The dataflow graph, plans as data, and every transformation checked against the sequential run."""

import jax
import numpy as np
import pytest

from jaxrose.graph import ITERATION, build_graph
from jaxrose.plan import (Plan, PlanError, chunk_program, defer, fuse_chunks, place, sequential_plan, split_chunk,
                          split_groups, unroll_loop, validate)
from jaxrose.plan_executor import PlanExecutor
from jaxrose.ppo_program import ITERATION_INPUTS
from jaxrose.sequential import SequentialExecutor




def run_params(executor, iterations=3, seed=7):
    state = executor.init(jax.random.PRNGKey(seed))
    executor.compile(state)
    for _ in range(iterations):
        state, metrics = executor.step(state)
    return jax.device_get(state), jax.device_get(metrics)


def assert_same(a, b, num_envs=None):
    """Equal leaves; env-state leaves compared in the flat [num_envs, ...] layout when groups differ."""
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        if num_envs and np.shape(x) != np.shape(y):
            x, y = np.reshape(x, (num_envs, -1)), np.reshape(y, (num_envs, -1))
        np.testing.assert_array_equal(x, y)


@pytest.fixture
def program_and_graph(tiny_config):
    program = SequentialExecutor(tiny_config).program
    return program, build_graph(program, ITERATION_INPUTS)


def test_graph_edges_and_readiness(program_and_graph):
    _, graph = program_and_graph
    carried = {(e.src, e.dst, e.name) for e in graph.iteration_carried()}
    assert ("sgd_step", "policy_inference", "params") in carried
    assert ("env_step", "policy_inference", "env_state") in carried
    inner = {(e.src, e.dst, e.carried_by) for e in graph.edges if e.carried_by not in (None, ITERATION)}
    assert ("env_step", "policy_inference", "rollout_step") in inner
    assert ("sgd_step", "sgd_step", "minibatch") in inner
    # Rollout k+1 may not start before training k has finished; it may start right after.
    done_k0 = {(n.name, 0) for n in graph.nodes}
    assert not graph.ready("policy_inference", 1, done_k0 - {("sgd_step", 0)})
    assert graph.ready("policy_inference", 1, done_k0 | {("split_iteration_key", 1), ("split_unroll_key", 1)})
    assert graph.ready_order(2)[0] == ("split_iteration_key", 0)


def test_plan_json_round_trip_and_printing(program_and_graph, tmp_path):
    program, graph = program_and_graph
    plan = place(split_chunk(sequential_plan(program), "iteration", "prepare_batch"), "prepare_batch", "learner", 60)
    path = tmp_path / "plan.json"
    plan.save(str(path))
    assert Plan.load(str(path)) == plan
    text = str(plan)
    assert "process=learner (60% SMs)" in text and "split iteration before prepare_batch" in text


def test_plan_from_another_version_is_refused():
    with pytest.raises(PlanError, match="another jaxrose version"):
        Plan.from_json('{"format": 99, "program": "ppo", "chunks": []}')


def test_plan_that_reorders_the_program_is_refused(program_and_graph):
    program, graph = program_and_graph
    plan = split_chunk(sequential_plan(program), "iteration", "prepare_batch")
    swapped = Plan(plan.program, (plan.chunks[1], plan.chunks[0]))
    with pytest.raises(PlanError, match="cover the program's nodes once each, in order"):
        validate(swapped, program, graph)


def test_overlapping_rollout_with_previous_training_is_refused(program_and_graph):
    program, graph = program_and_graph
    plan = split_chunk(sequential_plan(program), "iteration", "epoch")
    with pytest.raises(PlanError, match="'sgd_step' writes 'params', which 'policy_inference' reads in the next"):
        defer(fuse_chunks(split_chunk(plan, "epoch", "reduce_metrics"), "epoch", "reduce_metrics"), program, graph,
              "epoch")


def every_transformation(program, graph, num_envs):
    """Each transformation applied to the sequential plan, as (label, plan)."""
    base = sequential_plan(program)
    split_all = base
    for name in [n.name for n in program.body][1:]:
        split_all = split_chunk(split_all, split_all.chunks[-1].name, name)
    tail = split_chunk(base, "iteration", "reduce_metrics")
    return [
        ("split every node", split_all),
        ("fuse back", fuse_chunks(split_all, split_all.chunks[0].name, split_all.chunks[1].name)),
        ("4 env groups", split_groups(base, 4, num_envs)),
        ("learner in its own process", place(split_chunk(base, "iteration", "prepare_batch"), "prepare_batch",
                                             "learner", 50)),
        ("metrics deferred to the next iteration", defer(tail, program, graph, "reduce_metrics")),
        ("rollout steps unrolled, then every node split", unroll_loop(split_all, program, "rollout_step")),
    ]


def test_every_transformation_keeps_the_parameters(tiny_config):
    sequential = SequentialExecutor(tiny_config)
    graph = build_graph(sequential.program, ITERATION_INPUTS)
    expected_state, expected_metrics = run_params(sequential)
    for label, plan in every_transformation(sequential.program, graph, tiny_config.env.num_envs):
        state, metrics = run_params(PlanExecutor(tiny_config, plan))
        assert_same(expected_state.learner, state.learner)
        assert_same(expected_state.env_state, state.env_state, tiny_config.env.num_envs)
        assert metrics == expected_metrics, label


def test_only_a_loop_with_a_static_length_unrolls_and_the_plan_keeps_it(program_and_graph):
    program, _ = program_and_graph
    plan = unroll_loop(sequential_plan(program), program, "rollout_step")
    assert plan.chunks[0].unrolled == ("rollout_step",) and plan.history[-1] == "unroll loop rollout_step"
    assert Plan.from_json(plan.to_json()) == plan and "unrolled: rollout_step" in str(plan)
    unrolled = chunk_program(program, plan.chunks[0])
    inner = [n for n in unrolled.body if n.name == "unroll"][0].body[1]
    assert inner.name == "rollout_step" and inner.unroll == inner.length
    with pytest.raises(PlanError, match="iterates over data"):
        unroll_loop(plan, program, "minibatch")
    with pytest.raises(PlanError, match="unrolled already"):
        unroll_loop(plan, program, "rollout_step")
    with pytest.raises(PlanError, match="No loop named 'nowhere'"):
        unroll_loop(plan, program, "nowhere")
    # A plan file naming a loop its chunk lacks (a typo) is refused, with the chunk's loops named.
    import dataclasses

    typo = dataclasses.replace(plan, chunks=(dataclasses.replace(plan.chunks[0], unrolled=("rollout_stpe",)),))
    with pytest.raises(PlanError, match=r"unrolls loop 'rollout_stpe', which it does not contain; its loops: .*"
                                        r"rollout_step"):
        validate(typo, program, build_graph(program, ITERATION_INPUTS))


def test_bad_group_count_names_the_setting(program_and_graph):
    program, _ = program_and_graph
    with pytest.raises(PlanError, match="divisor of env.num_envs"):
        split_groups(sequential_plan(program), 5, 32)


def test_the_plans_shipped_from_the_h200_are_legal_for_the_ppo_program():
    """docs/ plans that `gpu_session.sh tuned ... PLAN` trains with: each loads, is legal for PPO's iteration
    (every node once, dependencies kept), and equals the transformations its history names, applied to
    the sequential plan."""
    import pathlib

    from jaxrose.config import replace
    from jaxrose.graph import build_graph
    from jaxrose.plan import Plan, sequential_plan, unroll_loop, validate
    from jaxrose.ppo_program import ITERATION_INPUTS
    from jaxrose.presets import get_preset
    from jaxrose.sequential import SequentialExecutor

    config = replace(get_preset("point-mass"), **{"env.num_envs": 8, "ppo.num_minibatches": 2, "ppo.unroll_length": 4,
                                                    "ppo.batch_size": 8})
    program = SequentialExecutor(config).program
    graph = build_graph(program, ITERATION_INPUTS)
    plan = Plan.load(str(pathlib.Path(__file__).parents[1] / "docs/ablate/ant-mlp-h200-mps/tuned-plan.json"))
    validate(plan, program, graph)
    assert plan == unroll_loop(sequential_plan(program), program, "rollout_step")


def test_a_plan_file_with_an_unknown_evaluation_place_is_refused_with_the_fix(tmp_path):
    import json

    from jaxrose.plan import Chunk, Plan, PlanError

    data = json.loads(Plan("ppo", (Chunk("iteration", ("a",)),)).to_json())
    assert data["evaluation"] == "inline"
    data["evaluation"] = "gpu"
    with pytest.raises(PlanError, match=r"\"evaluation\" is 'gpu'; set it to one of inline, process, or re-run"):
        Plan.from_json(json.dumps(data))
    del data["evaluation"]  # a plan saved before the field existed evaluates inline
    assert Plan.from_json(json.dumps(data)).evaluation == "inline"
