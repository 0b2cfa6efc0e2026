"""Autotuning end to end on CPU: every kept change measured faster by more than the noise."""

import os

import pytest

from jaxrose.graph import build_graph
from jaxrose.plan import validate
from jaxrose.ppo_program import ITERATION_INPUTS
from jaxrose.sequential import SequentialExecutor
from jaxrose.tune import Switches, tune


@pytest.fixture
def no_process_compile_cache():
    """This process without a persistent compile cache (the suite's conftest gives it one), restored after."""
    import jax

    from jaxrose.train import reset_compile_cache

    suite_cache = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    reset_compile_cache()
    yield
    jax.config.update("jax_compilation_cache_dir", suite_cache)
    reset_compile_cache()


def test_tune_keeps_only_measured_improvements(tiny_config, tmp_path, monkeypatch, no_process_compile_cache):
    import jax

    # Neither the run nor this process names a compile cache: tuning compiles through one of its own,
    # then gives this process its previous setting (none) back.
    monkeypatch.setattr("jaxrose.tune.default_compile_cache", lambda: str(tmp_path / "cache"))
    # The evaluation's placement is judged on another measure (test_evaluation_placement_* below).
    # The group spreads are judged on scripted timings below (test_group_spread_*): measuring them here
    # took most of this test's time and checked nothing more.
    result = tune(tiny_config, Switches(groups=False), max_candidates=2, iterations=2, place_evaluation=False)
    assert jax.config.jax_compilation_cache_dir is None and tiny_config.run.compile_cache is None
    assert os.listdir(tmp_path / "cache"), "the tuning's compiles went through its cache"
    assert result.baseline_seconds > 0 and result.final_seconds > 0 and result.tuning_seconds > 0
    assert result.trials, "the planner proposes at least the overlap of the metrics stage"
    current = result.baseline_seconds
    for trial in result.trials:
        if trial.measured_seconds is None:
            assert not trial.kept and trial.reason.startswith("skipped")  # quotas without MPS
            continue
        assert trial.kept == (trial.measured_seconds < current - result.noise_seconds)
        if trial.kept:
            current = trial.measured_seconds
    assert result.final_seconds == pytest.approx(current)
    # No evaluation-placement trial: nothing measured with evaluations, so no speedup claimed for them.
    assert result.speedup_with_evaluations is None
    assert result.report()["speedup_per_iteration"] == pytest.approx(result.baseline_seconds / current)
    # The nested rollout-step loop is tried unrolled, judged by its measurement like every candidate.
    unroll = [t for t in result.trials if t.description == "unroll loop rollout_step"]
    assert len(unroll) == 1 and unroll[0].measured_seconds > 0
    assert any("rollout_step" in chunk.unrolled for chunk in result.plan.chunks) == unroll[0].kept
    program = SequentialExecutor(tiny_config).program
    validate(result.plan, program, build_graph(program, ITERATION_INPUTS))


def test_tuning_compiles_through_the_runs_cache_else_the_processs_else_its_own(tiny_config, tmp_path, monkeypatch,
                                                                                no_process_compile_cache):
    import jax

    from jaxrose.config import replace
    from jaxrose.tune import tuning_compile_cache

    monkeypatch.setattr("jaxrose.tune.default_compile_cache", lambda: str(tmp_path / "own"))
    with tuning_compile_cache(tiny_config) as folder:
        assert folder == str(tmp_path / "own") == jax.config.jax_compilation_cache_dir
    assert jax.config.jax_compilation_cache_dir is None  # restored
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "process"))
    with tuning_compile_cache(tiny_config) as folder:
        assert folder == str(tmp_path / "process") == jax.config.jax_compilation_cache_dir
        jax.jit(lambda x: x * 5.0 - 2.0)(jax.numpy.arange(5.0))  # JAX opens the process's cache here
    process_entries = set(os.listdir(tmp_path / "process"))
    assert process_entries
    run = replace(tiny_config, **{"run.compile_cache": str(tmp_path / "run")})
    with tuning_compile_cache(run) as folder:  # the run's cache becomes this process's, as in `train`
        assert folder == str(tmp_path / "run") == jax.config.jax_compilation_cache_dir
        jax.jit(lambda x: x * 3.0 + 1.0)(jax.numpy.arange(5.0))  # compiled after the move: lands in the run's
    assert os.listdir(tmp_path / "run") and set(os.listdir(tmp_path / "process")) == process_entries


def test_switches_reproduce_an_ablation(tiny_config):
    """Overlap off and validation off: no overlap is tried, and nothing is measured per candidate."""
    result = tune(tiny_config, Switches(overlap=False, validate=False), max_candidates=2, iterations=2)
    assert not any(t.description.startswith("overlap") for t in result.trials)
    assert all(t.measured_seconds is None for t in result.trials)


