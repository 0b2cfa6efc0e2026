"""`jaxrose bench`'s outputs from its results: the markdown tables, the plot, the record appended
to BENCHMARKS.md, and JSON without NaN."""

from __future__ import annotations

import math
import os
import statistics
import textwrap

def is_finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


SYSTEM_LABELS = {"brax": "brax PPO", "sim": "simulation only (ceiling)", "sequential": "jaxrose sequential",
                 "overlapped": "jaxrose, evaluation overlapped (MPS process)",
                 "spread": "jaxrose, rollout groups spread over MPS processes + evaluation overlapped",
                 "tuned": "jaxrose tuned (jaxrose tune's plan, evaluation where it put it)",
                 "async": "jaxrose asynchronous (actors, lag <= run.max_policy_lag)"}


def jsonable(value):
    """JSON without NaN or infinity: non-finite floats become null."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _fmt(value, spec: str = ",.0f") -> str:
    return format(value, spec) if is_finite_number(value) else "—"


def _before_interruption(done) -> str:
    """What a system cut short had measured, for its table row."""
    if not done:
        return ""
    text = f"; {done['iterations_done']} iteration(s) done"
    if done.get("median_sps") is not None:
        window = "steady window" if done["steady_window_reached"] else "not a full steady window"
        text += f", median {_fmt(done['median_sps'])} steps/s from iteration {done['median_from_iteration']} ({window})"
    return text


def _sm(summary: dict, key: str) -> str:
    sm = summary.get("sm")
    return _fmt(sm[key], ".1f") if sm else "—"


def render_markdown(results: dict) -> str:
    meta, run = results["meta"], results["config"]["run"]
    lines = [
        f"## {meta['preset']}: {results['config']['env']['name']}, {run['total_env_steps']:,} env steps, "
        f"{run['num_evals']} evaluations",
        "",
        f"- date (UTC): {meta['date_utc']}",
        f"- commit: {meta['git_commit'] or 'unknown'}{' (uncommitted changes)' if meta['git_dirty'] else ''}; "
        f"source digest {meta.get('source_digest', 'not recorded')} (`python -m jaxrose.provenance REV` gives a "
        f"commit's)",
        f"- device: {meta['device_kind']} ({meta['platform']}); jax {meta['jax_version']}, brax {meta['brax_version']}",
        f"- command: `{meta['command']}`",
        f"- env steps per iteration: {results['schedule']['env_steps_per_iteration']:,}; "
        f"iterations per evaluation: {results['schedule']['iterations_per_eval']}",
        *[f"- {SYSTEM_LABELS[name]}: {budget['scale']:g}x the budget (--budget-scales), {budget['total_env_steps']:,} "
          f"env steps, {budget['num_evals']} evaluations at the same env steps as the others'"
          for name, budget in results.get("budgets", {}).items()],
        "",
        "| system | steady steps/s | steps/s incl. evals | compile s | time to steady s | final return "
        "| SM activity % | SM occupancy % |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, summary in results["systems"].items():
        label = SYSTEM_LABELS[name]
        if summary.get("status") != "ok":
            lines.append(f"| {label} | {summary.get('status', 'failed')}: {summary.get('reason')}"
                         f"{_before_interruption(summary.get('measured_before_interruption'))} | | | | | | |")
            continue
        lines.append(f"| {label} | {_fmt(summary['steady_sps'])} | {_fmt(summary.get('steady_sps_with_evals'))} "
                     f"| {_fmt(summary['compile_seconds'], '.1f')} | {_fmt(summary.get('seconds_to_steady'), '.1f')} "
                     f"| {_fmt(summary.get('final_return'), '.4g')} "
                     f"| {_sm(summary, 'sm_activity_pct')} | {_sm(summary, 'sm_occupancy_pct')} |")
    limits = results["limits"]
    if limits:
        lines += [
            "",
            "| limit | steps/s | seconds per iteration |",
            "| --- | ---: | ---: |",
            f"| rollout ceiling (simulation alone) | {_fmt(limits['rollout_ceiling_sps'])} "
            f"| {_fmt(limits['rollout_seconds_at_ceiling'], '.4f')} |",
            f"| synchronous limit (rollout at ceiling + training alone) | {_fmt(limits['synchronous_limit_sps'])} "
            f"| {_fmt(limits['rollout_seconds_at_ceiling'] + limits['training_seconds_alone'], '.4f')} |",
            f"| training alone (learner update) | | {_fmt(limits['training_seconds_alone'], '.4f')} |",
        ]
        if "rollout_ceiling_random_actions_sps" in limits:
            lines += [
                f"| rollout ceiling, random actions | {_fmt(limits['rollout_ceiling_random_actions_sps'])} "
                f"| {_fmt(limits['rollout_seconds_random_actions'], '.4f')} |",
                f"| synchronous limit, random actions | {_fmt(limits['synchronous_limit_random_actions_sps'])} "
                f"| {_fmt(limits['rollout_seconds_random_actions'] + limits['training_seconds_alone'], '.4f')} |",
            ]
    if results["ratios"]:
        lines += ["", "| ratio | value | from |", "| --- | ---: | --- |"]
        lines += [f"| {r['name']} | {r['value']:.3f} | `{r['numerator']}` / `{r['denominator']}` |"
                  for r in results["ratios"]]
    threshold = results.get("threshold") or {}
    timed = {n: s for n, s in results["systems"].items() if s.get("status") == "ok" and "steps_to_threshold" in s}
    if threshold and timed:
        how = "stated" if threshold["stated"] else "the highest return every system reached"
        lines += ["", f"Time to an evaluation return of {threshold['return']:.4g} ({how}). At steady rate: those env "
                      f"steps at the system's steady rate including evaluations. Measured: wall clock from the start "
                      f"of training to the end of that evaluation, less the first iteration's time beyond a median "
                      f"one's (start-up compilation); compilations mid-run count. Interpolated: where the line "
                      f"between the measured points either side of the crossing meets the threshold (an estimate "
                      f"beside the measured time, which evaluations every few million env steps quantize).", "",
                  "| system | env steps to threshold | seconds at steady rate | seconds measured | interpolated |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        lines += _threshold_rows(timed, ("steps_to_threshold", "seconds_to_threshold", "wall_seconds_to_threshold",
                                         "interpolated_wall_seconds_to_threshold"))
        if "common_return" in threshold:
            lines += ["", f"Not every system reached it; to {threshold['common_return']:.4g}, the highest return "
                          f"every system reached:", "",
                      "| system | env steps | seconds at steady rate | seconds measured | interpolated |",
                      "| --- | ---: | ---: | ---: | ---: |"]
            lines += _threshold_rows({n: s["common_threshold_times"] for n, s in timed.items()
                                      if "common_threshold_times" in s},
                                     ("steps", "seconds", "wall_seconds", "interpolated_wall_seconds"))
    lines += ["", *_eval_lines(results), *_tuning_lines(results), *_notes(results), ""]
    return "\n".join(lines)


def _threshold_rows(times: dict, keys: tuple[str, str, str, str]) -> list[str]:
    """Per system, its env steps, seconds at steady rate, measured and interpolated, read under `keys`
    (results from before a key was stored show a dash)."""
    steps, seconds, measured, interpolated = keys
    return [f"| {SYSTEM_LABELS[n]} | {_fmt(t[steps])} | {_fmt(t[seconds], '.1f')} | {_fmt(t.get(measured), '.1f')} "
            f"| {_fmt(t.get(interpolated), '.1f')} |" for n, t in times.items()]


def _tuning_lines(results: dict) -> list[str]:
    """The tuned system's tuning as #7 asks it recorded: time, candidates tried and kept, both speedups; or the
    saved plan it trained with, nothing tuned in the run."""
    summary = results["systems"].get("tuned", {})
    tuning = summary.get("tuning") if summary.get("status") == "ok" else None
    if not tuning:
        return []
    label = SYSTEM_LABELS["tuned"]
    if tuning.get("plan_file"):
        history = "; ".join(tuning.get("history") or []) or "the sequential plan"
        return [f"- {label}: trained with the saved plan {tuning['plan_file']} ({history}); nothing tuned in this run"]
    line = (f"- {label}: tuning took {_fmt(tuning['tuning_seconds'], '.1f')} s, {tuning['candidates_tried']} "
            f"candidates tried, {tuning['candidates_kept']} kept; per iteration without evaluations "
            f"{_fmt(1e3 * tuning['baseline_seconds'], '.2f')} -> {_fmt(1e3 * tuning['final_seconds'], '.2f')} ms "
            f"({_fmt(tuning['speedup_per_iteration'], '.3f')}x)")
    if tuning.get("speedup_with_evaluations") is not None:
        line += (f", with evaluations {_fmt(1e3 * tuning['inline_evaluation_seconds'], '.2f')} ms inline -> "
                 f"{_fmt(1e3 * tuning['placed_evaluation_seconds'], '.2f')} ms as placed "
                 f"({_fmt(tuning['speedup_with_evaluations'], '.3f')}x)")
    kept = [t["description"] for t in tuning.get("trials", []) if t.get("kept")]
    return [line + f"; kept: {', '.join(kept) if kept else 'nothing'}"]


def _eval_lines(results: dict) -> list[str]:
    lines = []
    for name in ("brax", "sequential"):
        summary = results["systems"].get(name, {})
        if summary.get("status") == "ok":
            evals = summary["eval_seconds"]
            steady = evals[2:]  # the evaluations inside the steady window
            share = sum(steady) / summary["steady_wall_seconds"] if summary["steady_wall_seconds"] > 0 else float("nan")
            lines.append(f"- {SYSTEM_LABELS[name]}: median evaluation {_fmt(statistics.median(steady), '.3f')} s, "
                         f"{_fmt(100 * share, '.0f')}% of the steady wall time")
    summary = results["systems"].get("async", {})
    if summary.get("status") == "ok" and summary.get("median_actor_rollout_seconds"):
        rollouts = ", ".join(f"actor {i} {_fmt(t, '.3f')} s" for i, t in summary["median_actor_rollout_seconds"].items())
        lines.append(f"- {SYSTEM_LABELS['async']}, per steady update (medians): rollout ({rollouts}; its own clock, "
                     f"hand-off included), learner busy {_fmt(summary['median_steady_learner_busy_seconds'], '.3f')} s, "
                     f"learner waiting {_fmt(summary['median_steady_learner_wait_seconds'], '.3f')} s")
        for i, parts in (summary.get("median_actor_timing") or {}).items():
            lines.append(f"- actor {i}'s clock (medians): collect {_fmt(parts.get('collect'), '.3f')} s, hand-off "
                         f"{_fmt(parts.get('hand_off'), '.3f')} s, idle before a rollout "
                         f"{_fmt(parts.get('idle_before'), '.3f')} s")
    return lines


def _notes(results: dict) -> list[str]:
    notes = [
        "- steady: epochs (brax) or iterations (jaxrose) after the first evaluation period, whose first epoch "
        "compiles; incl. evals: steady env steps / wall time from the end of the second evaluation to the end "
        "of the last.",
        "- compile s: brax, its first epoch's time beyond a steady epoch's; jaxrose, the ahead-of-time compile of "
        "one iteration; simulation, the compile of one iteration's rollout. time to steady s: from the system's "
        "start (env construction included) to the start of its steady window: every compilation, the first "
        "epoch and the first two evaluations.",
    ]
    if results.get("interrupted"):
        notes.append(f"- interrupted ({results['interrupted']}): systems after it did not start, and the limits "
                     "need the learner update's timing, which may be missing.")
    sampling = results["meta"]["sm_sampling"]
    if not sampling["available"]:
        notes.append(f"- SM activity not measured: {sampling['reason']}")
    notes += gpu_state_lines(results)
    for note in results["systems"].get("brax", {}).get("notes", []):
        notes.append(f"- brax mapping: {note}")
    return notes


def gpu_state_lines(results: dict) -> list[str]:
    """The device's state over each system's measured window, where NVML reported it: a rate that
    differs between runs of the same program is often a clock held down by power or heat."""
    parts = []
    for name, summary in results["systems"].items():
        sm = summary.get("sm") or {}
        if "sm_clock_mhz_median" not in sm:
            continue
        text = f"{SYSTEM_LABELS[name]}: SM clock {sm['sm_clock_mhz_median']:.0f} MHz median (min {sm['sm_clock_mhz_min']:.0f})"
        if "temperature_c_max" in sm:
            text += f", up to {sm['temperature_c_max']:.0f} C"
        if "power_w_mean" in sm:
            text += f", {sm['power_w_mean']:.0f} W mean"
        limited = sm.get("clock_limited_share") or {}
        text += ("; clock held down by " + ", ".join(f"{reason} in {share:.0%} of samples"
                                                     for reason, share in limited.items())) if limited else ""
        parts.append(text)
    return ["- GPU state over each system's measured window: " + "; ".join(parts) + "."] if parts else []


def plot_results(results: dict, png_path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = {name: s for name, s in results["systems"].items() if s.get("status") == "ok"}
    with_success = {name: s for name, s in systems.items() if s.get("eval_success_rates")}
    panels = 4 + bool(with_success)
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.5))
    bars, activity, curves, clock = axes[:4]
    for i, (name, summary) in enumerate(systems.items()):
        for offset, key, color in ((-0.2, "steady_sps", "C0"), (0.2, "steady_sps_with_evals", "C1")):
            value = summary.get(key)
            if is_finite_number(value):
                bars.bar(i + offset, value, width=0.4, color=color)
                bars.annotate(f"{value:,.0f}", (i + offset, value), ha="center", va="bottom", fontsize=7)
    if "synchronous_limit_sps" in results["limits"]:
        bars.axhline(results["limits"]["synchronous_limit_sps"], color="0.4", ls="--", lw=1)
    bars.legend(handles=[plt.Rectangle((0, 0), 1, 1, color="C0"), plt.Rectangle((0, 0), 1, 1, color="C1"),
                         plt.Line2D([], [], color="0.4", ls="--")],
                labels=["steady", "steady incl. evals", "synchronous limit"], fontsize=8)
    values = [s[k] for s in systems.values() for k in ("steady_sps", "steady_sps_with_evals") if is_finite_number(s.get(k))]
    if values and min(values) > 0 and max(values) / min(values) > 20:
        bars.set_yscale("log")  # the simulation ceiling can dwarf the trainers by orders of magnitude
    bars.set_xticks(range(len(systems)), [SYSTEM_LABELS[name] for name in systems], fontsize=8)
    bars.set_ylabel("env steps / s")
    bars.set_title(f"{results['meta']['preset']} on {results['meta']['device_kind']}")
    bars.grid(axis="y", alpha=0.3)

    samples = results["gpu_activity"]["samples"]
    if samples:
        activity.plot([s[0] for s in samples], [s[1] for s in samples], lw=1, color="k", label="SM activity")
        activity.plot([s[0] for s in samples], [s[2] for s in samples], lw=1, color="0.6", label="SM occupancy")
        for i, (name, s) in enumerate(systems.items()):
            activity.axvspan(*s["window"], alpha=0.15, color=f"C{i}", label=f"{SYSTEM_LABELS[name]} steady")
        activity.set_xlabel("seconds since the bench started")
        activity.set_ylabel("%")
        activity.set_ylim(0, 100)
        activity.legend(fontsize=8)
        clocks = [(s[0], s[3]) for s in samples if len(s) > 3 and s[3] is not None]
        if clocks:  # a clock held down (power, heat) slows every system measured under it
            sm_clock = activity.twinx()
            sm_clock.plot(*zip(*clocks), lw=0.8, color="tab:red", alpha=0.6)
            sm_clock.set_ylabel("SM clock (MHz)", color="tab:red")
    else:
        reason = textwrap.fill(str(results["meta"]["sm_sampling"]["reason"]), 60)
        activity.text(0.5, 0.5, "SM activity not measured:\n" + reason, ha="center", va="center",
                      transform=activity.transAxes)
        activity.set_axis_off()
    # Learning curves: the same return at the same env steps is part of the comparison.
    for i, (name, s) in enumerate(systems.items()):
        if s.get("eval_returns"):
            curves.plot(s["eval_env_steps"], s["eval_returns"], "o-", color=f"C{i}", label=SYSTEM_LABELS[name])
    curves.set_xlabel("env steps")
    curves.set_ylabel("evaluation return")
    curves.grid(alpha=0.3)
    if curves.lines:
        curves.legend(fontsize=8)
    # The same curves against wall clock, from the end of each system's first evaluation (training's
    # start; a system that compiles lazily pays its first compile inside the curve).
    for i, (name, s) in enumerate(systems.items()):
        if s.get("eval_returns") and s.get("eval_done_seconds"):
            t0 = s["eval_done_seconds"][0]
            clock.plot([t - t0 for t in s["eval_done_seconds"]], s["eval_returns"], "o-", color=f"C{i}",
                       label=SYSTEM_LABELS[name])
    threshold = (results.get("threshold") or {}).get("return")
    if is_finite_number(threshold) and clock.lines:
        clock.axhline(threshold, color="0.4", ls=":", lw=1, label="return threshold")
    clock.set_xlabel("wall-clock seconds since the first evaluation")
    clock.set_ylabel("evaluation return")
    clock.grid(alpha=0.3)
    if clock.lines:
        clock.legend(fontsize=8)
    if with_success:
        success = axes[4]
        for i, (name, s) in enumerate(systems.items()):
            if name in with_success:
                points = [(x, y) for x, y in zip(s["eval_env_steps"], s["eval_success_rates"]) if y is not None]
                success.plot(*zip(*points), "o-", color=f"C{i}", label=SYSTEM_LABELS[name])
        success.set_xlabel("env steps")
        success.set_ylabel("evaluation success rate")
        success.set_ylim(-0.02, 1.02)
        success.grid(alpha=0.3)
        success.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return png_path


def append_record(path: str, markdown: str) -> None:
    """Appends the results section to a running log such as BENCHMARKS.md."""
    exists = os.path.exists(path) and os.path.getsize(path) > 0
    with open(path, "a") as f:
        f.write(("\n" if exists else "") + markdown)
