"""Autotuning (Rose stage 1 then stage 2): candidates from the window-guided planner, each kept
only if an end-to-end measurement over several iterations beats the current plan by more than the
measured noise; then SM quotas for the helper processes, under MPS only.

Every optimization has a switch, so a researcher can reproduce an ablation: `groups` (the rollout's
env groups spread over concurrent processes), `overlap` (chunks on helper processes beside the next
iteration), `restructure` (split/fuse chunks, and nested loops unrolled into straight-line code), `quotas`, and
`validate` (off: keep whatever the model predicts to be faster, without measuring).

Last, under `overlap`, the periodic evaluation is tried in its own process beside training. Evaluation
is outside the iteration, so that trial is measured differently: whole evaluation periods of real
training (`measure_with_evaluation`), seconds per iteration with the evaluations' cost spread over them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import tempfile
import time
from typing import Any, Callable, Iterator, Optional

import jax

from jaxrose.config import ConfigError, TrainConfig
from jaxrose.graph import build_graph
from jaxrose.mps import clients_unavailable_reason
from jaxrose.plan import Plan, PlanError, evaluate_in_process, sequential_plan, spread_rollout, unroll_loop, with_quota
from jaxrose.planner import rank
from jaxrose.ppo_program import ITERATION_INPUTS
from jaxrose.program import Loop
from jaxrose.program_profiler import default_executor_factory, profile_program
from jaxrose.runtime import MAIN, executor_for


@dataclasses.dataclass(frozen=True)
class Switches:
    groups: bool = True
    overlap: bool = True
    restructure: bool = True
    quotas: bool = True
    validate: bool = True


@dataclasses.dataclass
class Trial:
    description: str
    predicted_gain: float
    measured_seconds: Optional[float]
    kept: bool
    reason: str


@dataclasses.dataclass
class TuneResult:
    plan: Plan
    baseline_seconds: float
    final_seconds: float
    noise_seconds: float
    trials: list[Trial]
    tuning_seconds: float
    measurements_reused: int = 0  # end-to-end measurements and profiles read from a shared `Measurements`
    # The evaluation-placement trial's seconds per iteration, evaluations included: with the evaluation inline
    # and where the chosen plan puts it (equal when it stays inline); None when that trial measured nothing.
    # `baseline_seconds`/`final_seconds` time iterations without evaluations, so they cannot show its gain.
    inline_evaluation_seconds: Optional[float] = None
    placed_evaluation_seconds: Optional[float] = None

    @property
    def speedup(self) -> float:
        """Per iteration, evaluations left out."""
        return self.baseline_seconds / self.final_seconds

    @property
    def speedup_with_evaluations(self) -> Optional[float]:
        """Of the evaluation's placement, per iteration with evaluations included; None when not measured."""
        if self.placed_evaluation_seconds is None:
            return None
        return self.inline_evaluation_seconds / self.placed_evaluation_seconds

    def report(self) -> dict:
        """What `tune.json` and the benchmark record: the measured seconds, both speedups and every trial."""
        return {"baseline_seconds": self.baseline_seconds, "final_seconds": self.final_seconds,
                "noise_seconds": self.noise_seconds, "speedup_per_iteration": self.speedup,
                "inline_evaluation_seconds": self.inline_evaluation_seconds,
                "placed_evaluation_seconds": self.placed_evaluation_seconds,
                "speedup_with_evaluations": self.speedup_with_evaluations,
                "tuning_seconds": self.tuning_seconds, "candidates_tried": len(self.trials),
                "candidates_kept": sum(t.kept for t in self.trials),
                "trials": [dataclasses.asdict(t) for t in self.trials]}


def measure_plan(config: TrainConfig, plan: Plan, iterations: int = 5, seed: Optional[int] = None,
                 sampler=None) -> list[float]:
    """Seconds per iteration of `plan`, each timed from dispatch to metrics on the host, after one
    warm-up iteration; helper processes (if any) run for real and are drained at the end. With a
    `sampler` (`GpuActivitySampler`), the timed window is marked `measure/start` .. `measure/end`,
    so SM activity can be read over it without the compilation."""
    executor = executor_for(config, plan)
    try:
        state = executor.init(jax.random.PRNGKey(config.run.seed if seed is None else seed))
        executor.compile(state)
        state, metrics = executor.step(state)
        jax.block_until_ready(metrics)
        seconds = []
        if sampler is not None:
            sampler.mark("measure/start")
        for _ in range(iterations):
            start = time.perf_counter()
            state, metrics = executor.step(state)
            jax.device_get(metrics)
            seconds.append(time.perf_counter() - start)
        if sampler is not None:
            sampler.mark("measure/end")
        if hasattr(executor, "drain"):
            executor.drain()
        return seconds
    finally:
        if hasattr(executor, "close"):
            executor.close()


