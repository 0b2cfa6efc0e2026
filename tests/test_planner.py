"""Window-guided search on a modelled GPU profile: it must find the model's known optimum."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrose.graph import build_graph
from jaxrose.plan import sequential_plan
from jaxrose.plan_executor import PlanExecutor
from jaxrose.planner import Profile, StageProfile, draw_timeline, rank, simulate
from jaxrose.ppo_program import ITERATION_INPUTS
from jaxrose.program import Stage
from jaxrose.sequential import SequentialExecutor

# A modelled H200 profile of one ant-mlp iteration (stage times from BENCHMARKS.md: rollout 0.257 s
# at the simulation's 47% SM activity, learner update 0.082 s), plus an evaluation stage of 0.10 s
# at 5% activity: latency-bound, like brax's 128-env evaluation.
ANT_LIKE = {
    "split_iteration_key": StageProfile(1e-5, 1.0), "split_unroll_key": StageProfile(1e-5, 1.0),
    "policy_inference": StageProfile(0.040, 20.0), "env_step": StageProfile(0.217, 52.0),
    "close_unroll": StageProfile(1e-4, 5.0), "prepare_batch": StageProfile(2e-3, 30.0),
    "update_normalizer": StageProfile(5e-4, 20.0), "split_learner_key": StageProfile(1e-5, 1.0),
    "shuffle": StageProfile(4e-3, 30.0), "sgd_step": StageProfile(0.078, 25.0),
    "reduce_metrics": StageProfile(1e-4, 1.0), "evaluate": StageProfile(0.100, 5.0),
}
DISPATCH = 5e-5


def ppo_with_evaluation(executor):
    """PPO plus an evaluation stage reading the new params: a user program, as in the notebooks."""
    net = executor.net

    def evaluate(params, normalizer, env_state):
        action = net.act_deterministic(params, normalizer, env_state.obs)
        return {"eval_metrics": {"mean_abs_action": jnp.mean(jnp.abs(action))}}

    stage = Stage("evaluate", evaluate, ("params", "normalizer", "env_state"), ("eval_metrics",), "eval")
    return dataclasses.replace(executor.program, name="ppo+eval", body=executor.program.body + (stage,))


@pytest.fixture
def setup(tiny_config):
    executor = SequentialExecutor(tiny_config)
    program = ppo_with_evaluation(executor)
    return tiny_config, program, build_graph(program, ITERATION_INPUTS)


def test_model_of_the_sequential_plan_is_the_sum_of_stage_times(setup):
    _, program, graph = setup
    schedule = simulate(sequential_plan(program), program, graph, Profile(ANT_LIKE, DISPATCH))
    expected = sum(p.seconds for p in ANT_LIKE.values()) + DISPATCH  # one chunk, one dispatch
    assert schedule.iteration_seconds() == pytest.approx(expected, rel=1e-9)


def test_search_finds_the_known_optimum(setup):
    """The model's optimum is to run the iteration's legal tail, `reduce_metrics` and `evaluate`
    (nothing in the next iteration reads what they write), on a helper process beside the next
    iteration: the iteration then costs every other stage plus one dispatch, and the moved work
    lands in the low-activity window where the next rollout starts (policy inference at 20%)."""
    _, program, graph = setup
    profile = Profile(ANT_LIKE, DISPATCH)
    ranked = rank(sequential_plan(program), program, graph, profile, threshold=50.0)
    best = ranked[0]
    assert best.description == "overlap reduce_metrics.. with the next iteration on a helper process"
    others = sum(p.seconds for name, p in ANT_LIKE.items() if name not in ("evaluate", "reduce_metrics"))
    assert best.predicted_seconds == pytest.approx(others + DISPATCH, rel=1e-9)
    # The window it lands in, by hand: the last of the 4 modelled iterations starts after 3 sequential ones;
    # from there the dispatch (no activity), the two key splits (1%) and policy inference (20%) stay below 50%.
    iteration = sum(p.seconds for p in ANT_LIKE.values()) + DISPATCH
    span = DISPATCH + 2e-5 + 0.040
    assert best.window == pytest.approx((3 * iteration, 3 * iteration + span, (2e-5 * 1.0 + 0.040 * 20.0) / span),
                                        rel=1e-6)
    # Splitting only adds dispatches: every split is predicted to lose.
    assert all(c.predicted_gain < 0 for c in ranked if c.description.startswith("split"))
    # Evaluation alone is next best; no tail holding training or rollout is offered: training k feeds
    # rollout k+1, so only work off the critical path may overlap the next iteration.
    assert ranked[1].description == "overlap evaluate.. with the next iteration on a helper process"
    offered = {c.description.split("..")[0] for c in ranked if c.description.startswith("overlap")}
    assert offered == {"overlap reduce_metrics", "overlap evaluate"}


def test_the_chosen_plan_keeps_the_parameters(setup):
    config, program, graph = setup
    best = rank(sequential_plan(program), program, graph, Profile(ANT_LIKE, DISPATCH))[0].plan
    reference = SequentialExecutor(config, program=program)
    a = reference.init(jax.random.PRNGKey(0))
    for _ in range(2):
        a, _ = reference.step(a)
    plan_executor = PlanExecutor(config, best, program=program)
    b = plan_executor.init(jax.random.PRNGKey(0))
    for _ in range(2):
        b, _ = plan_executor.step(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_timeline_is_drawn_and_respects_dependencies(setup, tmp_path):
    _, program, graph = setup
    best = rank(sequential_plan(program), program, graph, Profile(ANT_LIKE, DISPATCH))[0].plan
    schedule = simulate(best, program, graph, Profile(ANT_LIKE, DISPATCH))
    by_key = {(i.chunk, i.iteration): i for i in schedule.intervals}
    helper = [i for i in schedule.intervals if i.process == "helper"]
    assert helper, "the evaluation runs on the helper process"
    for interval in helper:  # evaluation k starts only after iteration k's main chunk has finished
        assert interval.start >= by_key[("iteration", interval.iteration)].end
    draw_timeline(schedule, str(tmp_path / "timeline.png"), "ppo+eval, planned")
    assert (tmp_path / "timeline.png").stat().st_size > 5000
