"""The multi-process runtime with real spawned processes and shared-memory transport."""

import os
import signal

import jax
import numpy as np
import pytest

from jaxrose.graph import build_graph
from jaxrose.plan import PlanError, defer, place, sequential_plan, split_chunk
from jaxrose.ppo_program import ITERATION_INPUTS
from jaxrose.runtime import MultiProcessPlanExecutor
from jaxrose.sequential import SequentialExecutor
from jaxrose.transport import SharedTree, SharedTreeReader, measure_round_trip
from jaxrose.workers import WorkerError


def runtime_segments(runtime) -> set[str]:
    """The shared-memory segments the runtime's hand-off buffers created (the only ones it creates);
    /dev/shm as a whole also holds the segments of tests running beside this one."""
    return {spec.segment for trees in runtime._buffers.values() for tree in trees if tree._buffers is not None
            for spec in tree._buffers.describe()["specs"]}


def existing(segments: set[str]) -> set[str]:
    return {s for s in segments if os.path.exists(os.path.join("/dev/shm", s))}  # Linux's shared memory


def metrics_on_helper_plan(config):
    program = SequentialExecutor(config).program
    graph = build_graph(program, ITERATION_INPUTS)
    plan = split_chunk(sequential_plan(program), "iteration", "reduce_metrics")
    return defer(place(plan, "reduce_metrics", "helper"), program, graph, "reduce_metrics")


def test_transport_round_trip_is_exact():
    tree = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": (np.int32(7), np.ones((2, 0)))}
    writer, reader = SharedTree(), SharedTreeReader()
    try:
        for scale in (1, 2):
            out = reader.read(writer.write(jax.tree.map(lambda x: x * scale, tree)))
            np.testing.assert_array_equal(out["a"], tree["a"] * scale)
            assert int(out["b"][0]) == 7 * scale and out["b"][1].shape == (2, 0)
    finally:
        reader.close()
        writer.close()
    cost = measure_round_trip({"x": np.zeros((4096, 87), np.float32)}, repeats=5)
    assert cost["bytes"] == 4096 * 87 * 4 and cost["median_seconds"] > 0


def test_multi_process_run_equals_sequential(tiny_config):
    sequential = SequentialExecutor(tiny_config)
    state = sequential.init(jax.random.PRNGKey(2))
    expected_metrics = []
    for _ in range(3):
        state, metrics = sequential.step(state)
        expected_metrics.append({k: v for k, v in jax.device_get(metrics).items() if not k.startswith("health/")})

    runtime = MultiProcessPlanExecutor(tiny_config, metrics_on_helper_plan(tiny_config))
    try:
        other = runtime.init(jax.random.PRNGKey(2))
        runtime.compile(other)
        for _ in range(3):
            other, main_metrics = runtime.step(other)
            assert not any(k.startswith("train/") for k in main_metrics)  # training metrics are the helper's now
            assert all(main_metrics[k] == 1.0 for k in main_metrics if k.startswith("health/"))
        results = runtime.drain()
        segments = runtime_segments(runtime)
        assert segments and existing(segments) == segments  # the hand-offs went through shared memory
    finally:
        runtime.close()
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(other), strict=True):
        np.testing.assert_array_equal(a, b)
    assert [(p, k) for p, k, _, _ in results] == [("helper", 0), ("helper", 1), ("helper", 2)]
    for (_, k, outputs, _), expected in zip(results, expected_metrics):
        assert outputs["metrics"] == expected, k
    assert not runtime.helpers
    assert not existing(segments)  # no shared memory left behind


def test_killed_helper_is_a_clear_error(tiny_config):
    runtime = MultiProcessPlanExecutor(tiny_config, metrics_on_helper_plan(tiny_config), timeout=30)
    try:
        state = runtime.init(jax.random.PRNGKey(0))
        state, _ = runtime.step(state)
        runtime.drain()
        os.kill(runtime.helpers["helper"].process.pid, signal.SIGKILL)
        with pytest.raises(WorkerError, match=r"helper \(pid \d+\) died"):
            for _ in range(3):
                state, _ = runtime.step(state)
            runtime.drain()
    finally:
        runtime.close()
    assert not runtime.helpers