def measure_with_evaluation(config: TrainConfig, plan: Plan, periods: int = 2) -> float:
    """Seconds per iteration of `plan` with its evaluation where the plan puts it, the evaluations' cost
    spread over the iterations: real training (`train`) for 1 + `periods` evaluation periods of the
    config's length, each period `iterations_per_eval` iterations then an evaluation. Timed as the
    benchmark times it: from the dispatch of the first iteration after the first period (which compiles)
    to the moment the last evaluation's result is in, so an evaluation process's final result is waited
    for. The config's own num_evals and total_env_steps are replaced; only its period length is kept."""
    import os
    import tempfile

    from jaxrose.config import replace
    from jaxrose.train import train

    k = config.iterations_per_eval
    steps = (periods + 1) * k * config.env_steps_per_iteration
    with tempfile.TemporaryDirectory(prefix="jaxrose-tune-eval-") as tmp:
        path = os.path.join(tmp, "plan.json")
        plan.save(path)
        run = replace(config, **{"run.total_env_steps": steps, "run.num_evals": periods + 2, "run.plan": path,
                                 "run.progress_bar": False, "run.tensorboard": False, "run.out_dir": tmp,
                                 "run.resume": None})
        result = train(run, write_outputs=False)
    start = result.iteration_start_times[k]
    end = max(e["done_time"] for e in result.evaluations)
    return (end - start) / (periods * k)


class Measurements:
    """Measurements shared by several `tune` calls on one config, e.g. an ablation's arms for one preset
    and seed: the sequential plan's two noise measurements, the stage profile and every candidate plan are
    measured once, and a later arm that meets the same plan reads that measurement instead of taking
    another. Each measurement is still a fresh executor (and helper processes) timed end to end; what is
    saved is repeating it. Arms then differ only where their switches lead them to different plans."""

    def __init__(self, config: TrainConfig):
        self.config = config
        # What is measured compiles through a persistent cache (see `tuning_compile_cache`)
        self._measured = _with_compile_cache(config)
        self._runs: dict[tuple, list] = {}  # (kind, plan, length) -> measurements taken so far
        self._profile = None
        self.taken = self.reused = 0

    def _first(self, key: tuple, count: int, take: Callable[[], Any]) -> list:
        runs = self._runs.setdefault(key, [])
        self.reused += min(count, len(runs))
        while len(runs) < count:
            runs.append(take())
            self.taken += 1
        return runs[:count]

    def runs(self, plan: Plan, iterations: int, count: int) -> list[list[float]]:
        """The first `count` measurements of `plan` (seconds per timed iteration), taking the missing ones."""
        return self._first(("iteration", plan.to_json(), iterations), count,
                           lambda: measure_plan(self._measured, plan, iterations))

    def evaluation_runs(self, plan: Plan, periods: int, count: int) -> list[float]:
        """The first `count` measurements of `plan` with its evaluation (`measure_with_evaluation`)."""
        return self._first(("evaluation", plan.to_json(), periods), count,
                           lambda: measure_with_evaluation(self._measured, plan, periods))

    def profile(self):
        if self._profile is None:
            self._profile = profile_program(default_executor_factory, self._measured, iterations=2)
            self.taken += 1
        else:
            self.reused += 1
        return self._profile


def default_compile_cache() -> str:
    """The persistent compile cache tuning uses when the run names none (`run.compile_cache`): one per user
    under the system's temporary folder, so it is reused by later tunings and cleared with that folder."""
    return os.path.join(tempfile.gettempdir(), f"jaxrose-compile-cache-{os.getuid()}")


def _with_compile_cache(config: TrainConfig) -> TrainConfig:
    """`config` naming the cache its measurements (and their worker processes) compile through: its own,
    else the one this process already uses, else `default_compile_cache()` (see `tuning_compile_cache`)."""
    from jaxrose.config import replace

    if config.run.compile_cache:
        return config
    return replace(config, **{"run.compile_cache": jax.config.jax_compilation_cache_dir or default_compile_cache()})


