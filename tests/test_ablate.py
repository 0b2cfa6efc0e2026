"""The ablation runner end to end on a tiny preset: rows, speedups recomputed from the measured
seconds, CSV and JSON that agree, and errors that name the bad setting."""

import csv
import dataclasses
import json
import time

import pytest

from jaxrose.ablate import ablate, arm_switches, default_arms, known_arms, sm_note
from jaxrose.cli import main
from jaxrose.config import ConfigError
from jaxrose.presets import get_preset
from jaxrose.tune import Switches

SWITCHES = [f.name for f in dataclasses.fields(Switches)]
ARMS = ["no-groups", "only-overlap"]  # no group processes: keeps the CPU run short


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ablate")
    progress = []
    rows = ablate(["point-mass"], ARMS, seeds=[0], iterations=2, max_candidates=1, out_dir=str(out),
                  progress_fn=progress.append)
    return rows, out, progress


def test_one_row_per_preset_arm_seed(run):
    rows, _, progress = run
    assert [(r["preset"], r["arm"], r["seed"]) for r in rows] == [("point-mass", a, 0) for a in ["sequential", *ARMS]]
    assert progress == rows
    steps = get_preset("point-mass").env_steps_per_iteration
    for row in rows:
        switches = arm_switches(row["arm"])
        assert [row[f"switch_{n}"] for n in SWITCHES] == [bool(switches and getattr(switches, n)) for n in SWITCHES]
        assert row["iterations"] == 2 and row["seconds_per_iteration"] > 0
        assert row["env_steps_per_second"] == pytest.approx(steps / row["seconds_per_iteration"])
        # A CPU has no GPM counters: the figure stays absent rather than made up.
        assert row["sm_activity_pct"] is None and row["sm_occupancy_pct"] is None and row["sm_samples"] == 0
        # At most max_candidates=1 planner candidate, plus the rollout-step loop unrolled where restructuring is on.
        loops = 1 if switches and switches.restructure else 0
        assert 0 <= row["candidates_kept"] <= row["candidates_tried"] <= 1 + loops
        assert isinstance(row["plan"], str) and row["plan"]
    sequential = rows[0]
    assert sequential["tuning_seconds"] == 0 and sequential["candidates_tried"] == 0
    assert sequential["plan"] == "sequential"
    assert all(r["tuning_seconds"] > 0 for r in rows[1:])
    # Arms of one preset and seed share tuning measurements: the first tuned arm measures everything,
    # the next reads back at least the sequential plan's noise pair and the stage profile.
    assert [r["measurements_reused"] for r in rows[:2]] == [0, 0] and rows[2]["measurements_reused"] >= 3


def test_every_runs_chosen_plan_is_saved_and_loads_back(run):
    """plans.json holds each run's plan (e.g. for `jaxrose bench --tuned-plan`), and its transformations
    are the ones the table names."""
    from jaxrose.ablate import plan_key
    from jaxrose.plan import Plan

    rows, out, _ = run
    plans = json.loads((out / "plans.json").read_text())
    assert sorted(plans) == sorted(plan_key(r["preset"], r["arm"], r["seed"]) for r in rows)
    for row in rows:
        plan = Plan.from_json(json.dumps(plans[plan_key(row["preset"], row["arm"], row["seed"])]))
        assert ("; ".join(plan.history) or "sequential") == row["plan"]


def test_speedups_are_ratios_of_measured_seconds(run):
    rows, _, _ = run
    reference = {(r["preset"], r["seed"]): r["seconds_per_iteration"] for r in rows if r["arm"] == "sequential"}
    for row in rows:
        expected = reference[row["preset"], row["seed"]] / row["seconds_per_iteration"]
        assert row["speedup"] == pytest.approx(expected, rel=1e-12)
    assert rows[0]["arm"] == "sequential" and rows[0]["speedup"] == 1.0


