"""`jaxrose compare`: several `jaxrose bench` runs (seeds, settings) side by side.

Every run is judged against one return threshold (stated, or the highest return every system of every
run reached after training began, the rule of `bench.time_to_threshold`). Per run and system: the env
steps and the measured wall-clock seconds to it (bench's measure: from the start of training to the
end of the first evaluation at or above it, less the start-up compilation), the steady steps/s
including evaluations and the final return. Per system over the runs: the median and range of each,
and how many runs reached the threshold. Where a run has brax beside another system: brax's wall
seconds over that system's (the system's speedup), per run and its median.

Per-run ratios drop the runs where either system missed the threshold, and pair runs that share only a
seed. So each system is also set against brax unpaired, over all runs: brax's median time over the
system's, a run that never reached the threshold counted slower than every run that did (the median is
then defined while fewer than half the runs missed it), with a 95% bootstrap interval that resamples each
system's runs on its own (`median_time_ratio`). With the handful of seeds a GPU session affords, the
interval says how little the median pins down.

Evaluations every few million env steps quantize the measured time (a curve that crosses the threshold
just after one evaluation is timed at the next), so each time is also given interpolated between the
evaluations either side of the crossing (`bench.interpolated_wall_seconds`): an estimate from the same
measurements, labelled as such, never in the measured time's place.

`jaxrose compare RUN_A/results.json RUN_B/results.json ... [--labels a,b] [--threshold R] [--out DIR]`
writes compare.md (tables), compare.png (return against measured wall clock) and compare.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import warnings
from typing import Iterable, Optional, Sequence

import numpy as np

from jaxrose.bench import (_comma_list, _wall_seconds_to, highest_common_return, interpolated_wall_seconds,
                           trained_evaluations)
from jaxrose.bench_report import SYSTEM_LABELS, _fmt, is_finite_number, jsonable
from jaxrose.config import ConfigError

DEFAULT_OUT = os.path.join("bench_results", "compare")


@dataclasses.dataclass(frozen=True)
class CompareConfig:
    """What to compare; the command-line arguments map onto these fields."""

    results: tuple[str, ...]  # results.json paths (or the folders holding them), one per run
    labels: tuple[str, ...] = ()  # one per run; default: each results file's folder name
    threshold: Optional[float] = None  # default: the highest return every (run, system) curve reached
    out: str = DEFAULT_OUT

    def __post_init__(self):
        if not self.results:
            raise ConfigError("Give at least one results.json written by `jaxrose bench`.")
        if self.labels and len(self.labels) != len(self.results):
            raise ConfigError(f"--labels gives {len(self.labels)} label(s) for {len(self.results)} results file(s); "
                              f"give one per file, in the same order, or leave --labels out to label each run by "
                              f"its results file's folder name.")
        labels = self.run_labels
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        if repeated:
            raise ConfigError(f"Two runs would share the label {repeated[0]!r} (a label names a run in every table); "
                              f"give distinct ones with --labels a,b,... (one per file, in order).")

    @property
    def run_labels(self) -> tuple[str, ...]:
        return self.labels or tuple(os.path.basename(os.path.dirname(os.path.abspath(_results_file(p))))
                                    for p in self.results)


def parse_args(args: list[str]) -> CompareConfig:
    parser = argparse.ArgumentParser(prog="jaxrose compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", metavar="RESULTS_JSON",
                        help="results.json of each `jaxrose bench` run (or the --out folder holding it)")
    parser.add_argument("--labels", type=_comma_list, default=(),
                        help="comma list, one label per run in order (default: each results file's folder name)")
    parser.add_argument("--threshold", type=float, default=None,
                        help="evaluation return to time every run and system to (default: the highest return "
                             "every system of every run reached after training began)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT})")
    options = parser.parse_args(args)
    return CompareConfig(results=tuple(options.results), labels=options.labels, threshold=options.threshold,
                         out=options.out)


# -- loading --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BenchRun:
    label: str
    path: str
    results: dict  # the results.json, as `jaxrose bench` wrote it

    @property
    def curves(self) -> dict[str, dict]:
        """Its systems with evaluations after training began (the simulation ceiling has none)."""
        return {name: summary for name, summary in self.results["systems"].items()
                if summary.get("status") == "ok" and trained_evaluations(summary)}


def _results_file(path: str) -> str:
    """A bench --out folder stands for the results.json in it."""
    return os.path.join(path, "results.json") if os.path.isdir(path) else path


def load_results(path: str) -> dict:
    """A bench results.json, or a ConfigError that names the file and what to give instead."""
    path = _results_file(path)
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no such file. Give the results.json a `jaxrose bench` run wrote in its --out "
                          f"folder (e.g. bench_results/<preset>/results.json), or that folder.")
    try:
        with open(path) as f:
            results = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path} is not valid JSON ({error}). Give a results.json that `jaxrose bench` finished "
                          f"writing; rerun the bench if it is truncated.") from None
    if not isinstance(results, dict) or not isinstance(results.get("systems"), dict):
        raise ConfigError(f"{path} has no `systems`: it is not a `jaxrose bench` results file (lag-study, plan and "
                          f"probe files have other formats). Give the results.json of a `jaxrose bench` run.")
    return results


def load_runs(config: CompareConfig) -> list[BenchRun]:
    return [BenchRun(label, _results_file(path), load_results(path))
            for label, path in zip(config.run_labels, config.results)]


# -- the comparison -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SystemTimes:
    """One system of one run against the threshold; None where not reached (or not measured)."""

    steps_to_threshold: Optional[int]
    wall_seconds_to_threshold: Optional[float]
    interpolated_wall_seconds_to_threshold: Optional[float]  # bench.interpolated_wall_seconds
    steady_sps_with_evals: Optional[float]
    final_return: Optional[float]


@dataclasses.dataclass(frozen=True)
class Spread:
    median: float
    min: float
    max: float
    count: int  # the values it summarises


@dataclasses.dataclass(frozen=True)
class SystemAcrossRuns:
    runs: int  # runs with a learning curve of this system
    reached: int  # of those, the runs that reached the threshold
    wall_seconds_to_threshold: Optional[Spread]  # over the runs that reached it (and have the timings)
    interpolated_wall_seconds_to_threshold: Optional[Spread]
    final_return: Optional[Spread]
    steady_sps_with_evals: Optional[Spread]


@dataclasses.dataclass(frozen=True)
class BraxRatio:
    """brax's measured wall seconds to the threshold over a system's, in runs holding both: >1, the
    system got there sooner."""

    per_run: dict[str, Optional[float]]  # run label -> ratio; None where either did not reach it
    median: Optional[float]  # over the runs with a ratio


@dataclasses.dataclass(frozen=True)
class MedianTimeRatio:
    """brax's median wall seconds to the threshold over a system's, each over all its timed runs,
    unpaired; a run that never reached the threshold counts as slower than any that did (+inf), so a
    median is +inf when half or more of the runs missed it, and the ratio is then 0 (the system's) or
    +inf (brax's), None where both are. low and high bound the 95% percentile bootstrap interval over
    the resamples whose ratio is defined; undefined_fraction is the share that was not (both medians
    a miss). No interval below 2 runs a system or without a ratio."""

    brax_runs: int
    system_runs: int
    brax_median_seconds: float
    system_median_seconds: float
    ratio: Optional[float]
    low: Optional[float]
    high: Optional[float]
    undefined_fraction: Optional[float]
    resamples: int


@dataclasses.dataclass(frozen=True)
class Comparison:
    threshold: float
    stated: bool
    runs: tuple[BenchRun, ...]
    times: dict[str, dict[str, SystemTimes]]  # run label -> system -> its times
    systems: dict[str, SystemAcrossRuns]  # in order of first appearance
    brax_ratios: dict[str, BraxRatio]  # other system -> ratio
    interpolated_brax_ratios: dict[str, BraxRatio]  # the same over the interpolated times
    median_time_ratios: dict[str, MedianTimeRatio]  # other system -> brax's median time over its, all runs


def _number(value) -> Optional[float]:
    return value if is_finite_number(value) else None


def system_times(summary: dict, threshold: float) -> SystemTimes:
    steps = next((steps for steps, r in trained_evaluations(summary) if r >= threshold), None)
    return SystemTimes(steps_to_threshold=steps,
                       wall_seconds_to_threshold=None if steps is None else _wall_seconds_to(summary, steps),
                       interpolated_wall_seconds_to_threshold=interpolated_wall_seconds(summary, threshold),
                       steady_sps_with_evals=_number(summary.get("steady_sps_with_evals")),
                       final_return=_number(summary.get("final_return")))


def spread(values: Iterable[Optional[float]]) -> Optional[Spread]:
    values = [v for v in values if is_finite_number(v)]
    return Spread(statistics.median(values), min(values), max(values), len(values)) if values else None


def _across_runs(times: list[SystemTimes]) -> SystemAcrossRuns:
    return SystemAcrossRuns(runs=len(times), reached=sum(t.steps_to_threshold is not None for t in times),
                            wall_seconds_to_threshold=spread(t.wall_seconds_to_threshold for t in times),
                            interpolated_wall_seconds_to_threshold=spread(
                                t.interpolated_wall_seconds_to_threshold for t in times),
                            final_return=spread(t.final_return for t in times),
                            steady_sps_with_evals=spread(t.steady_sps_with_evals for t in times))


def _brax_ratio(times: dict[str, dict[str, SystemTimes]], system: str,
                field: str = "wall_seconds_to_threshold") -> BraxRatio:
    per_run = {}
    for label, systems in times.items():
        if "brax" in systems and system in systems:
            brax, other = getattr(systems["brax"], field), getattr(systems[system], field)
            per_run[label] = brax / other if brax is not None and other is not None and other > 0 else None
    ratios = [r for r in per_run.values() if r is not None]
    return BraxRatio(per_run, statistics.median(ratios) if ratios else None)


BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0  # a fixed stream: the same files give the same interval


def _ratio(brax_seconds, system_seconds):
    """Elementwise brax / system over +inf-for-a-miss medians: a missing system gives 0, a missing brax
    +inf, both nan (which is slower is unknown)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(brax_seconds, dtype=float) / np.asarray(system_seconds, dtype=float)


def median_time_ratio(brax_seconds: Sequence[Optional[float]], system_seconds: Sequence[Optional[float]],
                      resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> MedianTimeRatio:
    """brax's median time over the system's, None standing for a run that missed the threshold, and a
    stratified percentile bootstrap of it (each system's runs resampled on their own, as rliable does
    for scores). Hand-written rather than scipy.stats.bootstrap: a miss is +inf, and resamples where
    both medians are one give no ratio, which scipy's interval cannot leave out and count."""
    brax = np.array([math.inf if s is None else s for s in brax_seconds], dtype=float)
    system = np.array([math.inf if s is None else s for s in system_seconds], dtype=float)
    if not len(brax) or not len(system):
        raise ValueError("median_time_ratio needs at least one run of each system")
    brax_median, system_median = float(np.median(brax)), float(np.median(system))
    ratio = float(_ratio(brax_median, system_median))
    ratio = None if math.isnan(ratio) else ratio
    low = high = undefined = None
    if ratio is not None and min(len(brax), len(system)) >= 2:
        rng = np.random.default_rng(seed)
        ratios = _ratio(np.median(brax[rng.integers(0, len(brax), (resamples, len(brax)))], axis=1),
                        np.median(system[rng.integers(0, len(system), (resamples, len(system)))], axis=1))
        defined = ratios[~np.isnan(ratios)]
        undefined = 1.0 - len(defined) / resamples
        # inverted_cdf: quantiles taken among the resampled ratios, never between them (0 and +inf included)
        low, high = (float(q) for q in np.quantile(defined, (0.025, 0.975), method="inverted_cdf"))
    return MedianTimeRatio(len(brax), len(system), brax_median, system_median, ratio, low, high, undefined,
                           resamples)


def _timed_seconds(times: dict[str, dict[str, SystemTimes]], system: str) -> list[Optional[float]]:
    """A system's seconds to the threshold over the runs, None for a miss; runs that reached it without
    a stored clock (results from before the bench kept timings) left out."""
    return [t[system].wall_seconds_to_threshold for t in times.values() if system in t
            and (t[system].steps_to_threshold is None or t[system].wall_seconds_to_threshold is not None)]


def mixed_devices(runs: Sequence[BenchRun]) -> Optional[str]:
    """A warning when the runs ran on more than one kind of device: their wall-clock times (and the
    medians over them) then mix machines, and only ratios within a run still compare like with like."""
    kinds = [run.results.get("meta", {}).get("device_kind") or "unknown device" for run in runs]
    if len(set(kinds)) < 2:
        return None
    counts = ", ".join(f"{kind} ×{kinds.count(kind)}" for kind in dict.fromkeys(kinds))
    return (f"the runs ran on different devices ({counts}): times and the medians over runs mix machines; the "
            f"per-run ratios (brax beside each system in one run) still compare like with like. Compare the runs "
            f"of one device to read times.")


def compare(runs: Sequence[BenchRun], threshold: Optional[float] = None) -> Comparison:
    curves = [summary for run in runs for summary in run.curves.values()]
    if not curves:
        raise ConfigError("None of the runs has a system with evaluations after training began, so there is no "
                          "time to a return to compare; give results.json files of bench runs that trained.")
    stated = threshold is not None
    threshold = threshold if stated else highest_common_return(curves)
    times = {run.label: {name: system_times(summary, threshold) for name, summary in run.curves.items()}
             for run in runs}
    names = list(dict.fromkeys(name for run_times in times.values() for name in run_times))
    systems = {name: _across_runs([t[name] for t in times.values() if name in t]) for name in names}
    paired = [name for name in names if name != "brax"
              and any("brax" in t and name in t for t in times.values())]
    brax_ratios = {name: _brax_ratio(times, name) for name in paired}
    interpolated = {name: _brax_ratio(times, name, "interpolated_wall_seconds_to_threshold") for name in paired}
    seconds = {name: _timed_seconds(times, name) for name in names}
    unpaired = {name: median_time_ratio(seconds["brax"], seconds[name]) for name in paired
                if seconds["brax"] and seconds[name]}
    return Comparison(threshold, stated, tuple(runs), times, systems, brax_ratios, interpolated, unpaired)


# -- outputs --------------------------------------------------------------------------------------


def _fmt_spread(value: Optional[Spread], spec: str) -> str:
    if value is None:
        return "—"
    if value.count == 1:
        return _fmt(value.median, spec)
    return f"{_fmt(value.median, spec)} ({_fmt(value.min, spec)}–{_fmt(value.max, spec)})"


def _label(system: str) -> str:
    return SYSTEM_LABELS.get(system, system)


def render_markdown(comparison: Comparison) -> str:
    how = "stated" if comparison.stated else "the highest return every system of every run reached"
    lines = [f"## jaxrose compare: {len(comparison.runs)} bench run(s), return threshold "
             f"{comparison.threshold:.4g} ({how})", "",
             "Wall clock to the threshold is measured: from the start of training to the end of the first evaluation "
             "at or above it, less the first iteration's (epoch's) time beyond a median one's (start-up "
             "compilation); compilations mid-run count. Interpolated: where the line between the measured points "
             "either side of the first crossing meets the threshold (the start of training, at the return before "
             "it, is the point before the first evaluation): an estimate between measurements, given beside them "
             "because evaluations every few million env steps quantize the measured time.", "",
             "| run | results | device | commit | source digest | date (UTC) |", "| --- | --- | --- | --- | --- | --- |"]
    for run in comparison.runs:
        meta = run.results.get("meta", {})
        commit = (meta.get("git_commit") or "unknown")[:10]
        commit += " (uncommitted changes)" if meta.get("git_dirty") else ""
        lines.append(f"| {run.label} | {run.path} | {meta.get('device_kind', '—')} | {commit} "
                     f"| {meta.get('source_digest', '—')} | {meta.get('date_utc', '—')} |")
    lines += [""] + [f"- {run.label}: `{run.results.get('meta', {}).get('command', 'unknown command')}`"
                     for run in comparison.runs]
    mixed = mixed_devices(comparison.runs)
    if mixed:
        lines += ["", f"**Warning:** {mixed}"]
    lines += ["", "### Per run", "",
              "| run | system | env steps to threshold | wall-clock s to threshold | interpolated s "
              "| steps/s incl. evals | final return |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for label, systems in comparison.times.items():
        for name, t in systems.items():
            steps = "not reached" if t.steps_to_threshold is None else _fmt(t.steps_to_threshold, ",.0f")
            wall = "not reached" if t.steps_to_threshold is None else _fmt(t.wall_seconds_to_threshold, ".1f")
            interpolated = _fmt(t.interpolated_wall_seconds_to_threshold, ".1f")
            lines.append(f"| {label} | {_label(name)} | {steps} | {wall} | {interpolated} "
                         f"| {_fmt(t.steady_sps_with_evals, ',.0f')} | {_fmt(t.final_return, '.4g')} |")
    lines += ["", "### Per system over the runs: median (min–max)", "",
              "| system | reached the threshold | wall-clock s to threshold (runs that reached it) | interpolated s "
              "| final return | steps/s incl. evals |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, s in comparison.systems.items():
        wall = _fmt_spread(s.wall_seconds_to_threshold, ".1f")
        timed = s.wall_seconds_to_threshold.count if s.wall_seconds_to_threshold else 0
        if timed < s.reached:  # results from before the bench stored its timings have steps but no wall clock
            wall += f" ({timed} of {s.reached} timed)"
        lines.append(f"| {_label(name)} | {s.reached} of {s.runs} | {wall} "
                     f"| {_fmt_spread(s.interpolated_wall_seconds_to_threshold, '.1f')} "
                     f"| {_fmt_spread(s.final_return, '.4g')} | {_fmt_spread(s.steady_sps_with_evals, ',.0f')} |")
    if comparison.brax_ratios:
        labels = [run.label for run in comparison.runs]
        lines += ["", "### brax's wall-clock seconds to the threshold over each system's, per run "
                      "(> 1: the system got there sooner)", "",
                  f"| system | {' | '.join(labels)} | median |", "| --- |" + " ---: |" * (len(labels) + 1)]
        for name in comparison.brax_ratios:
            for ratio, how in ((comparison.brax_ratios[name], ""),
                               (comparison.interpolated_brax_ratios[name], ", interpolated")):
                cells = [_fmt(ratio.per_run[label], ".3f") if label in ratio.per_run else "" for label in labels]
                lines.append(f"| {_label(name)}{how} | {' | '.join(cells)} | {_fmt(ratio.median, '.3f')} |")
    if comparison.median_time_ratios:
        lines += ["", "### brax's median wall-clock seconds to the threshold over each system's, all runs, unpaired",
                  "",
                  "A run that missed the threshold counts as slower than every run that reached it; the interval "
                  f"is the 95% percentile bootstrap, each system's runs resampled on their own "
                  f"({BOOTSTRAP_RESAMPLES:,} resamples), over the resamples where at most one median is a miss.", "",
                  "| system | runs: brax / system | brax median s | system median s | brax / system "
                  "| 95% interval | resamples without a ratio |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for name, r in comparison.median_time_ratios.items():
            interval = "—" if r.low is None else f"{_fmt_ratio(r.low)}–{_fmt_ratio(r.high)}"
            undefined = "—" if r.undefined_fraction is None else f"{r.undefined_fraction:.1%}"
            lines.append(f"| {_label(name)} | {r.brax_runs} / {r.system_runs} | {_fmt_median(r.brax_median_seconds)} "
                         f"| {_fmt_median(r.system_median_seconds)} "
                         f"| {'—' if r.ratio is None else _fmt_ratio(r.ratio)} | {interval} | {undefined} |")
    return "\n".join(lines) + "\n"


def _fmt_median(seconds: float) -> str:
    return "not reached" if math.isinf(seconds) else f"{seconds:.1f}"


def _fmt_ratio(ratio: float) -> str:
    return "∞" if math.isinf(ratio) else f"{ratio:.3f}"


def _median_time_ratio_json(r: MedianTimeRatio) -> dict:
    """+inf spelled out (jsonable would make it null): a median 'not reached', a bound 'inf'."""
    as_dict = dataclasses.asdict(r)
    for key in ("brax_median_seconds", "system_median_seconds"):
        as_dict[key] = "not reached" if math.isinf(as_dict[key]) else as_dict[key]
    for key in ("ratio", "low", "high"):
        as_dict[key] = "inf" if as_dict[key] is not None and math.isinf(as_dict[key]) else as_dict[key]
    return as_dict


def to_json(comparison: Comparison) -> dict:
    runs = [{"label": run.label, "path": run.path, "meta": run.results.get("meta", {}),
             "systems": {name: dataclasses.asdict(t) for name, t in comparison.times[run.label].items()}}
            for run in comparison.runs]
    return jsonable({"threshold": {"return": comparison.threshold, "stated": comparison.stated}, "runs": runs,
                     "systems": {name: dataclasses.asdict(s) for name, s in comparison.systems.items()},
                     "brax_ratios": {name: dataclasses.asdict(r) for name, r in comparison.brax_ratios.items()},
                     "interpolated_brax_ratios": {name: dataclasses.asdict(r)
                                                  for name, r in comparison.interpolated_brax_ratios.items()},
                     "median_time_ratios": {name: _median_time_ratio_json(r)
                                            for name, r in comparison.median_time_ratios.items()}})


def wall_clock_curve(summary: dict) -> list[tuple[float, float]]:
    """(measured wall seconds, return) of each evaluation after training began, on the clock of the
    times to the threshold, so a curve crosses the threshold line where its time says."""
    points = [(_wall_seconds_to(summary, steps), r) for steps, r in trained_evaluations(summary)]
    return [(seconds, r) for seconds, r in points if seconds is not None]


def plot_comparison(comparison: Comparison, png_path: str) -> str:
    """Two panels, one line per (run, system): return against the measured wall clock (the times to
    the threshold) and against env steps (what each learned per env step, the lag's cost)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {name: f"C{i}" for i, name in enumerate(comparison.systems)}  # a colour per system, a style per run
    styles = ("-", "--", ":", "-.")
    markers = ("o", "s", "^", "D", "v", "P", "X")
    fig, (by_time, by_steps) = plt.subplots(1, 2, figsize=(15, 6), sharey=True)
    for i, run in enumerate(comparison.runs):
        for name, summary in run.curves.items():
            style = dict(color=colors[name], ls=styles[i % len(styles)], marker=markers[i % len(markers)],
                         label=f"{run.label}: {_label(name)}")
            curve = wall_clock_curve(summary)
            if curve:
                by_time.plot(*zip(*curve), **style)
            by_steps.plot(*zip(*trained_evaluations(summary)), **style)
    for axis in (by_time, by_steps):
        axis.axhline(comparison.threshold, color="0.3", ls="--", lw=1, label=f"threshold {comparison.threshold:.4g}")
        axis.grid(alpha=0.3)
    by_time.set_xlabel("measured wall-clock seconds since training began (start-up compile excluded)")
    by_time.set_ylabel("evaluation return")
    by_time.set_title("return against wall clock")
    by_steps.set_xlabel("env steps")
    by_steps.set_title("return against env steps")
    by_steps.legend(fontsize=7)
    fig.suptitle(f"{len(comparison.runs)} bench run(s)")
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return png_path


def write_outputs(comparison: Comparison, out_dir: str) -> None:
    from jaxrose.run_folder import set_aside, write_atomically

    os.makedirs(out_dir, exist_ok=True)
    set_aside(out_dir, ("compare.md", "compare.json", "compare.png"), "--out", "Give each comparison its own --out.")
    write_atomically(os.path.join(out_dir, "compare.md"), render_markdown(comparison))
    write_atomically(os.path.join(out_dir, "compare.json"), json.dumps(to_json(comparison), indent=2, allow_nan=False))
    plot_comparison(comparison, os.path.join(out_dir, "compare.png"))


def main(args: list[str]) -> None:
    config = parse_args(args)
    comparison = compare(load_runs(config), config.threshold)
    mixed = mixed_devices(comparison.runs)
    if mixed:
        warnings.warn(f"jaxrose compare: {mixed}", stacklevel=2)
    write_outputs(comparison, config.out)
    print(render_markdown(comparison))
    print(f"outputs: {os.path.abspath(config.out)} (compare.md, compare.png, compare.json)")
