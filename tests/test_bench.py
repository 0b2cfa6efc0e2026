"""`jaxrose bench` end to end on a tiny workload: every number present, positive where it must be,
every ratio the quotient of the stored measurements, and the three output files written."""

import json
import math
import os

import pytest

from jaxrose.bench import RATIOS, BenchConfig, async_steady_start, first_steady_step, lookup, main, parse_args
from jaxrose.config import ConfigError
from jaxrose.presets import get_preset

BENCH_ARGS = ["--preset", "point-mass", "--total-env-steps", "20480", "--num-evals", "3", "--num-eval-envs", "16",
              "--repeats", "3", "--systems", "brax,sim,sequential,overlapped,spread,tuned,async",
              "--tune-iterations", "1", "--tune-groups", "false",  # tune's group trials are tested in test_tune.py
              # No planner candidate (the overlap on a helper process, tested in test_tune.py and by the saved
              # plan below): tune still measures the baseline and its rollout-loop unrolling.
              "--tune-max-candidates", "0",
              # The async system runs its resource manager among these levels (one actor, lag <= 3): one run
              # checks both the async summary and the manager's decisions.
              "--async-group-levels", "1,2"]
TRAIN_ARGS = ["--run.actors", "1", "--run.max-policy-lag", "3", "--run.resources.interval", "0.3",
              "--run.resources.patience", "1"]
ARGS = BENCH_ARGS + ["--", *TRAIN_ARGS]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    record = out / "BENCHMARKS.md"
    record.write_text("# Benchmarks\n")
    main(BENCH_ARGS + ["--out", str(out), "--record", str(record), "--", *TRAIN_ARGS])
    return out, json.loads((out / "results.json").read_text()), record


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_meta_records_where_and_how(bench_run):
    _, results, _ = bench_run
    meta = results["meta"]
    for key in ("date_utc", "command", "device_kind", "jax_version", "brax_version", "git_commit"):
        assert key in meta
    from jaxrose.provenance import source_digest
    assert meta["source_digest"] == source_digest()  # the code that ran (no source file changes during the tests)
    assert meta["command"].startswith("jaxrose bench --preset point-mass --total-env-steps 20480")
    assert meta["device_kind"]
    if not meta["sm_sampling"]["available"]:  # CPU machines: the reason is recorded instead
        assert meta["sm_sampling"]["reason"]


def test_every_system_ran_with_positive_throughput(bench_run):
    _, results, _ = bench_run
    systems = results["systems"]
    assert set(systems) == {"brax", "sim", "sequential", "overlapped", "spread", "tuned", "async"}
    for name, summary in systems.items():
        assert summary["status"] == "ok", (name, summary.get("reason"))
        assert _positive(summary["steady_sps"]), name
        assert math.isfinite(summary["compile_seconds"]), name
        if not results["meta"]["sm_sampling"]["available"]:  # no GPU here
            assert summary["sm"] is None, name
    for name in ("brax", "sequential", "overlapped", "spread", "tuned"):
        summary = systems[name]
        assert _positive(summary["steady_sps_with_evals"])
        assert _positive(summary["steady_wall_seconds"])
        assert math.isfinite(summary["final_return"])
        assert all(_positive(s) for s in summary["eval_seconds"])
    assert all(_positive(s) for s in systems["brax"]["epoch_sps"])
    assert all(_positive(s) for s in systems["sequential"]["iteration_sps"])
    assert all(_positive(s) for s in systems["sim"]["call_sps"])


def test_systems_share_one_evaluation_schedule(bench_run):
    _, results, _ = bench_run
    brax, sequential = results["systems"]["brax"], results["systems"]["sequential"]
    assert brax["eval_env_steps"] == sequential["eval_env_steps"]
    assert len(brax["eval_env_steps"]) == 3
    assert brax["steady_env_steps"] == sequential["steady_env_steps"] > 0
    overlapped = results["systems"]["overlapped"]
    assert overlapped["eval_env_steps"] == sequential["eval_env_steps"]


def test_async_system_reports_its_rates_and_lags(bench_run):
    out, results, _ = bench_run
    summary = results["systems"]["async"]
    assert summary["eval_env_steps"] == results["systems"]["sequential"]["eval_env_steps"]
    assert _positive(summary["whole_run_rollout_sps"]) and _positive(summary["whole_run_updates_per_second"])
    # The steady updates end before the final evaluation's result: the rate without that wait is higher.
    assert 0 < summary["steady_update_seconds"] <= summary["steady_wall_seconds"]
    assert summary["steady_sps"] == pytest.approx(summary["steady_env_steps"] / summary["steady_update_seconds"])
    assert summary["steady_sps"] >= summary["steady_sps_with_evals"]
    assert max(summary["policy_lags"]) <= results["config"]["run"]["max_policy_lag"]
    # Where the steady time goes: every consumed trajectory has its actor's time, every update the learner's.
    rollouts = summary["actor_rollout_seconds"]
    assert sorted(map(int, rollouts)) == sorted(map(int, summary["rollouts_per_actor"]))
    assert all(len(rollouts[i]) >= summary["rollouts_per_actor"][i] for i in summary["rollouts_per_actor"])
    assert len(summary["learner_busy_seconds"]) == len(summary["learner_wait_seconds"]) == len(summary["update_seconds"])
    assert all(_positive(t) for t in summary["learner_busy_seconds"])
    assert summary["median_steady_learner_busy_seconds"] > 0
    assert summary["learner_step_updates"] == list(range(1, len(summary["update_seconds"]) + 1))  # 1 update a step
    # The steady env steps are each update's own: the total less what the updates before the window consumed.
    steps, first = summary["update_env_steps"], summary["first_steady_update"]
    assert len(steps) == len(summary["update_seconds"]) and steps == sorted(steps)
    assert summary["steady_env_steps"] == steps[-1] - (steps[first - 1] if first else 0)
    report = (out / "results.md").read_text()
    assert f"learner busy {summary['median_steady_learner_busy_seconds']:.3f} s" in report