@contextlib.contextmanager
def tuning_compile_cache(config: TrainConfig) -> Iterator[str]:
    """Tuning compiles the same programs over and over: the noise runs, every candidate, the evaluation
    trials and their worker processes. Through a persistent compile cache the repeats are loads (on a 2-core
    CPU machine the bench's tiny tuning took 30.7 s instead of 56.9 s, BENCHMARKS.md)."""
    from jaxrose.train import reset_compile_cache, use_compile_cache

    if config.run.compile_cache:  # the run's: it stays this process's cache, as in `train`
        use_compile_cache(config.run.compile_cache)
        yield config.run.compile_cache
        return
    if jax.config.jax_compilation_cache_dir:  # the one this process already compiles through
        yield jax.config.jax_compilation_cache_dir
        return
    # Neither: `default_compile_cache()` for the tuning only, this process's previous setting restored after.
    previous = {name: getattr(jax.config, name)
                for name in ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")}
    folder = default_compile_cache()
    use_compile_cache(folder)
    try:
        yield folder
    finally:
        for name, value in previous.items():
            jax.config.update(name, value)
        reset_compile_cache()


def tune(config: TrainConfig, switches: Switches = Switches(), max_candidates: int = 4,
         iterations: int = 5, measurements: Optional[Measurements] = None, place_evaluation: bool = True,
         evaluation_periods: int = 2) -> TuneResult:
    """`measurements`: shared with other `tune` calls on the same config (see `Measurements`); by
    default this call measures everything itself. `place_evaluation`: try the evaluation in its own
    process (under the `overlap` switch), measured over `evaluation_periods` evaluation periods.
    Everything measured compiles through a persistent cache (`tuning_compile_cache`)."""
    if measurements is None:
        measurements = Measurements(config)
    elif measurements.config != config:
        raise ValueError("tune: `measurements` belongs to a different config; share one Measurements only "
                         "among tune calls on the same config (preset and seed).")
    with tuning_compile_cache(config):
        return _tune(config, switches, max_candidates, iterations, measurements, place_evaluation,
                     evaluation_periods)


def _tune(config: TrainConfig, switches: Switches, max_candidates: int, iterations: int,
          measurements: Measurements, place_evaluation: bool, evaluation_periods: int) -> TuneResult:
    start = time.perf_counter()
    reused_before = measurements.reused
    program = _program(config)
    graph = build_graph(program, ITERATION_INPUTS)
    current = sequential_plan(program)
    # Noise: the same plan measured twice; a change must beat the current plan by more than this.
    first, second = (statistics.median(run) for run in measurements.runs(current, iterations, 2))
    noise = abs(first - second)
    baseline = current_seconds = min(first, second)
    profile = measurements.profile()

    def measure(plan: Plan) -> float:
        return statistics.median(measurements.runs(plan, iterations, 1)[0])

    trials: list[Trial] = []
    candidates = [c for c in rank(current, program, graph, profile) if c.predicted_gain > 0 and _allowed(c, switches)]
    for candidate in candidates[:max_candidates]:
        if not switches.validate:
            current = candidate.plan
            trials.append(Trial(candidate.description, candidate.predicted_gain, None, True,
                                "kept on the model's prediction alone (validation off)"))
            break
        kept, seconds = _judge(measure, candidate.plan, candidate.description, candidate.predicted_gain,
                               current_seconds, noise, trials)
        if kept:
            current, current_seconds = candidate.plan, seconds
            break  # one structural change per round; the ranking changes once the plan does
    if switches.groups and not switches.validate:
        trials.append(Trial("spread the rollout over group processes", 0.0, None, False,
                            "skipped: with validation off only model predictions count, and none exists for it"))
    elif switches.groups:
        current, current_seconds = _tune_groups(config, measure, program, graph, current, current_seconds, noise,
                                                trials)
    if switches.restructure:
        current, current_seconds = _tune_loops(measure, program, current, current_seconds, noise, switches, trials)
    current, current_seconds = _tune_quotas(config, measure, current, current_seconds, noise, switches, trials)
    inline_seconds = placed_seconds = None
    if place_evaluation:
        def measure_evaluation(plan: Plan, count: int) -> list[float]:
            return measurements.evaluation_runs(plan, evaluation_periods, count)

        current, inline_seconds, placed_seconds = _tune_evaluation(config, measure_evaluation, current, switches,
                                                                   trials)
    return TuneResult(current, baseline, current_seconds, noise, trials, time.perf_counter() - start,
                      measurements_reused=measurements.reused - reused_before,
                      inline_evaluation_seconds=inline_seconds, placed_evaluation_seconds=placed_seconds)


Measure = Callable[[Plan], float]  # a plan's median seconds per iteration, measured end to end


def _judge(measure: Measure, plan: Plan, description: str, predicted_gain: float, current_seconds: float,
           noise: float, trials: list[Trial]) -> tuple[bool, float]:
    """Measures `plan` end to end and records the trial: kept only if faster than the current plan
    by more than the noise. Returns (kept, its median seconds per iteration)."""
    seconds = measure(plan)
    kept = seconds < current_seconds - noise
    trials.append(Trial(description, predicted_gain, seconds, kept,
                        f"{seconds * 1e3:.2f} ms vs {current_seconds * 1e3:.2f} ms ± {noise * 1e3:.2f} ms noise"))
    return kept, seconds


def _tune_groups(config: TrainConfig, measure: Measure, program, graph, plan: Plan, seconds: float, noise: float,
                 trials: list[Trial]) -> tuple[Plan, float]:
    """The rollout spread over 2 or 4 group processes (inference of one group beside simulation of
    another, under MPS). The planner's stage profile cannot predict this overlap (it happens inside
    the rollout loop), so each spread is judged by its end-to-end measurement alone. A spread plan
    runs every other chunk in the trainer, so it replaces the current plan rather than adding to it."""
    base = sequential_plan(program)
    for workers in (2, 4):
        if config.env.num_envs % workers:
            continue
        description = f"spread the rollout over {workers} group processes"
        try:
            candidate = spread_rollout(base, program, graph, tuple(f"group{i}" for i in range(workers)),
                                       config.env.num_envs)
            kept, measured = _judge(measure, candidate, description, 0.0, seconds, noise, trials)
        except (PlanError, ConfigError) as e:  # e.g. several devices or processes: recorded, not fatal
            trials.append(Trial(description, 0.0, None, False, f"illegal: {e}"))
            continue
        if kept:
            plan, seconds = candidate, measured
    return plan, seconds


def _tune_loops(measure: Measure, program, plan: Plan, seconds: float, noise: float, switches: Switches,
                trials: list[Trial]) -> tuple[Plan, float]:
    """Each loop nested in another (with a static length of at most 16 steps) unrolled: one device loop
    less, a longer body. The stage profile has no model of a loop's own cost, so the end-to-end
    measurement alone judges it."""
    names = [loop.name for loop in _nested_loops(program.body) if loop.length is not None and loop.length <= 16]
    for name in names:
        description = f"unroll loop {name}"
        if not switches.validate:
            trials.append(Trial(description, 0.0, None, False,
                                "skipped: with validation off only model predictions count, and none exists for it"))
            continue
        try:
            candidate = unroll_loop(plan, program, name)
        except PlanError as e:
            trials.append(Trial(description, 0.0, None, False, f"illegal: {e}"))
            continue
        kept, measured = _judge(measure, candidate, description, 0.0, seconds, noise, trials)
        if kept:
            plan, seconds = candidate, measured
    return plan, seconds


def _nested_loops(nodes, inside: bool = False) -> list[Loop]:
    found = []
    for node in nodes:
        if isinstance(node, Loop):
            found.extend(([node] if inside else []) + _nested_loops(node.body, inside=True))
    return found


def _program(config: TrainConfig):
    from jaxrose.sequential import SequentialExecutor

    return SequentialExecutor(config).program


def _allowed(candidate, switches: Switches) -> bool:
    if candidate.description.startswith("overlap"):
        return switches.overlap
    return switches.restructure


EvaluationMeasure = Callable[[Plan, int], list]  # `count` runs of a plan, seconds per iteration with evaluation


def _tune_evaluation(config: TrainConfig, measure: EvaluationMeasure, plan: Plan, switches: Switches,
                     trials: list[Trial]) -> tuple[Plan, Optional[float], Optional[float]]:
    """The evaluation in its own process, kept only if training with it, evaluations included, is faster
    than with the evaluation inline by more than the noise of two inline measurements. The planner's
    stage profile covers the iteration only, so there is no model prediction: with validation off it
    is not tried. Returns the chosen plan and its seconds per iteration with evaluations included, inline
    and as chosen (None, None when nothing was measured)."""
    description = "evaluation in its own process"
    if not switches.overlap:
        return plan, None, None
    if config.run.num_evals <= 1 or plan.evaluation != "inline" or config.run.eval_mode != "inline":
        reason = "no periodic evaluation" if config.run.num_evals <= 1 else "the run already evaluates in a process"
        trials.append(Trial(description, 0.0, None, False, f"skipped: {reason}"))
        return plan, None, None
    if not switches.validate:
        trials.append(Trial(description, 0.0, None, False,
                            "skipped: with validation off only model predictions count, and none exists for it"))
        return plan, None, None
    first, second = measure(plan, 2)
    candidate = evaluate_in_process(plan)
    seconds = measure(candidate, 1)[0]
    inline, noise = min(first, second), abs(first - second)
    kept = seconds < inline - noise
    trials.append(Trial(description, 0.0, seconds, kept,
                        f"{seconds * 1e3:.2f} ms vs {inline * 1e3:.2f} ms ± {noise * 1e3:.2f} ms noise per iteration, "
                        f"evaluations included"))
    return (candidate, inline, seconds) if kept else (plan, inline, inline)


def _tune_quotas(config, measure: Measure, plan: Plan, seconds: float, noise: float, switches: Switches,
                 trials: list[Trial]) -> tuple[Plan, float]:
    helpers = [p for p in plan.processes if p != MAIN]
    if not helpers or not switches.quotas:
        return plan, seconds
    reason = clients_unavailable_reason(config.run.use_mps)
    if reason is not None:  # a quota would be an unread variable: its "measurement" would be noise
        trials.append(Trial("SM quotas", 0.0, None, False, f"skipped: {reason}"))
        return plan, seconds
    # Group processes doing equal shares of the rollout are each on the critical path: capping one alone only
    # slows the iteration, while equal caps on all of them can split the SMs without idle ones. Tried first.
    groups = [p for p in plan.spread_chunk.group_processes if p in helpers] if plan.spread_chunk else []
    if len(groups) >= 2:
        for quota in sorted({q for q in (100 // len(groups), 50, 25) if q < 100}, reverse=True):
            candidate = plan
            for group in groups:
                candidate = with_quota(candidate, group, quota)
            kept, measured = _judge(measure, candidate, f"quota {quota}% for each of {', '.join(groups)}", 0.0,
                                    seconds, noise, trials)
            if kept:
                plan, seconds = candidate, measured
    # A helper with slack gives SMs up: try a few caps, largest first, keep what measures faster.
    for helper in helpers:
        for quota in (50, 25, 10):
            candidate = with_quota(plan, helper, quota)
            kept, measured = _judge(measure, candidate, f"quota {quota}% for {helper}", 0.0, seconds, noise,
                                    trials)
            if kept:
                plan, seconds = candidate, measured
    return plan, seconds


def main(args: list[str]) -> None:
    import argparse
    import json
    import os

    from jaxrose.presets import get_preset

    parser = argparse.ArgumentParser(prog="jaxrose tune", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="point-mass")
    parser.add_argument("--iterations", type=int, default=5, help="timed iterations per measurement")
    parser.add_argument("--max-candidates", type=int, default=4)
    parser.add_argument("--out", default=None, help="output folder (default: plans/<preset>)")
    parser.add_argument("--no-evaluation-placement", action="store_true",
                        help="do not try the evaluation in its own process (it trains a few evaluation periods)")
    names = [field.name for field in dataclasses.fields(Switches)]
    for name in names:
        parser.add_argument(f"--no-{name}", action="store_true", help=f"switch the {name} optimization off")
    options = parser.parse_args(args)
    from jaxrose.mps import prepare_clients

    prepare_clients({})  # attach this process to a private MPS daemon before its GPU starts, when possible
    switches = Switches(**{n: not getattr(options, f"no_{n}") for n in names})
    result = tune(get_preset(options.preset), switches, options.max_candidates, options.iterations,
                  place_evaluation=not options.no_evaluation_placement)
    out = options.out or os.path.join("plans", options.preset)
    os.makedirs(out, exist_ok=True)
    result.plan.save(os.path.join(out, "plan.json"))
    report = {"switches": dataclasses.asdict(switches), **result.report()}
    with open(os.path.join(out, "tune.json"), "w") as f:
        json.dump(report, f, indent=2)
    for trial in result.trials:
        print(f"{'kept   ' if trial.kept else 'dropped'} {trial.description}: {trial.reason}")
    print(f"iteration {result.baseline_seconds * 1e3:.2f} ms -> {result.final_seconds * 1e3:.2f} ms "
          f"({result.speedup:.3f}x, evaluations left out); {report['candidates_tried']} candidates tried, "
          f"{report['candidates_kept']} kept; tuning took {result.tuning_seconds:.1f} s")
    if result.speedup_with_evaluations is not None:
        print(f"with evaluations: {result.inline_evaluation_seconds * 1e3:.2f} ms per iteration inline -> "
              f"{result.placed_evaluation_seconds * 1e3:.2f} ms as placed ({result.speedup_with_evaluations:.3f}x)")
    print(f"plan: {os.path.join(out, 'plan.json')} (run it with --run.plan)")