def test_csv_and_json_agree(run):
    rows, out, _ = run
    from_json = json.loads((out / "table.json").read_text())
    with open(out / "table.csv", newline="") as f:
        from_csv = list(csv.DictReader(f))
    assert from_json == rows
    assert len(from_csv) == len(from_json)
    for text_row, row in zip(from_csv, from_json):
        assert list(text_row) == list(row)
        for key, value in row.items():
            if value is None:
                assert text_row[key] == ""
            elif isinstance(value, bool) or isinstance(value, str):
                assert text_row[key] == str(value)
            else:
                assert type(value)(text_row[key]) == value, key  # floats round-trip exactly


def test_summary_and_plots(run):
    _, out, _ = run
    summary = (out / "summary.md").read_text()
    for arm in ["sequential", *ARMS]:
        assert f"| {arm} |" in summary
    assert "SM activity was not measured" in summary
    for name in ("speedup.png", "sm_activity.png"):
        assert (out / name).stat().st_size > 1000


class FakeSampler:
    """Stands in for NVML GPM on a CPU: every window reads 42% SM activity; windows are recorded."""

    available, reason, interval_s = True, None, 0.1
    windows: list = []

    def __enter__(self):
        self._marks = {}
        return self

    def __exit__(self, *exc):
        pass

    def mark(self, label):
        self._marks[label] = time.perf_counter()
        return self._marks[label]

    def marks(self):
        return dict(self._marks)

    def mean(self, t0, t1):
        self.windows.append((t0, t1))
        return {"sm_activity_pct": 42.0, "sm_occupancy_pct": 10.0, "num_samples": 3}


def test_sm_activity_is_averaged_over_the_timed_iterations_only(monkeypatch):
    monkeypatch.setattr("jaxrose.profiler.GpuActivitySampler", FakeSampler)
    monkeypatch.setattr(FakeSampler, "windows", [])
    [row] = ablate(["point-mass"], ["sequential"], [0], iterations=2, out_dir=None)
    assert (row["sm_activity_pct"], row["sm_occupancy_pct"], row["sm_samples"]) == (42.0, 10.0, 3)
    [(t0, t1)] = FakeSampler.windows
    # The window spans the two timed iterations (their median is their mean), not compilation or warm-up.
    assert t1 - t0 == pytest.approx(2 * row["seconds_per_iteration"], rel=0.05)


def test_sm_note_says_why_figures_are_missing():
    rows = [{"sm_activity_pct": None}, {"sm_activity_pct": 30.0}]
    assert sm_note(rows[1:], None) is None
    assert sm_note(rows[:1], "no GPU.") == "SM activity was not measured: no GPU."
    assert sm_note(rows, None).startswith("SM activity is missing for 1 of 2 runs: their timed window held no GPM")


def test_arms_follow_the_switches():
    assert default_arms() == ["sequential", "all"] + [f"no-{n}" for n in SWITCHES]
    assert set(known_arms()) == set(default_arms()) | {f"only-{n}" for n in SWITCHES}
    assert arm_switches("sequential") is None
    assert arm_switches("all") == Switches(**{n: True for n in SWITCHES})
    for name in SWITCHES:
        assert arm_switches(f"no-{name}") == Switches(**{n: n != name for n in SWITCHES})
        assert arm_switches(f"only-{name}") == Switches(**{n: n == name for n in SWITCHES})


@pytest.mark.parametrize("kwargs, message", [
    ({"presets": ["nope"]}, "Unknown preset 'nope'"),
    ({"presets": []}, "presets is empty"),
    ({"arms": ["no-everything"]}, "Unknown arm 'no-everything' in arms"),
    ({"seeds": []}, "seeds is empty"),
    ({"iterations": 0}, "iterations must be an integer >= 1"),
])
def test_bad_input_names_the_setting(kwargs, message, tmp_path):
    settings = {"presets": ["point-mass"], "arms": ["all"], "seeds": [0], "iterations": 1, "out_dir": str(tmp_path),
                **kwargs}
    with pytest.raises(ConfigError, match=message):
        ablate(**settings)
    assert not any(tmp_path.iterdir()), "bad input is caught before anything runs"


def test_cli_reports_bad_input(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["ablate", "--presets", "point-mass", "--arms", "only-nothing"])
    assert exit_info.value.code == 2
    assert "Unknown arm 'only-nothing' in arms" in capsys.readouterr().err