def test_the_async_steady_window_counts_each_updates_own_env_steps():
    """Batches grown 1 -> 2 -> 4 groups (the s-30M run in BENCHMARKS.md: 10, 30 and 7 updates; a first
    evaluation period of 19 group rollouts). An average over updates put the window at update 10 and
    subtracted 10 average updates (6.83M steps instead of 3.28M); the window starts at update 15, the
    first with 19 group rollouts (here 20) consumed before it."""
    group = 327_680
    sizes = [1] * 10 + [2] * 30 + [4] * 7
    cumulative = [sum(sizes[:k + 1]) * group for k in range(len(sizes))]
    first, before = async_steady_start(cumulative, list(range(1, 48)), 19 * group)
    assert (first, before) == (15, 20 * group) and cumulative[-1] - before == 25_559_040
    # Two updates a learner step: the window opens with a step, never between its two updates.
    two_a_step = [2 * k for k in range(1, 21)]
    assert async_steady_start([k * group for k in range(1, 41)], two_a_step, 19 * group) == (20, 20 * group)
    assert async_steady_start([group, 2 * group], [1, 2], 5 * group) == (1, group)  # none steady: the last step


def test_the_first_steady_learner_step_when_steps_hold_several_updates():
    # grow_keeps='update_size' at 2 groups: 2 updates a step; steps start at updates 0, 2, 4, 6
    assert first_steady_step([2, 4, 6, 8], 4) == 2  # the step holding updates 4 and 5
    assert first_steady_step([2, 4, 6, 8], 3) == 2  # step 1 began before the window (updates 2 and 3)
    assert first_steady_step([1, 2, 3, 4], 2) == 2  # one update a step: the update index itself
    assert first_steady_step([2, 4], 9) == 2 and first_steady_step([], 0) == 0  # none steady


def test_overlapped_evaluation_keeps_the_same_results(bench_run):
    """Evaluation in another process changes when it runs, not what it computes."""
    _, results, _ = bench_run
    sequential, overlapped = results["systems"]["sequential"], results["systems"]["overlapped"]
    assert overlapped["eval_returns"] == sequential["eval_returns"]
    assert overlapped["eval_worker"]["platform"] == "cpu"


def test_spread_groups_keep_the_same_results(bench_run):
    """Rollout groups in two processes: the same policies, so the same evaluation returns."""
    _, results, _ = bench_run
    sequential, spread = results["systems"]["sequential"], results["systems"]["spread"]
    assert spread["eval_returns"] == sequential["eval_returns"]
    assert "group0+group1 (groups spread)" in spread["plan"]


def test_tuned_system_reports_its_tuning_and_keeps_the_same_results(bench_run):
    _, results, _ = bench_run
    sequential, tuned = results["systems"]["sequential"], results["systems"]["tuned"]
    tuning = tuned["tuning"]
    assert tuning["tuning_seconds"] > 0 and tuning["iterations_per_measurement"] == 1
    assert tuning["switches"]["groups"] is False and tuning["switches"]["overlap"] is True
    assert tuning["candidates_tried"] == len(tuning["trials"]) >= tuning["candidates_kept"]
    assert all({"description", "kept", "reason"} <= set(t) for t in tuning["trials"])
    # --tune-max-candidates 0 reached tune: no planner candidate was tried, only the rollout-loop unrolling.
    assert tuning["max_candidates"] == 0 and tuning["evaluation_placement_tried"] is True  # the default
    assert [t["description"] for t in tuning["trials"] if t["measured_seconds"] is not None] == \
        ["unroll loop rollout_step", "evaluation in its own process"]
    # The system trained with the evaluation where tune left it: in a worker exactly when that trial was kept.
    evaluation_kept = tuning["trials"][-1]["kept"]
    assert bool(tuned["eval_worker"]) == evaluation_kept
    # Its gain is reported with evaluations included (the per-iteration speedup leaves evaluations out):
    # the placed seconds are that trial's measurement when kept, the inline seconds when not.
    placed, inline = tuning["placed_evaluation_seconds"], tuning["inline_evaluation_seconds"]
    assert placed == (tuning["trials"][-1]["measured_seconds"] if evaluation_kept else inline)
    assert tuning["speedup_with_evaluations"] == pytest.approx(inline / placed)
    assert tuning["speedup_per_iteration"] == pytest.approx(tuning["baseline_seconds"] / tuning["final_seconds"])
    # The record says it too (#7: tuning time, candidates tried and kept).
    markdown = (bench_run[0] / "results.md").read_text()
    assert (f"tuning took {tuning['tuning_seconds']:.1f} s, {tuning['candidates_tried']} candidates tried, "
            f"{tuning['candidates_kept']} kept") in markdown
    assert f"as placed ({tuning['speedup_with_evaluations']:.3f}x)" in markdown
    assert ("evaluation: in its own process" in tuned["plan"]) == evaluation_kept
    assert tuned["plan"]
    # Whatever plan tune kept computes what the sequential executor computes.
    assert tuned["eval_returns"] == sequential["eval_returns"]