def test_critical_path_chunk_on_a_helper_is_refused(tiny_config):
    program = SequentialExecutor(tiny_config).program
    plan = place(split_chunk(sequential_plan(program), "iteration", "epoch"), "epoch", "learner")
    with pytest.raises(PlanError, match="keeps the critical path in the main process"):
        MultiProcessPlanExecutor(tiny_config, plan)


def test_a_helper_feeding_another_process_in_the_same_iteration_is_refused(tiny_config):
    """reduce_metrics deferred to a helper, a stage reading its metrics deferred on main: the plan is
    legal, but this runtime hands data from main to helpers only (it failed with a bare KeyError)."""
    from custom_programs import ppo_with_metrics_counted

    program = ppo_with_metrics_counted(SequentialExecutor(tiny_config))
    graph = build_graph(program, ITERATION_INPUTS)
    plan = split_chunk(split_chunk(sequential_plan(program), "iteration", "reduce_metrics"), "reduce_metrics",
                       "count_metrics")
    plan = defer(plan, program, graph, "count_metrics")
    plan = defer(place(plan, "reduce_metrics", "helper"), program, graph, "reduce_metrics")
    with pytest.raises(PlanError, match=r"'count_metrics' \(process 'main'\) reads 'metrics', which chunk "
                                        r"'reduce_metrics' writes on process 'helper'"):
        MultiProcessPlanExecutor(tiny_config, plan, program_factory=ppo_with_metrics_counted)
    # Both on the helper: accepted, and the run equals the single-process plan's.
    both = place(plan, "count_metrics", "helper")
    runtime = MultiProcessPlanExecutor(tiny_config, both, program_factory=ppo_with_metrics_counted)
    try:
        state = runtime.init(jax.random.PRNGKey(0))
        runtime.compile(state)
        for _ in range(2):
            state, _ = runtime.step(state)
        outputs = [out for _, _, out, _ in runtime.drain()]
    finally:
        runtime.close()
    assert [float(out["metric_count"]) for out in outputs] == [float(len(outputs[0]["metrics"]))] * 2


def test_train_with_a_saved_plan(tiny_config, tmp_path):
    """`run.plan` runs the plan's chunks in their processes; the run equals the sequential one and
    the metrics computed on the helper reach metrics.jsonl."""
    import json

    from jaxrose import train
    from jaxrose.config import replace

    plan_path = tmp_path / "plan.json"
    metrics_on_helper_plan(tiny_config).save(str(plan_path))
    plain = train(replace(tiny_config, **{"run.out_dir": str(tmp_path / "plain")}))
    planned = train(replace(tiny_config, **{"run.out_dir": str(tmp_path / "planned"), "run.plan": str(plan_path)}))
    for a, b in zip(jax.tree.leaves(plain.state), jax.tree.leaves(planned.state), strict=True):
        np.testing.assert_array_equal(a, b)
    records = [json.loads(line) for line in (tmp_path / "planned" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/total_loss"] for r in records if "train/total_loss" in r]
    plain_records = [json.loads(line) for line in (tmp_path / "plain" / "metrics.jsonl").read_text().splitlines()]
    assert losses == [r["train/total_loss"] for r in plain_records if "train/total_loss" in r]
    assert len(losses) == tiny_config.num_iterations


def test_plan_for_another_program_is_refused(tiny_config, tmp_path):
    from jaxrose import train
    from jaxrose.config import replace
    from jaxrose.plan import Chunk, Plan

    plan_path = tmp_path / "plan.json"
    Plan("ppo", (Chunk("all", ("not_a_stage",)),)).save(str(plan_path))
    with pytest.raises(PlanError, match="cover the program's nodes once each"):
        train(replace(tiny_config, **{"run.out_dir": str(tmp_path / "o"), "run.plan": str(plan_path)}))
