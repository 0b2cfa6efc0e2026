"""`jaxrose compare` on hand-built bench results whose times to a threshold are worked out below, on a
stored H200 run against `bench.time_to_threshold` and BENCHMARKS.md, end to end, and its errors."""

import copy
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrose.cli import main as cli_main
from jaxrose.compare import (CompareConfig, compare, interpolated_wall_seconds, load_runs, median_time_ratio,
                              mixed_devices, render_markdown, wall_clock_curve)
from jaxrose.compare import _median_time_ratio_json as to_json_median_time_ratio
from jaxrose.config import ConfigError

REPO = Path(__file__).parent.parent
STEPS = [0, 100, 200, 300]  # every system's evaluations; the one at 0 is before training


def jaxrose_summary(returns, done, sps):
    # Training starts with update 0 at 5 s; it took 4 s, 3 s beyond the median 1 s of the others, so the
    # wall clock to an evaluation is its end (done) - 5 - 3 = done - 8.
    return {"status": "ok", "eval_env_steps": STEPS, "eval_returns": returns, "eval_done_seconds": done,
            "update_start_seconds": [5.0, 9.0, 10.0, 11.0], "update_seconds": [4.0, 1.0, 1.0, 1.0],
            "steady_sps_with_evals": sps, "final_return": returns[-1]}


def brax_summary(returns, done, sps):
    # brax trains from the end of its first evaluation (done[0]) and compiled 4 s in its first epoch:
    # the wall clock to an evaluation is done - done[0] - 4.
    return {"status": "ok", "eval_env_steps": STEPS, "eval_returns": returns, "eval_done_seconds": done,
            "epoch_seconds": [6.0, 2.0, 2.0], "compile_seconds": 4.0, "steady_sps_with_evals": sps,
            "final_return": returns[-1]}


def sequential_summary(returns, done, sps):
    # Iteration 0 starts at 2 s and took 3 s, 2 s beyond the median 1 s: wall clock = done - 2 - 2 = done - 4.
    return {"status": "ok", "eval_env_steps": STEPS, "eval_returns": returns, "eval_done_seconds": done,
            "iteration_start_seconds": [2.0, 4.0, 5.0], "iteration_seconds": [3.0, 1.0, 1.0],
            "steady_sps_with_evals": sps, "final_return": returns[-1]}


def three_seeds() -> dict[str, dict]:
    """Wall clock to each evaluation after training (steps 100, 200, 300), from the rules above:
    s0: async 12-8, 20-8, 28-8 = 4, 12, 20; brax 24-14, 34-14, 44-14 = 10, 20, 30;
        sequential 10-4, 16-4, 22-4 = 6, 12, 18
    s1: async 14-8, 24-8, 34-8 = 6, 16, 26; brax 26-14, 38-14, 50-14 = 12, 24, 36
    s2: async 12-8, 18-8, 24-8 = 4, 10, 16; brax 22-14, 30-14, 38-14 = 8, 16, 24"""
    sim = {"status": "ok", "steady_sps": 1e6}  # no learning curve: not compared
    return {
        # async's evaluation before training returned 900: it reached nothing (it is not trained).
        "s0": {"async": jaxrose_summary([900.0, 1.0, 3.0, 5.0], [6.0, 12.0, 20.0, 28.0], 100.0),
               "brax": brax_summary([0.0, 2.0, 4.0, 6.0], [10.0, 24.0, 34.0, 44.0], 50.0),
               "sequential": sequential_summary([0.0, 1.5, 2.5, 3.5], [3.0, 10.0, 16.0, 22.0], 70.0), "sim": sim},
        "s1": {"async": jaxrose_summary([0.0, 2.0, 4.0, 4.5], [6.0, 14.0, 24.0, 34.0], 120.0),
               "brax": brax_summary([0.0, 1.0, 3.5, 5.0], [10.0, 26.0, 38.0, 50.0], 60.0)},
        # async never reaches 3 in this seed.
        "s2": {"async": jaxrose_summary([0.0, 1.0, 2.0, 2.5], [6.0, 12.0, 18.0, 24.0], 90.0),
               "brax": brax_summary([0.0, 3.0, 4.0, 7.0], [10.0, 22.0, 30.0, 38.0], 40.0)},
    }