def test_tuned_system_trains_with_a_saved_plan_without_tuning(bench_run, tmp_path):
    """`--tuned-plan`: the H200 ablation's kept plan shape (reduce_metrics deferred on a quota'd helper),
    run as the tuned system with nothing tuned in the run, computes what the sequential run computes."""
    from jaxrose.bench import _ClockOnlySampler, run_tuned, train_config
    from jaxrose.graph import build_graph
    from jaxrose.plan import sequential_plan, with_quota
    from jaxrose.planner import _overlap_tail
    from jaxrose.ppo_program import ITERATION_INPUTS
    from jaxrose.sequential import SequentialExecutor

    _, results, _ = bench_run
    config = train_config(parse_args(ARGS))
    program = SequentialExecutor(config).program
    plan = _overlap_tail(sequential_plan(program), program, build_graph(program, ITERATION_INPUTS), "reduce_metrics")
    path = tmp_path / "plan.json"
    with_quota(plan, "helper", 25).save(str(path))
    summary = run_tuned(config, _ClockOnlySampler(), 1, False, str(path))
    assert summary["tuning"]["plan_file"] == str(path) and summary["tuning"]["tuning_seconds"] is None
    from jaxrose.bench_report import _tuning_lines

    assert _tuning_lines({"systems": {"tuned": {**summary, "status": "ok"}}}) == [
        f"- jaxrose tuned (jaxrose tune's plan, evaluation where it put it): trained with the saved plan {path} "
        f"({'; '.join(summary['tuning']['history'])}); nothing tuned in this run"]
    assert "reduce_metrics" in summary["plan"] and "deferred" in summary["plan"]
    assert summary["eval_returns"] == results["systems"]["sequential"]["eval_returns"]


def test_async_system_with_group_levels_runs_its_resource_manager_within_them(bench_run):
    """`--async-group-levels`: the async system alone gets the manager, free to move batch sizes
    among the levels; every batch change it logs stays within them."""
    from jaxrose.bench import train_config

    bench = parse_args(ARGS)
    assert bench.async_group_levels == (1, 2)
    config = train_config(bench)
    assert config.run.resources.manager == "off"  # the other systems run without it
    _, results, _ = bench_run
    assert results["config"]["run"]["resources"]["manager"] == "off"
    summary = results["systems"]["async"]
    assert summary["status"] == "ok" and summary["resource_manager"] == "on"
    decisions = summary["resource_decisions"]
    assert decisions and decisions[0]["kind"] == "initial", decisions
    assert {d["kind"] for d in decisions} <= {"initial", "sm_quota", "restart", "cores", "groups", "resize"}, decisions
    assert all(d["after"] in (1, 2) for d in decisions if d["kind"] in ("groups", "resize")), decisions


def test_tune_max_candidates_defaults_to_tunes_limit_and_must_not_be_negative():
    import inspect

    from jaxrose.tune import tune

    assert parse_args([]).tune_max_candidates == inspect.signature(tune).parameters["max_candidates"].default == 4
    assert parse_args(["--tune-max-candidates", "2"]).tune_max_candidates == 2
    with pytest.raises(ConfigError, match="--tune-max-candidates must be >= 0, got -1"):
        parse_args(["--tune-max-candidates", "-1"])


def test_tune_evaluation_placement_is_on_by_default_and_can_be_switched_off():
    assert parse_args([]).tune_evaluation_placement is True
    assert parse_args(["--tune-evaluation-placement", "false"]).tune_evaluation_placement is False


def test_tuned_plan_must_be_a_file():
    with pytest.raises(ConfigError, match="--tuned-plan 'missing.json' is not a file"):
        parse_args(["--tuned-plan", "missing.json"])


def test_limits_follow_from_the_measured_times(bench_run):
    _, results, _ = bench_run
    limits, sim = results["limits"], results["systems"]["sim"]
    assert limits["rollout_ceiling_sps"] == sim["steady_sps"]
    expected = limits["env_steps_per_iteration"] / (limits["rollout_seconds_at_ceiling"]
                                                    + limits["training_seconds_alone"])
    assert limits["synchronous_limit_sps"] == pytest.approx(expected, rel=1e-12)
    assert limits["synchronous_limit_sps"] < limits["rollout_ceiling_sps"]
    moving = sim["random_actions"]  # the same ceiling measured again with the solver working
    assert moving["actions"].startswith("uniform random") and moving["scan_length"] == sim["scan_length"]
    assert limits["rollout_ceiling_random_actions_sps"] == moving["steady_sps"]
    assert limits["synchronous_limit_random_actions_sps"] == pytest.approx(
        limits["env_steps_per_iteration"] / (moving["median_call_seconds"] + limits["training_seconds_alone"]),
        rel=1e-12)


def test_each_ratio_is_the_quotient_of_stored_values(bench_run):
    _, results, _ = bench_run
    ratios = {r["name"]: r for r in results["ratios"]}
    # The highest-common-return ratio exists only where a stated threshold was missed (tested below).
    assert set(ratios) == {name for name, _, _ in RATIOS if not name.startswith("time to the highest common return")}
    for ratio in ratios.values():
        numerator, denominator = lookup(results, ratio["numerator"]), lookup(results, ratio["denominator"])
        assert _positive(numerator) and _positive(denominator)
        assert ratio["value"] == pytest.approx(numerator / denominator, rel=1e-12)


def _side_names(path: str) -> str:
    """What a ratio's name calls the quantity at `path`, written from the results' layout."""
    parts = path.split(".")
    if parts[0] == "limits":
        return "rollout ceiling" if parts[1].startswith("rollout_ceiling") else "synchronous limit"
    return "brax" if parts[1] == "brax" else f"jaxrose {parts[1]}"


@pytest.mark.parametrize("name, numerator, denominator", RATIOS, ids=[r[0][:60] for r in RATIOS])
def test_each_ratio_is_named_after_what_it_divides(name, numerator, denominator):
    """The name says which quantity is over which: a swapped or mislabelled entry of RATIOS fails here
    (the quotient test above reads the paths from the same entry, so it could not)."""
    quotient = name.split(": ", 1)[-1] if name.startswith(("time to", "rollout ceiling:")) else name
    left, right = quotient.split(" / ", 1)
    if name.startswith("rollout ceiling:"):  # "random / zero actions": both sides the ceiling
        assert "random_actions" in numerator and "random_actions" not in denominator
        return
    assert _side_names(numerator) in left and _side_names(denominator) in right, (left, right)
    if "with_evals" in numerator or "with_evals" in denominator:
        assert "incl. evals" in name
    elif "incl. evals" in name:
        pytest.fail(f"{name!r} says 'incl. evals' but divides {numerator} by {denominator}")
    if "random_actions" in denominator:
        assert "random actions" in right
    if "threshold" in numerator:
        assert "time to" in name and "speedup" in name  # times: the slower one's over the faster one's