class FakeSpreadMeasure:
    """A fake (named as such) of the end-to-end measure: scripted seconds per iteration for the plan
    with the rollout spread over N group processes (N = 0: no spread), and a log of what was asked."""

    def __init__(self, seconds: dict[int, float]):
        self.seconds, self.asked = seconds, []

    def __call__(self, plan):
        groups = sum(p.startswith("group") for p in plan.processes)
        self.asked.append(groups)
        return self.seconds[groups]


@pytest.mark.parametrize("spread2, spread4, kept", [
    (0.80, 0.75, [True, True]),     # each beats the plan before it by more than the 0.02 s noise
    (0.99, 0.50, [False, True]),    # 2 within the noise of 1.00 s; 4 beats the unspread plan
    (0.80, 0.79, [True, False]),    # 4 beats 1.00 s but not 2's 0.80 s by the noise
    (0.985, 1.20, [False, False]),  # nothing kept: the sequential plan stays
])
def test_group_spread_is_kept_only_when_measured_faster_by_the_noise(tiny_config, spread2, spread4, kept):
    from jaxrose.graph import build_graph
    from jaxrose.plan import sequential_plan
    from jaxrose.tune import _tune_groups

    program = SequentialExecutor(tiny_config).program
    plan = sequential_plan(program)
    measure, trials = FakeSpreadMeasure({2: spread2, 4: spread4}), []
    chosen, seconds = _tune_groups(tiny_config, measure, program, build_graph(program, ITERATION_INPUTS), plan,
                                   1.00, 0.02, trials)
    assert measure.asked == [2, 4]
    assert [t.description for t in trials] == ["spread the rollout over 2 group processes",
                                               "spread the rollout over 4 group processes"]
    assert [t.kept for t in trials] == kept and [t.measured_seconds for t in trials] == [spread2, spread4]
    best = 4 if kept[1] else 2 if kept[0] else 0
    assert sum(p.startswith("group") for p in chosen.processes) == best
    assert seconds == {0: 1.00, 2: spread2, 4: spread4}[best]
    assert (chosen.spread_chunk is not None) == any(kept)


def test_a_spread_that_cannot_run_is_recorded_as_illegal_not_fatal(tiny_config):
    from jaxrose.graph import build_graph
    from jaxrose.plan import PlanError, sequential_plan
    from jaxrose.tune import _tune_groups

    def refusing_measure(plan):  # a fault injected: the runtime refuses the spread (as over several processes)
        raise PlanError("A plan that spreads the rollout over group processes runs on one process")

    program = SequentialExecutor(tiny_config).program
    plan, trials = sequential_plan(program), []
    chosen, seconds = _tune_groups(tiny_config, refusing_measure, program, build_graph(program, ITERATION_INPUTS),
                                   plan, 1.0, 0.02, trials)
    assert chosen is plan and seconds == 1.0
    assert [(t.kept, t.measured_seconds) for t in trials] == [(False, None)] * 2
    assert all(t.reason.startswith("illegal: A plan that spreads") for t in trials)


class FakeEvaluationMeasure:
    """A fake (named as such) of `Measurements.evaluation_runs`: scripted seconds per iteration with the
    evaluation inline or in a process, and a log of what was asked."""

    def __init__(self, inline: list[float], process: float):
        self.inline, self.process, self.asked = inline, process, []

    def __call__(self, plan, count):
        self.asked.append((plan.evaluation, count))
        return self.inline[:count] if plan.evaluation == "inline" else [self.process] * count


@pytest.mark.parametrize("process_seconds, kept", [(0.90, True), (0.99, False), (1.05, False)])
def test_evaluation_placement_is_kept_only_when_measured_faster_than_inline_by_the_noise(tiny_config,
                                                                                          process_seconds, kept):
    """Inline measured twice (1.00 and 1.02 s: noise 0.02 s), the process once; kept only below 0.98 s."""
    from jaxrose.plan import sequential_plan
    from jaxrose.tune import _tune_evaluation

    plan = sequential_plan(SequentialExecutor(tiny_config).program)
    measure, trials = FakeEvaluationMeasure([1.00, 1.02], process_seconds), []
    chosen, inline_seconds, placed_seconds = _tune_evaluation(tiny_config, measure, plan, Switches(), trials)
    assert measure.asked == [("inline", 2), ("process", 1)]
    # What the result reports with evaluations included: the faster inline run, and the chosen placement's
    assert (inline_seconds, placed_seconds) == (1.00, process_seconds if kept else 1.00)
    assert [(t.description, t.measured_seconds, t.kept) for t in trials] == \
        [("evaluation in its own process", process_seconds, kept)]
    assert chosen.evaluation == ("process" if kept else "inline")
    assert ("evaluation in its own process" in chosen.history) == kept


