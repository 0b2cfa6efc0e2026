"""Tuning calls that share `Measurements` (an ablation's arms): a plan measured once is read back,
never measured twice, and the decisions equal those of a tune that measured everything itself."""

import dataclasses

import pytest

import jaxrose.tune as tune_module
from jaxrose.ablate_report import summary_markdown
from jaxrose.config import replace
from jaxrose.tune import Measurements, Switches, tune

# Restructuring alone (split, fuse, loops unrolled) runs in this process: no helper processes to start.
SWITCHES = Switches(groups=False, overlap=False, quotas=False)


@pytest.fixture
def counted_measurements(monkeypatch):
    """Counts real end-to-end measurements (a spy around `measure_plan`, which still runs)."""
    calls = []
    real = tune_module.measure_plan

    def spy(config, plan, iterations=5, seed=None, sampler=None):
        calls.append(plan.to_json())
        return real(config, plan, iterations, seed, sampler)

    monkeypatch.setattr(tune_module, "measure_plan", spy)
    return calls


def test_later_tunes_read_back_what_earlier_ones_measured(tiny_config, counted_measurements):
    shared = Measurements(tiny_config)
    first = tune(tiny_config, SWITCHES, max_candidates=1, iterations=2, measurements=shared)
    measured = [t for t in first.trials if t.measured_seconds is not None]
    # The sequential plan twice (noise), then one measurement per judged candidate; the profile apart.
    assert len(counted_measurements) == 2 + len(measured) and measured
    assert first.measurements_reused == 0 and shared.taken == 2 + len(measured) + 1

    # The same switches again: nothing is measured, and every decision is the first tune's.
    second = tune(tiny_config, SWITCHES, max_candidates=1, iterations=2, measurements=shared)
    assert len(counted_measurements) == 2 + len(measured)
    assert second.measurements_reused == 2 + len(measured) + 1
    assert [dataclasses.astuple(t) for t in second.trials] == [dataclasses.astuple(t) for t in first.trials]
    assert second.plan.to_json() == first.plan.to_json()
    assert (second.baseline_seconds, second.noise_seconds) == (first.baseline_seconds, first.noise_seconds)

    # Every switch off: the arm only reads the sequential pair and the profile, and keeps the sequential plan.
    before = len(counted_measurements)
    other = tune(tiny_config, dataclasses.replace(SWITCHES, restructure=False), max_candidates=1, iterations=2,
                 measurements=shared)
    assert len(counted_measurements) == before and other.measurements_reused == 3
    assert other.trials == [] and other.final_seconds == first.baseline_seconds


def test_measurements_of_another_config_are_refused(tiny_config):
    shared = Measurements(tiny_config)
    with pytest.raises(ValueError, match="different config"):
        tune(replace(tiny_config, **{"run.seed": 1}), SWITCHES, measurements=shared)


def test_summary_counts_reused_measurements_and_reads_older_tables():
    row = {"preset": "p", "seed": 0, "iterations": 2, "seconds_per_iteration": 0.5, "env_steps_per_second": 2.0,
           "speedup": 1.0, "sm_activity_pct": None, "tuning_seconds": 3.0, "candidates_kept": 1,
           "candidates_tried": 2}
    text = summary_markdown([{**row, "arm": "sequential"}, {**row, "arm": "all", "measurements_reused": 4}])
    header, _, sequential, all_arm = text.splitlines()[-4:]
    assert header.endswith("| reused |")
    assert sequential.endswith("| n/a |") and all_arm.endswith("| 4 |")


@pytest.mark.parametrize("flag, reuse", [([], True), (["--no-reuse-measurements"], False)])
def test_cli_passes_the_reuse_setting(monkeypatch, flag, reuse):
    import jaxrose.ablate as ablate_module
    from jaxrose.cli import main

    seen = {}

    def spy(*args, **kwargs):  # records what the CLI asked for, then stops before any tuning
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr(ablate_module, "ablate", spy)
    with pytest.raises(SystemExit):
        main(["ablate", "--presets", "point-mass", *flag])
    assert seen == {"reuse_measurements": reuse}