@pytest.mark.parametrize("same_envs", [True, False])
def test_an_async_system_at_other_env_counts_is_not_divided_by_the_ceiling(same_envs):
    from jaxrose.bench import compute_ratios

    results = {"systems": {"async": {"steady_sps_with_evals": 2.0, "envs_as_ceiling": same_envs},
                           "brax": {"steady_sps_with_evals": 1.0}},
               "limits": {"rollout_ceiling_sps": 4.0}}
    ratios = {r["name"]: r["value"] for r in compute_ratios(results)}
    assert ratios["jaxrose async / brax (incl. evals)"] == 2.0
    assert ratios.get("jaxrose async / rollout ceiling (incl. evals)") == (0.5 if same_envs else None)


def test_markdown_plot_and_record_are_written(bench_run):
    out, results, record = bench_run
    markdown = (out / "results.md").read_text()
    for text in ("brax PPO", "simulation only (ceiling)", "jaxrose sequential", "synchronous limit",
                 "jaxrose sequential / brax (steady)", results["meta"]["command"]):
        assert text in markdown
    assert (out / "results.png").stat().st_size > 10_000
    logged = record.read_text()
    assert logged.startswith("# Benchmarks\n") and results["meta"]["command"] in logged


def test_parse_args_defaults_and_lists():
    bench = parse_args(["--systems", "sim, sequential"])
    assert bench.systems == ("sim", "sequential")
    assert bench.preset == "ant-mlp" and bench.out_dir.endswith("ant-mlp")
    assert parse_args([]).systems == ("brax", "sim", "sequential", "overlapped", "spread", "async")


def test_time_to_threshold_is_the_first_evaluation_at_or_above_it_at_the_steady_rate(bench_run):
    _, results, _ = bench_run
    curves = {n: s for n, s in results["systems"].items() if s.get("eval_returns")}
    assert set(curves) == {"brax", "sequential", "overlapped", "spread", "tuned", "async"}
    threshold = results["threshold"]
    assert threshold == {"return": min(max(s["eval_returns"][1:]) for s in curves.values()), "stated": False}
    for name, s in curves.items():  # every system reached the default threshold after training began
        first = next(i for i, r in enumerate(s["eval_returns"]) if i > 0 and r >= threshold["return"])
        assert s["steps_to_threshold"] == s["eval_env_steps"][first], name
        assert s["seconds_to_threshold"] == pytest.approx(s["eval_env_steps"][first] / s["steady_sps_with_evals"])
    assert "Time to an evaluation return of" in (bench_run[0] / "results.md").read_text()


def test_a_stated_threshold_not_reached_has_no_time():
    from jaxrose.bench import time_to_threshold

    systems = {"brax": {"status": "ok", "eval_returns": [-5.0, 1.0, 3.0], "eval_env_steps": [0, 100, 200],
                        "steady_sps_with_evals": 50.0},
               # the evaluation before training does not count, however high
               "async": {"status": "ok", "eval_returns": [9.0, 2.5, 2.0], "eval_env_steps": [0, 100, 200],
                         "steady_sps_with_evals": 100.0},
               "sim": {"status": "ok", "steady_sps": 1e6}}
    assert time_to_threshold(systems) == {"return": 2.5, "stated": False}
    assert (systems["brax"]["steps_to_threshold"], systems["brax"]["seconds_to_threshold"]) == (200, 4.0)
    assert (systems["async"]["steps_to_threshold"], systems["async"]["seconds_to_threshold"]) == (100, 1.0)
    assert "steps_to_threshold" not in systems["sim"]
    assert time_to_threshold(systems, 3.0) == {"return": 3.0, "stated": True, "common_return": 2.5}
    assert systems["async"]["steps_to_threshold"] is None and systems["async"]["seconds_to_threshold"] is None
    # ... so the times to the highest return both reached come beside it, as without a stated one.
    assert systems["brax"]["common_threshold_times"] == {"steps": 200, "seconds": 4.0, "wall_seconds": None,
                                                         "interpolated_wall_seconds": None}  # no clock stored
    assert systems["async"]["common_threshold_times"] == {"steps": 100, "seconds": 1.0, "wall_seconds": None,
                                                          "interpolated_wall_seconds": None}
    assert time_to_threshold(systems, 1.0) == {"return": 1.0, "stated": True}  # both reached it: nothing more
    assert "common_threshold_times" not in systems["async"]


def test_the_report_and_ratios_fall_back_to_the_highest_common_return_when_one_misses_the_stated_one():
    """On the H200 run of 2026-12-04 (docs/bench/ant-mlp-h200-50M-async-start4): async's last evaluation
    returned 2935, short of the stated 3000 brax reached at 40.6M steps; both reached 2935 (brax at
    its 40.6M-step evaluation, async at 50.8M)."""
    import json
    from pathlib import Path
    from jaxrose.bench import compute_ratios, time_to_threshold
    from jaxrose.bench_report import render_markdown

    path = Path(__file__).parent.parent / "docs/bench/ant-mlp-h200-50M-async-start4/results.json"
    results = json.loads(path.read_text())
    systems = results["systems"]
    results["threshold"] = time_to_threshold(systems, 3000.0)
    results["ratios"] = compute_ratios(results)
    assert results["threshold"]["common_return"] == pytest.approx(max(systems["async"]["eval_returns"]))
    assert systems["async"]["steps_to_threshold"] is None and systems["brax"]["steps_to_threshold"] == 40632320
    assert systems["async"]["common_threshold_times"]["steps"] == 50790400
    assert systems["brax"]["common_threshold_times"]["steps"] == 40632320
    ratio = next(r for r in results["ratios"] if r["name"].startswith("time to the highest common return"))
    assert ratio["value"] == pytest.approx(systems["brax"]["common_threshold_times"]["wall_seconds"]
                                           / systems["async"]["common_threshold_times"]["wall_seconds"])
    assert 1.5 < ratio["value"] < 1.7  # 70.1 s against 44.1 s
    assert not any(r["name"].startswith("time to return threshold, measured") for r in results["ratios"])
    assert "to 2935, the highest return every system reached" in render_markdown(results)