def write_results(folder: Path, systems: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "results.json"
    path.write_text(json.dumps({"meta": {"command": f"jaxrose bench --out {folder.name}", "git_commit": "abc",
                                         "source_digest": "0123456789abcdef", "device_kind": "test GPU", "date_utc": "2026-01-01T00:00:00Z"},
                                "systems": systems}))
    return path


@pytest.fixture
def seed_files(tmp_path) -> list[str]:
    return [str(write_results(tmp_path / label, systems)) for label, systems in three_seeds().items()]


def test_steps_and_wall_seconds_to_a_stated_threshold(seed_files):
    comparison = compare(load_runs(CompareConfig(tuple(seed_files))), threshold=3.0)
    times = comparison.times
    assert [run.label for run in comparison.runs] == ["s0", "s1", "s2"]  # each results file's folder
    assert set(times["s0"]) == {"async", "brax", "sequential"}  # sim has no learning curve
    # The first evaluation after training at or above 3:
    assert (times["s0"]["async"].steps_to_threshold, times["s0"]["async"].wall_seconds_to_threshold) == (200, 12.0)
    assert (times["s0"]["brax"].steps_to_threshold, times["s0"]["brax"].wall_seconds_to_threshold) == (200, 20.0)
    assert (times["s0"]["sequential"].steps_to_threshold,
            times["s0"]["sequential"].wall_seconds_to_threshold) == (300, 18.0)  # 3.5 at 300; 2.5 at 200 is short
    assert (times["s1"]["async"].steps_to_threshold, times["s1"]["async"].wall_seconds_to_threshold) == (200, 16.0)
    assert (times["s1"]["brax"].steps_to_threshold, times["s1"]["brax"].wall_seconds_to_threshold) == (200, 24.0)
    assert (times["s2"]["brax"].steps_to_threshold, times["s2"]["brax"].wall_seconds_to_threshold) == (100, 8.0)
    # not reached: s2's async peaks at 2.5
    assert times["s2"]["async"].steps_to_threshold is None and times["s2"]["async"].wall_seconds_to_threshold is None
    assert (times["s2"]["async"].final_return, times["s2"]["async"].steady_sps_with_evals) == (2.5, 90.0)
    assert (comparison.threshold, comparison.stated) == (3.0, True)


def test_medians_and_ranges_over_the_seeds(seed_files):
    systems = compare(load_runs(CompareConfig(tuple(seed_files))), threshold=3.0).systems
    run_async, brax, sequential = systems["async"], systems["brax"], systems["sequential"]
    assert (run_async.reached, run_async.runs) == (2, 3)
    # wall seconds of the runs that reached it: 12, 16 -> median (12 + 16) / 2 = 14
    wall = run_async.wall_seconds_to_threshold
    assert (wall.median, wall.min, wall.max, wall.count) == (14.0, 12.0, 16.0, 2)
    # final returns 5, 4.5, 2.5 -> median 4.5; steps/s incl. evals 100, 120, 90 -> median 100
    assert (run_async.final_return.median, run_async.final_return.min, run_async.final_return.max) == (4.5, 2.5, 5.0)
    sps = run_async.steady_sps_with_evals
    assert (sps.median, sps.min, sps.max) == (100.0, 90.0, 120.0)
    # brax: 20, 24, 8 -> median 20; final 6, 5, 7 -> median 6; 50, 60, 40 -> median 50
    assert (brax.reached, brax.runs) == (3, 3)
    assert (brax.wall_seconds_to_threshold.median, brax.wall_seconds_to_threshold.min,
            brax.wall_seconds_to_threshold.max) == (20.0, 8.0, 24.0)
    assert (brax.final_return.median, brax.steady_sps_with_evals.median) == (6.0, 50.0)
    assert (sequential.reached, sequential.runs, sequential.wall_seconds_to_threshold.median) == (1, 1, 18.0)


def test_brax_over_each_system_per_run_and_its_median(seed_files):
    ratios = compare(load_runs(CompareConfig(tuple(seed_files))), threshold=3.0).brax_ratios
    # s0: 20 / 12; s1: 24 / 16 = 1.5; s2: async did not reach 3, no ratio. Median (5/3 + 1.5) / 2 = 19/12.
    assert ratios["async"].per_run == pytest.approx({"s0": 20 / 12, "s1": 1.5, "s2": None})
    assert ratios["async"].median == pytest.approx(19 / 12)
    # Only s0 has sequential beside brax: 20 / 18.
    assert ratios["sequential"].per_run == pytest.approx({"s0": 20 / 18})
    assert ratios["sequential"].median == pytest.approx(20 / 18)
    assert "brax" not in ratios


def test_median_times_over_all_runs_count_a_miss_as_slower_than_any_reached(seed_files):
    ratios = compare(load_runs(CompareConfig(tuple(seed_files))), threshold=3.0).median_time_ratios
    # brax 20, 24, 8 -> median 20; async 12, 16 and s2's miss (+inf) -> median 16: 20 / 16 (the paired
    # median above, 19/12, drops s2 instead).
    run_async = ratios["async"]
    assert (run_async.brax_runs, run_async.system_runs) == (3, 3)
    assert (run_async.brax_median_seconds, run_async.system_median_seconds, run_async.ratio) == (20.0, 16.0, 1.25)
    # Sequential ran in s0 only (18 s): one run gives a ratio, no interval.
    sequential = ratios["sequential"]
    assert (sequential.ratio, sequential.low, sequential.high) == (pytest.approx(20 / 18), None, None)
    assert set(ratios) == {"async", "sequential"}


def test_runs_that_reached_the_threshold_without_a_clock_are_left_out_of_the_median_times(tmp_path):
    # s0's brax from before the bench stored evaluation times: it reached 3 (at 200) but has no seconds, so
    # it is neither a time nor a miss. brax 24 (s1), 8 (s2) -> median 16; async 12, 16, miss -> 16.
    seeds = three_seeds()
    seeds["s0"]["brax"] = dict(seeds["s0"]["brax"], eval_done_seconds=[])
    files = [str(write_results(tmp_path / label, systems)) for label, systems in seeds.items()]
    comparison = compare(load_runs(CompareConfig(tuple(files))), threshold=3.0)
    assert comparison.times["s0"]["brax"].steps_to_threshold == 200
    ratio = comparison.median_time_ratios["async"]
    assert (ratio.brax_runs, ratio.system_runs, ratio.brax_median_seconds, ratio.ratio) == (2, 3, 16.0, 1.0)
    # Unpaired: sequential's one run (s0, 18 s) against brax's timed runs, though not the one beside it.
    assert comparison.median_time_ratios["sequential"].ratio == pytest.approx(16 / 18)


def test_runs_on_different_devices_are_flagged(tmp_path):
    seeds = three_seeds()
    files = [write_results(tmp_path / label, systems) for label, systems in seeds.items()]
    same = compare(load_runs(CompareConfig(tuple(map(str, files)))), threshold=3.0)
    assert mixed_devices(same.runs) is None and "**Warning:**" not in render_markdown(same)
    saved = json.loads(files[2].read_text())
    saved["meta"]["device_kind"] = "other GPU"
    files[2].write_text(json.dumps(saved))
    mixed = compare(load_runs(CompareConfig(tuple(map(str, files)))), threshold=3.0)
    assert "different devices (test GPU ×2, other GPU ×1)" in mixed_devices(mixed.runs)
    assert "**Warning:** the runs ran on different devices (test GPU ×2, other GPU ×1)" in render_markdown(mixed)
    completed = subprocess.run([sys.executable, "-m", "jaxrose.cli", "compare", *map(str, files), "--threshold", "3",
                                "--out", str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True)
    assert completed.returncode == 0 and "different devices" in completed.stderr


def exact_bootstrap(brax, system):
    """Every ordered resample of each system's runs, equally likely: the bootstrap's exact distribution of
    brax's median over the system's (misses +inf); returns the sorted defined ratios and the undefined share."""
    brax = [math.inf if s is None else s for s in brax]
    system = [math.inf if s is None else s for s in system]
    ratios = []
    for b in itertools.product(brax, repeat=len(brax)):
        for s in itertools.product(system, repeat=len(system)):
            b_median, s_median = sorted(b), sorted(s)
            b_median = (b_median[(len(b) - 1) // 2] + b_median[len(b) // 2]) / 2
            s_median = (s_median[(len(s) - 1) // 2] + s_median[len(s) // 2]) / 2
            ratios.append(None if math.isinf(b_median) and math.isinf(s_median) else b_median / s_median)
    defined = sorted(r for r in ratios if r is not None)
    return defined, 1 - len(defined) / len(ratios)


def inverted_cdf_quantile(sorted_values, q):
    """The smallest value whose cumulative share reaches q, and how far that share is from q at the
    nearest step (the margin a 10,000-resample estimate needs to land on the same value)."""
    n = len(sorted_values)
    index = math.ceil(q * n) - 1
    value = sorted_values[index]
    below = sum(v < value for v in sorted_values) / n
    at_or_below = sum(v <= value for v in sorted_values) / n
    return value, min(q - below, at_or_below - q)


@pytest.mark.parametrize("brax, system", [
    ([20.0, 24.0, 8.0], [12.0, 16.0, 10.0, 14.0]),  # all reached: a finite interval
    ([20.0, 24.0, 8.0], [12.0, 16.0, None]),  # a system's miss: its median can be the miss (ratio 0)
    ([10.0, 20.0, None], [5.0, None, 8.0]),  # misses in both: some resamples have no ratio
])
def test_bootstrap_interval_matches_the_exactly_enumerated_bootstrap(brax, system):
    result = median_time_ratio(brax, system)
    defined, undefined = exact_bootstrap(brax, system)
    for q, bound in ((0.025, result.low), (0.975, result.high)):
        value, margin = inverted_cdf_quantile(defined, q)
        assert margin > 0.008, "a quantile this near a step could differ by resampling (sd ~0.0016)"
        assert bound == pytest.approx(value)
    assert result.undefined_fraction == pytest.approx(undefined, abs=0.01)  # 10,000 resamples: sd ~0.0025
    assert median_time_ratio(brax, system) == result  # a fixed stream: the same runs, the same interval


def test_median_time_ratio_when_half_the_runs_missed():
    # Two of four brax runs missed: its median averages a miss, +inf, so brax counts slower (ratio +inf);
    # two of four of each: which is slower is unknown, no ratio and no interval.
    brax_missed = median_time_ratio([10.0, None, 12.0, None], [5.0, 6.0, 7.0, 8.0])
    assert math.isinf(brax_missed.brax_median_seconds) and math.isinf(brax_missed.ratio)
    system_missed = median_time_ratio([10.0, 11.0], [None, 4.0])
    assert system_missed.ratio == 0.0
    assert json.loads(json.dumps(to_json_median_time_ratio(brax_missed)))["brax_median_seconds"] == "not reached"
    assert json.loads(json.dumps(to_json_median_time_ratio(brax_missed)))["ratio"] == "inf"
    both = median_time_ratio([10.0, None], [None, 4.0])
    assert (both.ratio, both.low, both.high, both.undefined_fraction) == (None, None, None, None)


def test_interpolated_time_is_where_the_line_between_the_evaluations_either_side_meets_the_threshold(seed_files):
    comparison = compare(load_runs(CompareConfig(tuple(seed_files))), threshold=3.0)
    interpolated = {(label, name): t.interpolated_wall_seconds_to_threshold
                    for label, ts in comparison.times.items() for name, t in ts.items()}
    # (wall clock, return) points from three_seeds' docstring; the crossing lies between the last point below 3
    # and the first at or above it: s0 brax (10, 2) -> (20, 4): 10 + (3 - 2) / (4 - 2) * 10 = 15;
    # s0 async (4, 1) -> (12, 3): 12, on the evaluation (its 900 before training is the origin's return, above 3,
    # but a trained evaluation lies between); s0 sequential (12, 2.5) -> (18, 3.5): 15;
    # s1 async (6, 2) -> (16, 4): 11; s1 brax (12, 1) -> (24, 3.5): 12 + 2 / 2.5 * 12 = 21.6;
    # s2 brax: its first evaluation is above 3, so the origin, training's start at the return before it (0, 0),
    # is the point below: 0 + 3 / 3 * 8 = 8; s2 async never reaches 3.
    assert interpolated == pytest.approx({("s0", "async"): 12.0, ("s0", "brax"): 15.0, ("s0", "sequential"): 15.0,
                                          ("s1", "async"): 11.0, ("s1", "brax"): 21.6,
                                          ("s2", "async"): None, ("s2", "brax"): 8.0})
    ratios = comparison.interpolated_brax_ratios["async"]
    assert ratios.per_run == pytest.approx({"s0": 15 / 12, "s1": 21.6 / 11, "s2": None})
    assert ratios.median == pytest.approx((15 / 12 + 21.6 / 11) / 2)
    spread = comparison.systems["async"].interpolated_wall_seconds_to_threshold
    assert (spread.median, spread.min, spread.max, spread.count) == (11.5, 11.0, 12.0, 2)
    # The measured times are unchanged beside it.
    assert comparison.brax_ratios["async"].median == pytest.approx(19 / 12)


def test_interpolated_time_from_the_start_of_training_and_without_a_point_below():
    # s2's brax to 1.5: the origin (0, 0) -> (8, 3): 4. s0's async to 0.5: its origin is the 900 measured before
    # training, above 0.5, and its first trained evaluation (4, 1) already reached it: the measured 4, unchanged.
    seeds = three_seeds()
    assert interpolated_wall_seconds(seeds["s2"]["brax"], 1.5) == pytest.approx(4.0)
    assert interpolated_wall_seconds(seeds["s0"]["async"], 0.5) == pytest.approx(4.0)
    # An evaluation without its clock (results from before the bench stored timings): no estimate.
    untimed = dict(seeds["s0"]["brax"], eval_done_seconds=[])
    assert interpolated_wall_seconds(untimed, 3.0) is None


def test_default_threshold_is_the_highest_return_every_run_and_system_reached(seed_files):
    # Highest return after training per (run, system): s0 async 5 (its 900 is before training), brax 6,
    # sequential 3.5; s1 async 4.5, brax 5; s2 async 2.5, brax 7 -> the lowest of them, 2.5.
    comparison = compare(load_runs(CompareConfig(tuple(seed_files))))
    assert (comparison.threshold, comparison.stated) == (2.5, False)
    walls = {(label, name): t.wall_seconds_to_threshold for label, ts in comparison.times.items()
             for name, t in ts.items()}
    # s0 async 3 at 200 -> 12; brax 4 at 200 -> 20; sequential 2.5 at 200 -> 12; s1 async 4 at 200 -> 16, brax 3.5
    # at 200 -> 24; s2 async 2.5 at 300 -> 16, brax 3 at 100 -> 8. Every one reached it.
    assert walls == {("s0", "async"): 12.0, ("s0", "brax"): 20.0, ("s0", "sequential"): 12.0,
                     ("s1", "async"): 16.0, ("s1", "brax"): 24.0, ("s2", "async"): 16.0, ("s2", "brax"): 8.0}
    assert comparison.systems["async"].reached == 3
    assert comparison.systems["async"].wall_seconds_to_threshold.median == 16.0  # of 12, 16, 16


def test_plotted_curve_is_on_the_clock_of_the_times_to_threshold():
    # s0's async: the evaluations after training, at done - 8 (the one before training is left out).
    assert wall_clock_curve(three_seeds()["s0"]["async"]) == [(4.0, 1.0), (12.0, 3.0), (20.0, 5.0)]


def test_command_line_writes_report_plot_and_json(seed_files, tmp_path):
    out = tmp_path / "out"
    completed = subprocess.run([sys.executable, "-m", "jaxrose.cli", "compare", *seed_files, "--threshold", "3",
                                "--labels", "a,b,c", "--out", str(out)], cwd=REPO, capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    saved = json.loads((out / "compare.json").read_text())
    assert [run["label"] for run in saved["runs"]] == ["a", "b", "c"]
    assert saved["runs"][2]["systems"]["async"]["wall_seconds_to_threshold"] is None
    assert saved["systems"]["async"]["wall_seconds_to_threshold"] == {"median": 14.0, "min": 12.0, "max": 16.0,
                                                                      "count": 2}
    assert saved["brax_ratios"]["async"]["median"] == pytest.approx(19 / 12)
    assert saved["interpolated_brax_ratios"]["async"]["median"] == pytest.approx((15 / 12 + 21.6 / 11) / 2)
    assert saved["runs"][0]["systems"]["brax"]["interpolated_wall_seconds_to_threshold"] == pytest.approx(15.0)
    # brax 20, 24, 8 over async 12, 16, a miss: 20 / 16; the interval's ends from the enumerated bootstrap (a
    # resampled async median is a miss in 7 of 27 draws, ratio 0, and brax's 24 over async's 12 is the top, 2).
    unpaired = saved["median_time_ratios"]["async"]
    assert (unpaired["ratio"], unpaired["low"], unpaired["high"]) == (1.25, 0.0, 2.0)
    markdown = (out / "compare.md").read_text()
    assert "| c | jaxrose asynchronous (actors, lag <= run.max_policy_lag) | not reached | not reached |" in markdown
    assert "| 2 of 3 | 14.0 (12.0–16.0) | 11.5 (11.0–12.0) |" in markdown
    assert "| a | jaxrose asynchronous (actors, lag <= run.max_policy_lag) | 200 | 12.0 | 12.0 |" in markdown
    assert "| jaxrose asynchronous (actors, lag <= run.max_policy_lag), interpolated | 1.250 | 1.964 | — | 1.607 |" \
        in markdown
    assert "| jaxrose asynchronous (actors, lag <= run.max_policy_lag) | 3 / 3 | 20.0 | 16.0 | 1.250 | 0.000–2.000 " \
        "| 0.0% |" in markdown
    assert "| test GPU | abc | 0123456789abcdef | 2026-01-01T00:00:00Z |" in markdown  # which code ran, where
    assert markdown in completed.stdout
    assert (out / "compare.png").stat().st_size > 10_000


@pytest.mark.parametrize("name, text, message", [
    ("nowhere/results.json", None, "no such file. Give the results.json a `jaxrose bench` run wrote"),
    ("cut.json", '{"systems": {', "is not valid JSON"),  # e.g. a copy cut short
    ("lag-study.json", '{"runs": []}', "has no `systems`: it is not a `jaxrose bench` results file"),
])
def test_unreadable_results_name_the_file_and_the_fix(name, text, message, tmp_path, capsys):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["compare", str(path), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert str(path) in error and message in error


def test_labels_must_be_one_per_run_and_distinct(seed_files, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli_main(["compare", *seed_files[:2], "--labels", "only-one"])
    assert "--labels gives 1 label(s) for 2 results file(s); give one per file" in capsys.readouterr().err
    # Two results files in folders of the same name would share a default label.
    twin = write_results(tmp_path / "elsewhere" / "s0", three_seeds()["s0"])
    with pytest.raises(ConfigError, match="share the label 's0'.*--labels"):
        CompareConfig((seed_files[0], str(twin)))


def test_a_stored_run_gives_bench_time_to_threshold_and_benchmarks_md():
    """docs/bench/ant-mlp-h200-50M-vtrace-8epochs-lag-target-s34: BENCHMARKS.md session 34 gives 49.9 s
    (async) and 63.2 s (brax) to the stated 3000, a 1.267x speedup."""
    from jaxrose.bench import time_to_threshold

    path = REPO / "docs/bench/ant-mlp-h200-50M-vtrace-8epochs-lag-target-s34/results.json"
    comparison = compare(load_runs(CompareConfig((str(path),))), threshold=3000.0)
    times = comparison.times[path.parent.name]
    reference = copy.deepcopy(json.loads(path.read_text())["systems"])
    time_to_threshold(reference, 3000.0)
    for name, seconds in (("async", 49.9), ("brax", 63.2)):
        assert times[name].steps_to_threshold == reference[name]["steps_to_threshold"]
        assert times[name].wall_seconds_to_threshold == reference[name]["wall_seconds_to_threshold"]
        assert round(times[name].wall_seconds_to_threshold, 1) == seconds
    assert round(comparison.brax_ratios["async"].median, 3) == 1.267