def test_evaluation_placement_respects_the_switches_and_the_run(tiny_config):
    from jaxrose.config import replace
    from jaxrose.plan import evaluate_in_process, sequential_plan
    from jaxrose.tune import _tune_evaluation

    plan = sequential_plan(SequentialExecutor(tiny_config).program)
    measure = FakeEvaluationMeasure([1.0, 1.0], 0.5)
    for config, switches, chosen_plan, reason in [
            (tiny_config, Switches(overlap=False), plan, None),  # an overlap: its switch off, not tried
            (tiny_config, Switches(validate=False), plan, "skipped: with validation off"),
            (replace(tiny_config, **{"run.num_evals": 1}), Switches(), plan, "skipped: no periodic evaluation"),
            (tiny_config, Switches(), evaluate_in_process(plan), "skipped: the run already evaluates in a process")]:
        trials = []
        assert _tune_evaluation(config, measure, chosen_plan, switches, trials) == (chosen_plan, None, None)
        assert [t.reason[:len(reason)] for t in trials] == ([reason] if reason else [])
    assert measure.asked == []  # nothing measured in any of these


def test_a_plan_that_evaluates_in_a_process_trains_there_with_the_same_results(tiny_config, tmp_path):
    """`Plan.evaluation='process'` reaches train (an evaluation worker runs) and, evaluation being outside
    the iteration, the returns equal the inline run's; `measure_with_evaluation` times both from real
    training, within the wall time of its call."""
    import time

    from jaxrose.config import replace
    from jaxrose.plan import Plan, evaluate_in_process, sequential_plan
    from jaxrose.train import train
    from jaxrose.tune import measure_with_evaluation

    inline = sequential_plan(SequentialExecutor(tiny_config).program)
    path = tmp_path / "plan.json"
    evaluate_in_process(inline).save(str(path))
    assert Plan.load(str(path)).evaluation == "process"
    runs = {}
    for name, plan_path in (("inline", None), ("process", str(path))):
        config = replace(tiny_config, **{"run.plan": plan_path, "run.out_dir": str(tmp_path / name)})
        runs[name] = train(config, write_outputs=False)
    assert not runs["inline"].eval_worker and runs["process"].eval_worker  # the worker describes itself
    assert [e["eval/episode_return"] for e in runs["process"].evaluations] == \
        [e["eval/episode_return"] for e in runs["inline"].evaluations]
    for plan in (inline, evaluate_in_process(inline)):
        start = time.perf_counter()
        seconds = measure_with_evaluation(tiny_config, plan, periods=1)
        wall = time.perf_counter() - start
        assert 0 < seconds * tiny_config.iterations_per_eval < wall


class FakeQuotaMeasure:
    """A fake (named as such) of the end-to-end measure, modelling a GPU shared by two group processes of
    equal work: uncapped they contend (1.00 s per iteration); capped equally they split the SMs (0.80 s at 50%
    each, 0.90 s at 25%); one capped alone, or unequally, sets the pace as the slower of two equal shares."""

    SECONDS = {(): 1.00, (50,): 1.20, (25,): 1.30, (10,): 1.50, (50, 50): 0.80, (25, 25): 0.90,
               (25, 50): 1.00, (10, 50): 1.10, (10, 25): 1.20, (10, 10): 1.40}

    def __init__(self):
        self.asked = []

    def __call__(self, plan):
        caps = tuple(sorted(q for p, q in plan.quotas if p.startswith("group") and q is not None))
        self.asked.append(caps)
        return self.SECONDS[caps]


def test_equal_caps_on_the_group_processes_are_tried_before_each_alone(tiny_config, monkeypatch):
    """Capping one of two equal group processes alone only slows the iteration; equal caps are tried too."""
    from jaxrose.plan import sequential_plan, spread_rollout
    from jaxrose.tune import _tune_quotas

    monkeypatch.setattr("jaxrose.tune.clients_unavailable_reason", lambda use_mps: None)  # as under MPS
    program = SequentialExecutor(tiny_config).program
    plan = spread_rollout(sequential_plan(program), program, build_graph(program, ITERATION_INPUTS),
                          ("group0", "group1"), tiny_config.env.num_envs)
    measure, trials = FakeQuotaMeasure(), []
    chosen, seconds = _tune_quotas(tiny_config, measure, plan, 1.00, 0.02, Switches(), trials)
    assert trials[0].description == "quota 50% for each of group0, group1" and trials[0].kept
    assert trials[1].description == "quota 25% for each of group0, group1" and not trials[1].kept
    assert not any(t.kept for t in trials[2:])  # no single cap beats the equal split afterwards
    assert {p: q for p, q in chosen.quotas if q is not None} == {"group0": 50, "group1": 50} and seconds == 0.80
    assert measure.asked[:2] == [(50, 50), (25, 25)]