def clocked_brax() -> dict:
    """brax evaluates before training (done at 10 s); its first epoch compiled for 4 s: the wall clock to an
    evaluation is done - 14."""
    return {"status": "ok", "eval_returns": [0.0, 1.0, 3.0], "eval_env_steps": [0, 100, 200],
            "eval_done_seconds": [10.0, 20.0, 29.0], "epoch_seconds": [6.0, 2.0, 2.0], "compile_seconds": 4.0,
            "steady_sps_with_evals": 50.0}


def clocked_jaxrose() -> dict:
    """Training starts with update 0 at 5 s, which took 3 s beyond the median 1 s: the wall clock to an
    evaluation is done - 8; a 7 s stall mid-run (a recompile) counts."""
    return {"status": "ok", "eval_returns": [0.0, 2.0, 3.5], "eval_env_steps": [0, 100, 200],
            "eval_done_seconds": [6.0, 12.0, 25.0], "update_start_seconds": [5.0, 9.0, 10.0, 18.0],
            "update_seconds": [4.0, 1.0, 8.0, 1.0], "steady_sps_with_evals": 100.0}


def test_measured_wall_time_to_threshold_starts_with_training_and_leaves_out_the_start_up_compile():
    from jaxrose.bench import time_to_threshold

    brax, jaxrose = clocked_brax(), clocked_jaxrose()
    systems = {"brax": brax, "async": jaxrose}
    time_to_threshold(systems, 3.0)
    assert brax["wall_seconds_to_threshold"] == pytest.approx(29.0 - 10.0 - 4.0)
    assert jaxrose["wall_seconds_to_threshold"] == pytest.approx(25.0 - 5.0 - (4.0 - 1.0))
    # The async learner's steps (busy + waiting), which may hold several updates each, time its start-up.
    jaxrose.update({"learner_busy_seconds": [2.0, 0.5, 0.5, 0.5], "learner_wait_seconds": [3.0, 0.5, 0.5, 0.5]})
    time_to_threshold(systems, 3.0)
    assert jaxrose["wall_seconds_to_threshold"] == pytest.approx(25.0 - 5.0 - (5.0 - 1.0))
    time_to_threshold(systems, 9.0)  # not reached: no time
    assert brax["wall_seconds_to_threshold"] is None and jaxrose["wall_seconds_to_threshold"] is None
    assert brax["interpolated_wall_seconds_to_threshold"] is None


def test_interpolated_wall_time_to_threshold_lies_between_the_evaluations_either_side():
    from jaxrose.bench import compute_ratios, time_to_threshold
    from jaxrose.bench_report import render_markdown

    # brax's evaluations after training at 20 - 14 = 6 s (return 1) and 29 - 14 = 15 s (3); jaxrose's at
    # 12 - 8 = 4 s (2) and 25 - 8 = 17 s (3.5); both returned 0 before training.
    brax, jaxrose = clocked_brax(), clocked_jaxrose()
    results = {"systems": {"brax": brax, "async": jaxrose}}
    results["threshold"] = time_to_threshold(results["systems"], 2.0)
    # brax (6, 1) -> (15, 3): 6 + (2 - 1) / (3 - 1) * 9 = 10.5, measured 15; jaxrose reaches 2 at its first
    # trained evaluation, so the line runs from training's start (0, 0) to (4, 2): 4, the measured time.
    assert brax["interpolated_wall_seconds_to_threshold"] == pytest.approx(10.5)
    assert brax["wall_seconds_to_threshold"] == pytest.approx(15.0)
    assert jaxrose["interpolated_wall_seconds_to_threshold"] == pytest.approx(4.0)
    time_to_threshold(results["systems"], 3.0)  # jaxrose (4, 2) -> (17, 3.5): 4 + 1 / 1.5 * 13
    assert jaxrose["interpolated_wall_seconds_to_threshold"] == pytest.approx(4.0 + 13.0 / 1.5)
    results["threshold"] = time_to_threshold(results["systems"], 2.0)
    results["ratios"] = compute_ratios(results)
    ratios = {r["name"]: r["value"] for r in results["ratios"]}
    assert ratios["time to return threshold, measured wall clock: brax / jaxrose async (speedup)"] == \
        pytest.approx(15.0 / 4.0)
    assert ratios["time to return threshold, wall clock interpolated between evaluations (an estimate): brax / "
                  "jaxrose async (speedup)"] == pytest.approx(10.5 / 4.0)
    # The report's threshold table, on a stored H200 run (session 38, seed 1): brax's evaluations after
    # training returned 2665 at 51.2 s and 3154 at 64.3 s on the measured clock, so 3000 by the line is
    # 51.2 + (3000 - 2665) / (3154 - 2665) * 13.2 = 60.2 s, against the measured 64.3.
    import json
    from pathlib import Path

    stored = json.loads((Path(__file__).parent.parent
                         / "docs/bench/ant-mlp-h200-50M-vtrace-budget1.6-seed1-fixed-s38/results.json").read_text())
    stored["threshold"] = time_to_threshold(stored["systems"], 3000.0)
    stored_brax = stored["systems"]["brax"]
    measured = stored_brax["wall_seconds_to_threshold"]
    assert [x for point in brax_row_times(stored_brax) for x in point] == pytest.approx([51.2, 2665, 64.3, 3154],
                                                                                     abs=0.5)
    (t0, r0), (t1, r1) = brax_row_times(stored_brax)
    assert stored_brax["interpolated_wall_seconds_to_threshold"] == pytest.approx(
        t0 + (3000 - r0) / (r1 - r0) * (t1 - t0))
    assert measured == pytest.approx(t1)
    row = f"| brax PPO | 40,632,320 | {stored_brax['seconds_to_threshold']:.1f} | {measured:.1f} | " \
          f"{stored_brax['interpolated_wall_seconds_to_threshold']:.1f} |"
    assert row in render_markdown(stored)


