"""Autotuning end to end on CPU: every kept change measured faster by more than the noise."""

import pytest

from jaxrose.graph import build_graph
from jaxrose.plan import validate
from jaxrose.ppo_program import ITERATION_INPUTS
from jaxrose.sequential import SequentialExecutor
from jaxrose.tune import Switches, tune


def test_tune_keeps_only_measured_improvements(tiny_config):
    result = tune(tiny_config, max_candidates=2, iterations=2)
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
    # The nested rollout-step loop is tried unrolled, judged by its measurement like every candidate.
    unroll = [t for t in result.trials if t.description == "unroll loop rollout_step"]
    assert len(unroll) == 1 and unroll[0].measured_seconds > 0
    assert any("rollout_step" in chunk.unrolled for chunk in result.plan.chunks) == unroll[0].kept
    program = SequentialExecutor(tiny_config).program
    validate(result.plan, program, build_graph(program, ITERATION_INPUTS))


def test_switches_reproduce_an_ablation(tiny_config):
    """Overlap off and validation off: no overlap is tried, and nothing is measured per candidate."""
    result = tune(tiny_config, Switches(overlap=False, validate=False), max_candidates=2, iterations=2)
    assert not any(t.description.startswith("overlap") for t in result.trials)
    assert all(t.measured_seconds is None for t in result.trials)


def test_group_spread_is_tried_and_judged_by_measurement(tiny_config):
    """Only the groups switch on: the spread candidates are measured end to end, and one is kept
    exactly when it beats the sequential plan by more than the noise."""
    result = tune(tiny_config, Switches(groups=True, overlap=False, restructure=False, quotas=False),
                  iterations=2)
    spreads = [t for t in result.trials if t.description.startswith("spread")]
    assert [t.description for t in spreads] == ["spread the rollout over 2 group processes",
                                                "spread the rollout over 4 group processes"]
    current = result.baseline_seconds
    for trial in spreads:
        assert trial.measured_seconds > 0
        assert trial.kept == (trial.measured_seconds < current - result.noise_seconds)
        if trial.kept:
            current = trial.measured_seconds
    assert (result.plan.spread_chunk is not None) == any(t.kept for t in spreads)