def brax_row_times(brax: dict) -> list[tuple[float, float]]:
    """brax's (measured wall clock, return) at its evaluations at 30.5M and 40.6M env steps, by the rule
    of `clocked_brax`: the end of the evaluation less the end of the one before training, less the compile."""
    done = dict(zip(brax["eval_env_steps"], brax["eval_done_seconds"]))
    returns = dict(zip(brax["eval_env_steps"], brax["eval_returns"]))
    start = brax["eval_done_seconds"][0] + brax["compile_seconds"]
    return [(done[steps] - start, returns[steps]) for steps in (30474240, 40632320)]


def test_train_settings_after_the_separator_apply_to_every_system():
    from jaxrose.bench import _bench_args, train_config

    bench = parse_args(["--preset", "point-mass", "--num-evals", "4", "--", "--run.actors", "1",
                        "--env.num-envs", "128", "--network.policy-hidden", "16", "16"])
    assert bench.train_args == ("--run.actors", "1", "--env.num-envs", "128", "--network.policy-hidden", "16", "16")
    config = train_config(bench)
    assert (config.run.actors, config.env.num_envs, config.network.policy_hidden) == (1, 128, (16, 16))
    assert config.run.num_evals == 4 and config.ppo == get_preset("point-mass").ppo  # the rest is the preset's
    assert _bench_args(bench).endswith("-- --run.actors 1 --env.num-envs 128 --network.policy-hidden 16 16")
    with pytest.raises(SystemExit):  # an unknown train setting is tyro's usage error, naming it
        train_config(parse_args(["--preset", "point-mass", "--", "--run.no-such-setting", "1"]))


@pytest.mark.parametrize("changes, message", [
    ({"systems": ("brax", "rllib")}, "--systems must be"),
    ({"num_evals": 2}, "--num-evals must be >= 3"),
    ({"repeats": 0}, "--repeats must be >= 1"),
])
def test_bad_settings_name_the_flag(changes, message):
    with pytest.raises(ConfigError, match=message):
        BenchConfig(**changes)


def test_brax_is_skipped_for_policies_it_does_not_have():
    from jaxrose import get_preset
    from jaxrose.bench_brax import run_brax

    result = run_brax(get_preset("point-mass-transformer"), sampler=None)
    assert result["status"] == "skipped" and "transformer" in result["reason"]


def test_brax_baseline_steps_the_same_randomized_env_as_jaxrose():
    from envs.wrappers import DomainRandomization
    from jaxrose.bench_brax import brax_kwargs, make_brax_env
    from jaxrose.presets import get_preset

    config = get_preset("arm-push-randomized-mlp")
    env = make_brax_env(config)
    assert isinstance(env, DomainRandomization)  # not the bare task: brax must see the same workload
    assert brax_kwargs(config)[1] == []  # and the mapping has nothing inexact to report


def test_settings_brax_cannot_follow_are_noted():
    from jaxrose.bench_brax import brax_kwargs
    from jaxrose.config import replace
    from jaxrose.presets import get_preset

    config = replace(get_preset("ant-mlp"), **{"network.compute_dtype": "bfloat16", "ppo.minibatch_segments": 512})
    kwargs, notes = brax_kwargs(config)
    assert any("network.compute_dtype=bfloat16" in n and "float32" in n for n in notes), notes
    assert any("ppo.minibatch_segments=512" in n and "num_minibatches=32" in n for n in notes), notes
    assert kwargs["num_minibatches"] == 32


def test_plot_adds_a_success_panel_for_tasks_with_a_success_metric(bench_run, tmp_path):
    import copy

    import matplotlib.image

    from jaxrose.bench_report import plot_results

    out, results, _ = bench_run
    with_success = copy.deepcopy(results)
    sequential = with_success["systems"]["sequential"]
    sequential["eval_success_rates"] = [0.0] * (len(sequential["eval_env_steps"]) - 1) + [0.5]
    widths = [matplotlib.image.imread(plot_results(r, str(tmp_path / f"{i}.png"))).shape[1]
              for i, r in enumerate((results, with_success))]
    assert widths[1] == widths[0] * 5 // 4  # bars, SM activity, returns by steps and by time; then success rate


def test_parent_leaves_gpu_memory_to_systems_in_child_processes(monkeypatch):
    from jaxrose.bench import share_gpu_memory_with_children

    for name in ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        monkeypatch.delenv(name, raising=False)
    assert not share_gpu_memory_with_children(("brax", "sim", "sequential"))
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ  # in-process systems keep XLA's default
    assert share_gpu_memory_with_children(("sequential", "async"))
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.3")  # the user's own choice is kept
    assert not share_gpu_memory_with_children(("overlapped",))
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ


class AvailableSamplerFake:
    """Models a GPU's activity sampler (GPM present, 100 ms samples) on the CPU: marks are clock times."""

    available, interval_s = True, 0.1

    def mark(self, label):
        import time
        return time.perf_counter()

    def mean(self, t0, t1):
        return {"window_seconds": t1 - t0}


def test_sim_ceiling_window_spans_several_samples_and_uses_the_runs_randomized_env(monkeypatch):
    """A classic-control call lasts milliseconds: with a sampler present the ceiling keeps calling until
    its window holds MIN_SAMPLES_PER_WINDOW samples; and it steps the env the run trains on."""
    import dataclasses

    import envs.randomization
    from jaxrose import bench

    asked = []
    monkeypatch.setattr(envs.randomization, "randomize", lambda env, names: asked.append(tuple(names)) or env)
    config = get_preset("point-mass")
    config = dataclasses.replace(config, env=dataclasses.replace(config.env, num_envs=16, randomize=("mass",)),
                                 ppo=dataclasses.replace(config.ppo, unroll_length=4, batch_size=16,
                                                         num_minibatches=1))
    sampler = AvailableSamplerFake()
    summary = bench._sim_rollout(config, 2, sampler, random_actions=False)
    assert asked == [("mass",)]
    assert len(summary["call_seconds"]) > 2  # milliseconds each: more than `repeats` calls were needed
    window = sum(summary["call_seconds"])
    assert window >= bench.MIN_SAMPLES_PER_WINDOW * sampler.interval_s
    assert summary["sm"]["window_seconds"] >= window
    sampler.available = False  # no sampler: exactly `repeats` calls, as before
    assert len(bench._sim_rollout(config, 2, sampler, random_actions=False)["call_seconds"]) == 2


def test_sigterm_writes_what_was_measured_and_exits_143(tmp_path):
    """A time limit's SIGTERM (the GPU session's `timeout`) mid-run: the bench stops the system running,
    starts no other, and still writes results.json and results.md from the systems it finished."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "cut"
    # A budget the sequential system cannot finish before the signal lands (at 40,960 steps, 2 iterations, it
    # once did on a loaded 2-core machine); the signal stops it after its iteration in flight.
    args = ["--preset", "point-mass", "--total-env-steps", "2048000", "--num-evals", "3", "--num-eval-envs", "8",
            "--repeats", "2", "--systems", "sim,sequential,brax", "--out", str(out)]
    child = subprocess.Popen([sys.executable, "-m", "jaxrose.cli", "bench", *args],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in child.stdout:  # the sequential system's start comes after the ceiling is measured
            lines.append(line)
            if line.startswith("[bench] jaxrose sequential: point_mass"):
                break
        child.send_signal(signal.SIGTERM)
        output = "".join(lines) + child.communicate(timeout=120)[0]
    finally:
        child.kill()
    assert child.returncode == 143, output
    results = json.loads((out / "results.json").read_text())
    assert results["interrupted"] == "signal SIGTERM"
    systems = results["systems"]
    assert systems["sim"]["status"] == "ok" and _positive(systems["sim"]["steady_sps"])
    assert systems["sequential"]["status"] == "error" and "interrupted" in systems["sequential"]["reason"]
    assert systems["brax"] == {"status": "skipped", "reason": "not started: signal SIGTERM"}
    assert results["limits"] == {}  # no learner update was timed
    assert "interrupted (signal SIGTERM)" in (out / "results.md").read_text()


def test_an_interruption_between_steps_or_inside_train_is_charged_to_the_system_running(monkeypatch, tmp_path):
    """SIGTERM right after a system's start is logged (before its code runs), or caught by train's own
    handler (TerminatedError after the iteration in flight): the system is recorded as interrupted while
    running, the ones after it as not started, and the outputs are written."""
    from jaxrose import bench as bench_module
    from jaxrose.train import TerminatedError

    def fake_sim(config, repeats, sampler):  # injects the fault: the interruption, raised where it may land
        raise TerminatedError("SIGTERM received; checkpoint of iteration 1 saved", 143)

    monkeypatch.setattr(bench_module, "run_sim_ceiling", fake_sim)
    bench = parse_args(["--preset", "point-mass", "--total-env-steps", "20480", "--num-evals", "3",
                        "--systems", "sim,brax", "--out", str(tmp_path / "a")])
    results = bench_module.run_bench(bench)
    assert results["interrupted"] == "signal SIGTERM"
    assert results["systems"]["sim"] == {"status": "error", "reason": "interrupted (signal SIGTERM) while running"}
    assert results["systems"]["brax"]["status"] == "skipped"

    def interrupted_log(message):  # the signal delivered as the start line is printed
        if message.startswith("simulation only"):
            raise bench_module.BenchInterrupted("signal SIGTERM")

    monkeypatch.setattr(bench_module, "_log", interrupted_log)
    results = bench_module.run_bench(parse_args(["--preset", "point-mass", "--total-env-steps", "20480",
                                                 "--num-evals", "3", "--systems", "sim,brax",
                                                 "--out", str(tmp_path / "b")]))
    assert results["systems"]["sim"]["reason"] == "interrupted (signal SIGTERM) while running"
    assert results["systems"]["brax"] == {"status": "skipped", "reason": "not started: signal SIGTERM"}
    assert (tmp_path / "b" / "results.md").exists()


def test_an_interrupted_sequential_run_keeps_its_iteration_times(monkeypatch, tmp_path):
    """SIGTERM after a few iterations of the sequential system (injected: raised as the third iteration's
    metrics are emitted, where the signal may land): the row keeps the times measured so far, each equal
    to what train reported, and their median is computed from them."""
    import statistics

    from jaxrose import bench as bench_module
    from jaxrose.train import _TrainingLoop

    emitted: list[float] = []
    emit = _TrainingLoop.emit

    def emit_then_interrupt(self, iteration, metrics):
        emit(self, iteration, metrics)
        if "perf/iteration_seconds" in metrics:
            emitted.append(metrics["perf/iteration_seconds"])
            if len(emitted) == 3:
                raise bench_module.BenchInterrupted("signal SIGTERM")

    monkeypatch.setattr(_TrainingLoop, "emit", emit_then_interrupt)
    out = tmp_path / "cut"
    bench = parse_args(["--preset", "point-mass", "--total-env-steps", "40960", "--num-evals", "3",
                        "--num-eval-envs", "8", "--systems", "sequential,brax", "--out", str(out)])
    results = bench_module.run_bench(bench)
    row = results["systems"]["sequential"]
    assert row["status"] == "error" and row["reason"] == "interrupted (signal SIGTERM) while running"
    done = row["measured_before_interruption"]
    assert done["iterations_done"] == 3 and done["iteration_seconds"] == emitted
    steps = bench_module.train_config(bench).env_steps_per_iteration
    first = done["median_from_iteration"]
    assert first == 2 and done["steady_window_reached"] is False  # 4 iterations per evaluation here
    assert done["median_sps"] == statistics.median(steps / s for s in emitted[first - 1:])
    assert done["eval_env_steps"] == [0] and done["compile_seconds"] > 0  # the evaluation before training
    assert results["systems"]["brax"]["status"] == "skipped"
    assert "3 iteration(s) done, median" in (out / "results.md").read_text()


def test_live_progress_medians_the_steady_window_once_the_run_reached_it():
    """Hand-computed: 6 iterations with a skip of 4 (4 iterations per evaluation): the median covers
    iterations 5 and 6 only; with 2 iterations it covers the second."""
    from jaxrose import bench as bench_module

    config = bench_module.train_config(parse_args(["--preset", "point-mass", "--total-env-steps", "40960",
                                                   "--num-evals", "3"]))
    assert bench_module.steady_skip(config) == 4
    live = bench_module._LiveProgress()
    for seconds in (9.0, 1.0, 1.0, 1.0, 2.0, 4.0):
        live(0, {"perf/iteration_seconds": seconds})
    done = live.summary(config)
    steps = config.env_steps_per_iteration
    assert done["steady_window_reached"] and done["median_from_iteration"] == 5
    assert done["median_sps"] == (steps / 2.0 + steps / 4.0) / 2
    live.iteration_seconds = [9.0, 2.0]
    assert live.summary(config)["median_sps"] == steps / 2.0 and live.summary(config)["median_from_iteration"] == 2


def test_a_budget_scale_adds_evaluation_periods_of_the_same_env_steps():
    from jaxrose.bench import system_config, train_config

    bench = parse_args(["--preset", "point-mass", "--total-env-steps", "20480", "--num-evals", "3",
                        "--budget-scales", "async=1.5,brax=1"])
    config = train_config(bench)
    # point-mass: 5,120 env steps per iteration; 20,480 over 2 periods -> 2 iterations (10,240 steps) per period.
    assert (config.env_steps_per_iteration, config.iterations_per_eval) == (5120, 2)
    scaled = system_config(config, bench, "async")
    # 1.5 x 2 periods = 3 periods of the same 2 iterations: 3 x 2 x 5,120 = 30,720 env steps, 4 evaluations,
    # at 0, 10,240, 20,480 (the others' three) and 30,720.
    assert (scaled.run.total_env_steps, scaled.run.num_evals) == (30720, 4)
    assert (scaled.iterations_per_eval, scaled.num_iterations) == (2, 6)
    assert system_config(config, bench, "brax") is config and system_config(config, bench, "sequential") is config
    assert scaled.ppo == config.ppo and scaled.env == config.env  # only the budget changes


@pytest.mark.parametrize("scales, message", [
    ("async=1.3", "gives 2.6 evaluation periods.*one of 1.5, 2, 2.5, 3"),
    ("async=0.5", "gives 1 evaluation periods"),
    ("rllib=2", "names 'rllib', not a training system"),
    ("sim=2", "sim has no training budget"),
    ("async=0", "must be a positive number"),
    ("async", "items are SYSTEM=FACTOR"),
])
def test_bad_budget_scales_name_the_flag_and_the_fix(scales, message):
    from jaxrose.bench import system_config, train_config

    with pytest.raises(ConfigError, match=message):
        bench = parse_args(["--preset", "point-mass", "--total-env-steps", "20480", "--num-evals", "3",
                            "--budget-scales", scales])
        system_config(train_config(bench), bench, "async")


@pytest.mark.parametrize("scaled, train_args", [("sequential", []), ("async", ["--", "--run.actors", "1"])])
def test_a_scaled_system_evaluates_at_the_others_env_steps_and_past_them(tmp_path, scaled, train_args):
    from jaxrose.bench import train_config

    args = ["--preset", "point-mass", "--total-env-steps", "20480", "--num-evals", "3", "--num-eval-envs", "16",
            "--budget-scales", f"{scaled}=2", "--repeats", "1", "--out", str(tmp_path)]
    main([*args, "--systems", scaled, *train_args])  # the unscaled systems' schedule is the bench's own config's
    unscaled = train_config(parse_args(args))
    others = [i * unscaled.iterations_per_eval * unscaled.env_steps_per_iteration for i in range(unscaled.run.num_evals)]
    assert others == [0, 10240, 20480]
    results = json.loads((tmp_path / "results.json").read_text())
    system = results["systems"][scaled]
    assert system["status"] == "ok", system.get("reason")
    assert system["eval_env_steps"][:3] == others
    assert system["eval_env_steps"] == [0, 10240, 20480, 30720, 40960]  # 2 x 2 periods of 10,240 steps
    assert results["budgets"] == {scaled: {"total_env_steps": 40960, "num_evals": 5, "scale": 2.0}}
    assert "2x the budget (--budget-scales), 40,960 env steps, 5 evaluations" in (tmp_path / "results.md").read_text()
    assert f"--budget-scales {scaled}=2" in results["meta"]["command"]


def test_a_system_past_its_child_timeout_is_recorded_with_the_fix(tmp_path):
    with pytest.raises(SystemExit):  # no system measured: the bench exits non-zero, its outputs written
        main(["--preset", "point-mass", "--total-env-steps", "20480", "--num-evals", "3", "--systems", "async",
              "--child-timeout", "1", "--repeats", "1", "--out", str(tmp_path)])
    system = json.loads((tmp_path / "results.json").read_text())["systems"]["async"]
    assert system["status"] == "error"
    assert "ran past --child-timeout (1 s)" in system["reason"] and "raise --child-timeout" in system["reason"]
