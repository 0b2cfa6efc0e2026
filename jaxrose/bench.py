"""`jaxrose bench`: brax PPO, the simulation-only ceiling and jaxrose, measured in one run.

Every system gets the same env, hyper-parameters, env-step budget and evaluation schedule (the
preset's, with optional overrides), as DESIGN.md's benchmark protocol asks. Steady state is what
follows the first training epoch (the epoch that compiles): the steady window of a system runs
from the end of its second evaluation to the end of its last one, so it holds evaluations too.

Reported per system: median steady steps/s over epochs or iterations, steady steps/s including
evaluations (steady env steps / steady wall time), compile time, evaluation time, final return,
and SM activity/occupancy over the steady window (NVML GPM; None without a GPU). Reported as
limits: the rollout ceiling (simulation alone, zero actions, same env count) and the synchronous
limit (that rollout time plus the learner update timed alone, per iteration). Per system with a
learning curve: the env steps and seconds (at its steady rate including evaluations, so compilation is
excluded) to a return threshold (`--return-threshold`, else the highest return every system reached),
and its evaluations' wall-clock times. Every ratio is the quotient of two values measured in this run
and names both. Settings after `--` are `jaxrose train`'s and apply to every system.

Outputs in --out: results.json (all raw numbers), results.md (tables), results.png (charts).
The brax baseline is `jaxrose.bench_brax`; the tables and charts are drawn by `jaxrose.bench_report`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
import warnings
from typing import Any, Callable, Optional

import numpy as np

from jaxrose.bench_brax import run_brax
from jaxrose.bench_report import SYSTEM_LABELS, append_record, is_finite_number, jsonable, plot_results, render_markdown
from jaxrose.provenance import git_state
from jaxrose.run_folder import set_aside, write_atomically

SYSTEMS = ("brax", "sim", "sequential", "overlapped", "spread", "tuned", "async")
CHILD_SYSTEMS = ("overlapped", "spread", "tuned", "async")  # run in processes of their own, beside this one
DEFAULT_SYSTEMS = tuple(s for s in SYSTEMS if s != "tuned")


# -- settings -------------------------------------------------------------------------------------


CHILD_TIMEOUT = 3600.0  # seconds: a system in its own process that runs longer is stopped (--child-timeout)


def _setting(default, help: str, parse: Callable = str):
    return dataclasses.field(default=default, metadata={"help": help, "parse": parse})


def _boolean(text: str) -> bool:
    if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() in ("true", "1", "yes")


def _comma_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _comma_ints(text: str) -> tuple[int, ...]:
    return tuple(int(item) for item in _comma_list(text))


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """What to benchmark; the command-line flags are generated from these fields."""

    preset: str = _setting("ant-mlp", "named workload from jaxrose.presets")
    total_env_steps: Optional[int] = _setting(None, "override the preset's env-step budget", int)
    num_evals: Optional[int] = _setting(None, "override the preset's number of evaluations (>= 3)", int)
    num_eval_envs: Optional[int] = _setting(None, "override the preset's evaluation env count", int)
    systems: tuple[str, ...] = _setting(DEFAULT_SYSTEMS, "comma list from: " + ",".join(SYSTEMS) + " (tuned runs "
                                        "`jaxrose tune` first, so it is asked for by name)", _comma_list)
    spread_processes: int = _setting(2, "group processes of the `spread` system (one env group each)", int)
    tune_iterations: int = _setting(5, "iterations per measurement in the `tuned` system's `jaxrose tune`", int)
    tune_max_candidates: int = _setting(
        4, "planner candidates the `tuned` system's `jaxrose tune` measures at most per round (its "
           "max_candidates); fewer shortens the tuning", int)
    tune_groups: bool = _setting(True, "whether the `tuned` system's `jaxrose tune` tries spreading the rollout over "
                                       "group processes (the `groups` switch)", _boolean)
    tune_evaluation_placement: bool = _setting(
        True, "whether the `tuned` system's `jaxrose tune` tries the evaluation in its own process (three short "
              "trainings over whole evaluation periods)", _boolean)
    tuned_plan: Optional[str] = _setting(
        None, "a saved plan (from `jaxrose tune`, `jaxrose ablate`'s plans.json entry or Plan.save) for the `tuned` "
              "system, which then trains with it without tuning in this run (default: tune first)")
    eval_sm_percentage: Optional[int] = _setting(
        None, "SM quota (%%) of the evaluation process in the overlapped, spread and async systems: evaluation has a "
              "whole evaluation period of slack, so it can give SMs to training (None: no cap)", int)
    async_group_levels: tuple[int, ...] = _setting(
        (), "the `async` system with its resource manager on, free to move each actor's batch among these env "
            "group counts (comma list; must include the starting env.num_groups / run.actors), as EBRL grows batch "
            "sizes where the GPU has room (default: manager off, batch sizes fixed)", _comma_ints)
    return_threshold: Optional[float] = _setting(
        None, "evaluation return for the time-to-threshold comparison (default: the highest return every "
              "system reached)", float)
    budget_scales: tuple[str, ...] = _setting(
        (), "SYSTEM=FACTOR comma list: those systems train FACTOR x the env-step budget, evaluating at the same env "
            "steps as the others (FACTOR x (num_evals - 1) must be whole), so that a system which learns less per env "
            "step but runs faster still gets a time to the return threshold (e.g. async=1.6)", _comma_list)
    repeats: int = _setting(10, "timed repeats of the simulation-only ceiling and of the learner update", int)
    child_timeout: float = _setting(CHILD_TIMEOUT, "seconds a system run in its own process (overlapped, spread, "
                                                   "tuned, async) may take before it is stopped and recorded as "
                                                   "failed", float)
    out: Optional[str] = _setting(None, "output folder (default: bench_results/<preset>)")
    train_args: tuple[str, ...] = _setting((), "`jaxrose train` settings applied to the preset for every system, "
                                               "given after `--` (e.g. -- --run.actors 1 --env.num-envs 1024)")
    record: Optional[str] = _setting(None, "markdown file to append a results section to, e.g. BENCHMARKS.md")

    def __post_init__(self):
        from jaxrose.config import ConfigError

        unknown = sorted(set(self.systems) - set(SYSTEMS))
        if unknown or not self.systems:
            raise ConfigError(f"--systems must be a non-empty comma list from {','.join(SYSTEMS)}; "
                              f"got {','.join(self.systems) or 'nothing'} (unknown: {','.join(unknown)}).")
        if self.child_timeout <= 0:
            raise ConfigError(f"--child-timeout must be a positive number of seconds, got {self.child_timeout}.")
        if self.repeats < 1:
            raise ConfigError(f"--repeats must be >= 1, got {self.repeats}.")
        if self.tune_max_candidates < 0:
            raise ConfigError(f"--tune-max-candidates must be >= 0, got {self.tune_max_candidates}.")
        if self.tuned_plan is not None and not os.path.isfile(self.tuned_plan):
            raise ConfigError(f"--tuned-plan {self.tuned_plan!r} is not a file; give a plan saved by `jaxrose tune` "
                              f"(plans/<preset>/plan.json) or leave it out to tune in the run.")
        self.scales  # each SYSTEM=FACTOR item parses and names a training system
        if self.num_evals is not None and self.num_evals < 3:
            raise ConfigError(f"--num-evals must be >= 3 (the initial evaluation, the compile epoch and at "
                              f"least one steady epoch), got {self.num_evals}; raise it.")

    @property
    def out_dir(self) -> str:
        return self.out or os.path.join("bench_results", self.preset)

    @property
    def scales(self) -> dict[str, float]:
        """--budget-scales as {system: factor}."""
        from jaxrose.config import ConfigError

        scales = {}
        for item in self.budget_scales:
            name, _, factor = item.partition("=")
            try:
                scales[name.strip()] = float(factor)
            except ValueError:
                raise ConfigError(f"--budget-scales items are SYSTEM=FACTOR (e.g. async=1.6), got {item!r}.") from None
        for name, factor in scales.items():
            if name not in SYSTEMS or name == "sim":
                raise ConfigError(f"--budget-scales names {name!r}, not a training system: use one of "
                                  f"{','.join(s for s in SYSTEMS if s != 'sim')} (sim has no training budget).")
            if not (math.isfinite(factor) and factor > 0):
                raise ConfigError(f"--budget-scales {name}={factor}: the factor must be a positive number.")
        return scales


def parse_args(args: list[str]) -> BenchConfig:
    """Bench flags, then optionally `--` and `jaxrose train` settings (parsed by the same tyro CLI)."""
    args = list(args)
    train_args = tuple(args[args.index("--") + 1:]) if "--" in args else ()
    args = args[:args.index("--")] if "--" in args else args
    parser = argparse.ArgumentParser(prog="jaxrose bench", description=__doc__.split("\n\n")[0],
                                     epilog="Settings after `--` are `jaxrose train`'s (see jaxrose train --help).")
    for field in dataclasses.fields(BenchConfig):
        if field.name == "train_args":
            continue
        default = field.default if not isinstance(field.default, tuple) else ",".join(map(str, field.default))
        parser.add_argument("--" + field.name.replace("_", "-"), dest=field.name, type=field.metadata["parse"],
                            default=field.default, help=f"{field.metadata['help']} (default: {default})")
    return BenchConfig(**vars(parser.parse_args(args)), train_args=train_args)


def train_config(bench: BenchConfig):
    """The preset with the bench's overrides; jaxrose's own outputs and progress bar are off, and
    evaluation runs inline, between iterations, on brax's schedule (the sequential reference)."""
    from jaxrose.config import ConfigError, TrainConfig, replace
    from jaxrose.presets import get_preset

    config = get_preset(bench.preset)
    if bench.train_args:  # `jaxrose train`'s own parser: one definition per setting
        import tyro

        config = tyro.cli(TrainConfig, default=config, args=list(bench.train_args),
                          prog=f"jaxrose bench --preset {bench.preset} --")
    overrides = {"run.progress_bar": False, "run.tensorboard": False, "run.eval_mode": "inline"}
    for name in ("total_env_steps", "num_evals", "num_eval_envs", "eval_sm_percentage"):
        if getattr(bench, name) is not None:
            overrides[f"run.{name}"] = getattr(bench, name)
    config = replace(config, **overrides)
    if config.run.num_evals < 3:
        raise ConfigError(f"Preset {bench.preset!r} has run.num_evals={config.run.num_evals}; the bench needs >= 3 "
                          f"to have a steady window. Pass --num-evals 3 or more.")
    return config


def system_config(config, bench: BenchConfig, system: str):
    """The config `system` trains with: the bench's, or, scaled by --budget-scales, the same schedule
    over more (or fewer) evaluation periods: every period keeps its iterations, so the system's
    evaluations fall at the same env steps as the others' and go on past them."""
    from jaxrose.config import ConfigError, replace

    factor = bench.scales.get(system)
    if factor is None or factor == 1:
        return config
    periods = config.run.num_evals - 1
    scaled = periods * factor
    if abs(scaled - round(scaled)) > 1e-6 or round(scaled) < 2:
        whole = ", ".join(f"{k / periods:g}" for k in range(2, 3 * periods + 1) if k != periods)
        raise ConfigError(f"--budget-scales {system}={factor:g} gives {scaled:g} evaluation periods; with "
                          f"{config.run.num_evals} evaluations ({periods} periods after the initial one) the factor "
                          f"must make a whole number of at least 2: one of {whole}, or change --num-evals.")
    periods = round(scaled)
    return replace(config, **{"run.total_env_steps": config.iterations_per_eval * periods
                              * config.env_steps_per_iteration, "run.num_evals": periods + 1})


# -- simulation-only ceiling ----------------------------------------------------------------------


def run_sim_ceiling(config, repeats: int, sampler) -> dict:
    """Steps the training-wrapped env for one iteration's worth of steps per call, with zero actions
    (DESIGN.md's trivial policy: the rollout ceiling) and again with uniform random actions in
    [-1, 1] (`random_actions`): MJX's solver iterates until it converges, so a step costs more when
    the actions move the robot, as an untrained policy's do (measured on the H200: pusher 3.2x).
    The env is the run's: randomized per env when the preset asks (the same models as training)."""
    zero = _sim_rollout(config, repeats, sampler, random_actions=False)
    zero["random_actions"] = _sim_rollout(config, repeats, sampler, random_actions=True)
    return zero


# Calls beyond `repeats` until the timed window spans this many sampling intervals: a classic-control
# call takes milliseconds, shorter than one 100 ms GPM sample, and would get no SM figure.
MIN_SAMPLES_PER_WINDOW = 5


def _sim_rollout(config, repeats: int, sampler, random_actions: bool) -> dict:
    import jax
    import jax.numpy as jnp

    import envs
    from envs.randomization import randomize
    from envs.wrappers import wrap_for_training

    # The run's env less the policy's observation history (`sequential.make_env` adds it): env stepping only.
    env = randomize(envs.make(config.env.name), config.env.randomize)
    train_env = wrap_for_training(env, config.env.episode_length, 1, config.env.num_envs)
    steps = config.unrolls_per_iteration * config.ppo.unroll_length
    shape = train_env.batch_shape + (env.action_size,)

    def rollout(state, key):
        def step(carry, _):
            state, key = carry
            key, action_key = jax.random.split(key)
            action = (jax.random.uniform(action_key, shape, minval=-1.0, maxval=1.0) if random_actions
                      else jnp.zeros(shape))
            return (train_env.step(state, action), key), None

        return jax.lax.scan(step, (state, key), None, length=steps)[0]

    carry = jax.block_until_ready((jax.jit(train_env.reset)(jax.random.PRNGKey(config.run.seed)),
                                   jax.random.PRNGKey(config.run.seed + 1)))
    start = time.perf_counter()
    compiled = jax.jit(rollout, donate_argnums=0).lower(*carry).compile()
    compile_seconds = time.perf_counter() - start
    carry = jax.block_until_ready(compiled(*carry))  # warm-up: first-run allocations stay out of the timing

    label = "sim_random" if random_actions else "sim"
    t0 = sampler.mark(f"{label}/steady_start")
    seconds = []
    min_window = MIN_SAMPLES_PER_WINDOW * sampler.interval_s if sampler.available else 0.0
    while len(seconds) < repeats or sum(seconds) < min_window:
        start = time.perf_counter()
        carry = jax.block_until_ready(compiled(*carry))
        seconds.append(time.perf_counter() - start)
    t1 = sampler.mark(f"{label}/steady_end")
    env_steps = config.env_steps_per_iteration
    sps = [env_steps / s for s in seconds]
    return {"status": "ok", "actions": "uniform random in [-1, 1]" if random_actions else "zero",
            "env_steps_per_call": env_steps, "scan_length": steps, "call_seconds": seconds,
            "call_sps": sps, "steady_sps": statistics.median(sps), "median_call_seconds": statistics.median(seconds),
            "compile_seconds": compile_seconds, "window": [t0, t1], "sm": sampler.mean(t0, t1)}


# -- jaxrose sequential ---------------------------------------------------------------------------


def steady_skip(config) -> int:
    """Iterations left out of the steady median: the first evaluation period, and at least 2."""
    return min(max(config.iterations_per_eval, 2), config.num_iterations - 1)


class _LiveProgress:
    """A train callback that keeps each iteration's time and each evaluation as they come: what a run cut
    short (a time limit's SIGTERM) had measured, which the TrainResult of a finished run would hold."""

    def __init__(self):
        self.iteration_seconds: list[float] = []
        self.compile_seconds: Optional[float] = None
        self.evaluations: list[tuple[int, float]] = []  # (env steps, return)

    def __call__(self, step: int, metrics) -> None:
        if "perf/iteration_seconds" in metrics:
            self.iteration_seconds.append(float(metrics["perf/iteration_seconds"]))
        if "perf/compile_seconds" in metrics:
            self.compile_seconds = float(metrics["perf/compile_seconds"])
        if "eval/episode_return" in metrics:
            self.evaluations.append((int(step), float(metrics["eval/episode_return"])))

    def summary(self, config) -> dict:
        """The measurements so far. `median_sps` covers the iterations from `median_from_iteration` on: the
        steady window's start when the run got past it, else every iteration after the first."""
        n = len(self.iteration_seconds)
        done = {"iterations_done": n, "iteration_seconds": self.iteration_seconds,
                "compile_seconds": self.compile_seconds, "eval_env_steps": [s for s, _ in self.evaluations],
                "eval_returns": [r for _, r in self.evaluations]}
        if n >= 2:
            reached = n > steady_skip(config)
            first = steady_skip(config) if reached else 1  # the first iteration may still be warming up
            steps = config.env_steps_per_iteration
            done.update(median_sps=statistics.median(steps / s for s in self.iteration_seconds[first:]),
                        median_from_iteration=first + 1, steady_window_reached=reached)
        return done


def run_sequential(config, sampler, live: Optional[_LiveProgress] = None) -> tuple[dict, Any]:
    """jaxrose through `train`; returns the summary and the TrainResult. `live` sees each iteration's
    metrics as they come, so that an interruption still has them.

    The steady window runs from the dispatch of the first steady iteration to the moment the last
    evaluation's result is in: for inline evaluation that is brax's window (end of the second
    evaluation to end of the last); for evaluation in another process it also charges the wait for
    the final evaluation, which training can no longer hide.
    """
    from jaxrose.train import train

    start = time.perf_counter()
    with warnings.catch_warnings():
        # Every system gets the bench's train settings: the asynchronous mode's do nothing here, by design.
        warnings.filterwarnings("ignore", message=".*has no effect in a synchronous run")
        result = train(config, callbacks=[live] if live is not None else [], write_outputs=False)
    total = time.perf_counter() - start

    steps = config.env_steps_per_iteration
    iteration_sps = [steps / s for s in result.iteration_seconds]
    skip = steady_skip(config)
    evals = result.evaluations
    t0, t1 = result.iteration_start_times[skip], max(e["done_time"] for e in evals)
    steady_steps = (config.num_iterations - skip) * steps
    summary = {
        "steady_sps": statistics.median(iteration_sps[skip:]),
        "steady_env_steps": steady_steps,
        "steady_wall_seconds": t1 - t0,
        "steady_sps_with_evals": steady_steps / (t1 - t0),
        "window": [t0, t1],
        "sm": sampler.mean(t0, t1),
    }
    summary.update(
        status="ok", total_wall_seconds=total, seconds_to_steady=t0 - start, steady_skip_iterations=skip,
        iteration_seconds=list(result.iteration_seconds), iteration_sps=iteration_sps,
        compile_seconds=result.compile_seconds,
        eval_seconds=[e["eval/walltime"] for e in evals], eval_returns=[e["eval/episode_return"] for e in evals],
        eval_env_steps=[e["env_steps"] for e in evals], final_return=result.final_return,
        # Wall clock from the call's start: learning curves against time, and time to a return threshold.
        eval_done_seconds=[e["done_time"] - start for e in evals],
        iteration_start_seconds=[t - start for t in result.iteration_start_times],
    )
    if any("eval/success_rate" in e for e in evals):  # tasks with a success metric (arm_push)
        summary["eval_success_rates"] = [e.get("eval/success_rate") for e in evals]
    return summary, result


# -- jaxrose with evaluation overlapped in a second process -----------------------------------------


class _ClockOnlySampler:
    """Stands in for the GPU sampler in a child process: marks are perf_counter readings (the same
    system-wide monotonic clock as the parent's), and the parent averages SM activity itself."""

    available = False

    def mark(self, label: str) -> float:
        return time.perf_counter()

    def mean(self, t0=None, t1=None):
        return None


def run_overlapped(config, sampler, timeout: float = CHILD_TIMEOUT) -> dict:
    """The sequential executor with evaluation in a separate process (under MPS on a GPU), run in a
    fresh Python process: the trainer must join MPS before it initialises its GPU, which this
    bench process has already done."""
    from jaxrose.config import replace

    return _run_in_child("_overlapped_child", replace(config, **{"run.eval_mode": "process"}), sampler, timeout=timeout)


def run_spread(config, sampler, processes: int, timeout: float = CHILD_TIMEOUT) -> dict:
    """The hand-chosen multi-process plan: the rollout spread over `processes` group processes (one
    env group each, concurrent under MPS), the learner in the trainer, evaluation in its own process."""
    import tempfile

    from jaxrose.config import replace
    from jaxrose.graph import build_graph
    from jaxrose.plan import sequential_plan, spread_rollout
    from jaxrose.ppo_program import ITERATION_INPUTS
    from jaxrose.sequential import SequentialExecutor

    program = SequentialExecutor(config).program
    plan = spread_rollout(sequential_plan(program), program, build_graph(program, ITERATION_INPUTS),
                          tuple(f"group{i}" for i in range(processes)), config.env.num_envs)
    with tempfile.TemporaryDirectory(prefix="jaxrose-plan-") as tmp:
        path = os.path.join(tmp, "plan.json")
        plan.save(path)
        summary = _run_in_child("_overlapped_child", replace(config, **{"run.eval_mode": "process", "run.plan": path}),
                                sampler, timeout=timeout)
    summary["plan"] = str(plan)
    return summary


def run_tuned(config, sampler, tune_iterations: int, groups: bool = True, plan_path: Optional[str] = None,
              max_candidates: int = 4, place_evaluation: bool = True, timeout: float = CHILD_TIMEOUT) -> dict:
    """`jaxrose tune` with every switch on, then training with the plan it kept, evaluation where that plan
    puts it (tune tries it in its own process and keeps that only if it measures faster), all in one fresh
    process (it joins MPS before its GPU starts). The summary carries the tuning time and every candidate
    tried, kept or not; the steady window excludes the tuning. With `plan_path` (a plan tuned earlier) it
    trains with that plan and tunes nothing. `max_candidates` is tune's limit on the planner candidates
    measured per round; `place_evaluation` false keeps the evaluation inline without trying it."""
    return _run_in_child("_tuned_child", config, sampler,
                         extra=(tune_iterations, groups, plan_path and os.path.abspath(plan_path), max_candidates,
                                place_evaluation), timeout=timeout)


def _tuned_child(config_path: str, summary_path: str, tune_iterations: int, groups: bool,
                 plan_path: Optional[str] = None, max_candidates: int = 4, place_evaluation: bool = True) -> None:
    import pickle
    import tempfile

    from jaxrose.config import replace
    from jaxrose.mps import prepare_clients

    with open(config_path, "rb") as f:
        config = pickle.load(f)
    prepare_clients({}, config.run.use_mps, config.run.compile_cache)  # before this process's GPU starts
    with tempfile.TemporaryDirectory(prefix="jaxrose-tuned-") as tmp:
        if plan_path is not None:  # tuned earlier: train with it, tune nothing here
            from jaxrose.plan import Plan

            plan = Plan.load(plan_path)
            tuning = {"plan_file": plan_path, "tuning_seconds": None, "history": list(plan.history)}
        else:
            from jaxrose.tune import Switches, tune

            tuned = tune(config, Switches(groups=groups), max_candidates, iterations=tune_iterations,
                         place_evaluation=place_evaluation)
            plan, plan_path = tuned.plan, os.path.join(tmp, "plan.json")
            plan.save(plan_path)
            tuning = {"tuning_seconds": tuned.tuning_seconds, "iterations_per_measurement": tune_iterations,
                      "max_candidates": max_candidates, "evaluation_placement_tried": place_evaluation,
                      "switches": dataclasses.asdict(Switches(groups=groups)), **tuned.report()}
        summary, result = run_sequential(replace(config, **{"run.plan": plan_path}), _ClockOnlySampler())
    summary.update(eval_worker=result.eval_worker, plan=str(plan), tuning=tuning)
    with open(summary_path, "w") as f:
        json.dump(jsonable(summary), f)


def run_async(config, sampler, group_levels: tuple[int, ...] = (), timeout: float = CHILD_TIMEOUT) -> dict:
    """The asynchronous mode (actor processes, evaluation in its own process), in a fresh process.
    A preset laid out as fewer groups than actors is regrouped as one group per actor. With
    `group_levels`, its resource manager runs and may move each actor's batch among those sizes."""
    from jaxrose.config import replace

    changes = {"run.mode": "async"}
    if config.env.num_groups % config.run.actors:
        changes["env.num_groups"] = config.run.actors
    if group_levels:
        changes.update({"run.resources.manager": "on", "run.resources.group_levels": tuple(group_levels)})
    return _run_in_child("_async_child", replace(config, **changes), sampler, timeout=timeout)


def share_gpu_memory_with_children(systems: tuple[str, ...]) -> bool:
    """Stops this process from taking 75% of the GPU's memory at its first JAX call (XLA's default) when a
    system runs in child processes: measured on the H200, pusher-transformer's async learner needs a 17 GiB
    buffer and failed beside a parent that had preallocated. A user's own XLA_PYTHON_CLIENT_PREALLOCATE or
    XLA_PYTHON_CLIENT_MEM_FRACTION is kept. Must run before JAX's first device use; returns whether it changed
    the setting."""
    if not set(systems) & set(CHILD_SYSTEMS):
        return False
    if "XLA_PYTHON_CLIENT_PREALLOCATE" in os.environ or "XLA_PYTHON_CLIENT_MEM_FRACTION" in os.environ:
        return False
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return True


def _run_in_child(child: str, config, sampler, extra: tuple = (), timeout: float = CHILD_TIMEOUT) -> dict:
    import pickle
    import tempfile

    with tempfile.TemporaryDirectory(prefix="jaxrose-bench-") as tmp:
        config_path, summary_path = os.path.join(tmp, "config.pkl"), os.path.join(tmp, "summary.json")
        with open(config_path, "wb") as f:
            pickle.dump(config, f)
        # This process already holds most of the GPU's memory; the child allocates on demand.
        env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        arguments = ", ".join(repr(a) for a in (config_path, summary_path, *extra))
        code = f"from jaxrose.bench import {child}; {child}({arguments})"
        try:
            subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the system's process ran past --child-timeout ({timeout:.0f} s) and was stopped; "
                               f"raise --child-timeout or lower --total-env-steps") from None
        except subprocess.CalledProcessError as error:
            raise RuntimeError(f"the system's process failed (exit code {error.returncode}); its own error is "
                               f"printed above") from None
        with open(summary_path) as f:
            summary = json.load(f)
    summary["sm"] = sampler.mean(*summary["window"])
    return summary


def _overlapped_child(config_path: str, summary_path: str) -> None:
    import pickle

    with open(config_path, "rb") as f:
        config = pickle.load(f)
    summary, result = run_sequential(config, _ClockOnlySampler())
    summary["eval_worker"] = result.eval_worker
    with open(summary_path, "w") as f:
        json.dump(jsonable(summary), f)


def _async_child(config_path: str, summary_path: str) -> None:
    """Steady window: from the first update after the first evaluation period to the last evaluation's
    result, as for the synchronous systems (`steady_sps_with_evals`); `steady_sps` is the same env
    steps over the steady updates alone (the rollout throughput the learner consumed, before the wait
    for the final evaluation); plus the asynchronous mode's own rates and lags (`whole_run_*` from
    the run's start, compilation included)."""
    import pickle

    import jax

    from jaxrose.train import train

    with open(config_path, "rb") as f:
        config = pickle.load(f)
    start = time.perf_counter()
    result = train(config, write_outputs=False)
    total = time.perf_counter() - start
    run = result.async_result
    first_period = config.iterations_per_eval * config.env_steps_per_iteration
    evals = result.evaluations
    # Each update's own consumed env steps (updates differ in size when batches grow): never an average.
    first_steady, before = async_steady_start(result.iteration_env_steps, run.learner_step_updates, first_period)
    t0, t1 = result.iteration_start_times[first_steady], max(e["done_time"] for e in evals)
    steady_steps = run.env_steps - before
    updates_end = result.iteration_start_times[-1] + result.iteration_seconds[-1]
    first_learner_step = first_steady_step(run.learner_step_updates, first_steady)
    summary = {
        "status": "ok", "steady_sps": steady_steps / (updates_end - t0),
        "steady_sps_with_evals": steady_steps / (t1 - t0), "steady_env_steps": steady_steps,
        "steady_update_seconds": updates_end - t0, "steady_wall_seconds": t1 - t0, "window": [t0, t1],
        "whole_run_rollout_sps": run.rollout_sps, "whole_run_updates_per_second": run.updates_per_second,
        "policy_lags": run.lags, "queue_depths": run.queue_depths, "rollouts_per_actor": run.rollouts_per_actor,
        "compile_seconds": result.compile_seconds, "total_wall_seconds": total, "seconds_to_steady": t0 - start,
        "eval_seconds": [e["eval/walltime"] for e in evals], "eval_returns": [e["eval/episode_return"] for e in evals],
        "eval_env_steps": [e["env_steps"] for e in evals], "final_return": result.final_return,
        "eval_worker": result.eval_worker, "eval_done_seconds": [e["done_time"] - start for e in evals],
        "update_start_seconds": [t - start for t in result.iteration_start_times],
        "update_seconds": list(result.iteration_seconds), "update_env_steps": list(result.iteration_env_steps),
        "first_steady_update": first_steady, "hand_offs": run.hand_offs,
        # The simulation ceiling steps env.num_envs: the same count only if every actor kept its share.
        "envs_as_ceiling": all(groups == config.env.num_groups // config.run.actors for _, groups in run.trajectory_groups),
        "run_ahead": run.run_ahead, "transport": run.transport,
        # Where the steady time goes: each actor's rollout (its own clock, first rollouts with their compile
        # left out) against the learner's busy and waiting time per steady update.
        "actor_rollout_seconds": run.actor_rollout_seconds,
        "median_actor_rollout_seconds": {i: statistics.median(t[2:]) for i, t in run.actor_rollout_seconds.items()
                                         if len(t) > 2},
        "learner_busy_seconds": run.learner_busy_seconds, "learner_wait_seconds": run.learner_wait_seconds,
        "learner_step_updates": run.learner_step_updates,
        "median_steady_learner_busy_seconds": _median_or_none(run.learner_busy_seconds[first_learner_step:]),
        "median_steady_learner_wait_seconds": _median_or_none(run.learner_wait_seconds[first_learner_step:]),
        "learner_sm_count": getattr(jax.devices()[0], "core_count", None),  # its MPS quota, as the learner sees it
        "resource_manager": config.run.resources.manager, "resource_decisions": run.resource_decisions,
        "precompiled": run.precompiled,
        "lag_dropped": run.lag_dropped,
        "actor_timing": run.actor_timing,
        "median_actor_timing": {i: {part: _median_or_none([t[part] for t in ts[2:] if t.get(part) is not None])
                                    for part in ("collect", "hand_off", "idle_before")}
                                for i, ts in run.actor_timing.items()},
    }
    with open(summary_path, "w") as f:
        json.dump(jsonable(summary), f)


def async_steady_start(update_env_steps: list[int], step_updates: list[int], first_period: int) -> tuple[int, int]:
    """Where the asynchronous steady window starts: the first update that opens a learner step (a step may
    hold several updates) with at least `first_period` env steps consumed before it. Returns its index and
    the env steps consumed before it, from each update's cumulative count `update_env_steps`; the last
    step's first update when none qualifies."""
    before = [0, *update_env_steps[:-1]]
    step_starts = [0, *step_updates[:-1]] if step_updates else [0]
    starts = [s for s in step_starts if s < len(before)] or [0]
    first = next((s for s in starts if before[s] >= first_period), starts[-1])
    return first, before[first] if before else 0


def first_steady_step(step_updates: list[int], first_steady_update: int) -> int:
    """The first asynchronous learner step whose updates all lie in the steady window, from each step's
    cumulative update count (a step may hold several updates: grow_keeps='update_size')."""
    step_starts = [0] + list(step_updates[:-1])
    return next((step for step, start in enumerate(step_starts) if start >= first_steady_update), len(step_updates))


def _median_or_none(values: list[float]) -> Optional[float]:
    return statistics.median(values) if values else None


# -- the synchronous limit ------------------------------------------------------------------------


def time_learner_update(config, repeats: int, executor=None, state=None) -> dict:
    """Median seconds of one jitted learner update (all epochs and minibatches) on a collected batch."""
    import jax

    from jaxrose.sequential import SequentialExecutor

    executor = executor or SequentialExecutor(config)
    state = state if state is not None else executor.init(jax.random.PRNGKey(config.run.seed))
    learner = state.learner
    _, batch, _ = jax.jit(executor.collect)(learner.params, learner.normalizer, state.env_state,
                                            jax.random.PRNGKey(config.run.seed + 1))
    update = jax.jit(executor.learner.update).lower(learner, batch).compile()
    jax.block_until_ready(update(learner, batch))  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(update(learner, batch))
        seconds.append(time.perf_counter() - start)
    return {"update_seconds": seconds, "median_update_seconds": statistics.median(seconds)}


def compute_limits(config, sim: Optional[dict], update: Optional[dict]) -> dict:
    """DESIGN.md's two limits, from the measured rollout and learner-update times."""
    if not sim or sim.get("status") != "ok" or not update:
        return {}
    rollout_seconds = sim["median_call_seconds"]
    train_seconds = update["median_update_seconds"]
    limits = {
        "env_steps_per_iteration": config.env_steps_per_iteration,
        "rollout_ceiling_sps": sim["steady_sps"],
        "rollout_seconds_at_ceiling": rollout_seconds,
        "training_seconds_alone": train_seconds,
        "training_update_seconds": update["update_seconds"],
        "synchronous_limit_sps": config.env_steps_per_iteration / (rollout_seconds + train_seconds),
    }
    moving = sim.get("random_actions", {})
    if moving.get("status") == "ok":  # the same limits with the solver working as in training
        limits["rollout_ceiling_random_actions_sps"] = moving["steady_sps"]
        limits["rollout_seconds_random_actions"] = moving["median_call_seconds"]
        limits["synchronous_limit_random_actions_sps"] = config.env_steps_per_iteration / (
            moving["median_call_seconds"] + train_seconds)
    return limits


# -- time to a return threshold -------------------------------------------------------------------


def time_to_threshold(systems: dict, threshold: Optional[float] = None) -> dict:
    """Adds `steps_to_threshold` (env steps of the first evaluation after training began at or above
    the threshold) and `seconds_to_threshold` (those steps at the system's steady rate including
    evaluations: wall clock with compilation excluded) to every system with a learning curve; returns
    the threshold used. Without one stated, it is the highest return every system reached after
    training began, so each has a time. A stated threshold some system did not reach leaves it no
    time; the times to that highest common return are then added too (`common_threshold_times`,
    the return under `common_return`), so the systems can still be compared."""
    def times(summary, threshold):  # env steps, seconds at steady rate, measured, interpolated; None: not reached
        reached = [steps for steps, r in trained_evaluations(summary) if r >= threshold]
        if not reached:
            return None, None, None, None
        rate = summary.get("steady_sps_with_evals")
        return (reached[0], reached[0] / rate if is_finite_number(rate) and rate > 0 else None,
                _wall_seconds_to(summary, reached[0]), interpolated_wall_seconds(summary, threshold))

    curves = {name: s for name, s in systems.items() if s.get("status") == "ok" and trained_evaluations(s)}
    if not curves:
        return {}
    common = highest_common_return(curves.values())
    stated = threshold is not None
    threshold = threshold if stated else common
    for summary in curves.values():
        summary.pop("common_threshold_times", None)
        (summary["steps_to_threshold"], summary["seconds_to_threshold"], summary["wall_seconds_to_threshold"],
         summary["interpolated_wall_seconds_to_threshold"]) = times(summary, threshold)
    used = {"return": threshold, "stated": stated}
    if any(s["steps_to_threshold"] is None for s in curves.values()):
        used["common_return"] = common
        for summary in curves.values():
            keys = ("steps", "seconds", "wall_seconds", "interpolated_wall_seconds")
            summary["common_threshold_times"] = dict(zip(keys, times(summary, common)))
    return used


def trained_evaluations(summary: dict) -> list[tuple[int, float]]:
    """(env steps, return) of the evaluations after the first update: the one before training,
    however high, reached nothing."""
    return [(steps, r) for steps, r in zip(summary.get("eval_env_steps", ()), summary.get("eval_returns", ()))
            if steps > 0 and is_finite_number(r)]


def highest_common_return(summaries) -> float:
    """The highest return every one of `summaries` (each with trained evaluations) reached after
    training began: the default threshold, so that each has a time to it."""
    return min(max(r for _, r in trained_evaluations(s)) for s in summaries)


def _wall_seconds_to(summary: dict, steps: int) -> Optional[float]:
    """Measured wall clock from the start of training to the end of the first evaluation at `steps`,
    less the start-up compilation: the first iteration's (epoch's, update's) time beyond the median
    one's. Everything else counts, compilations mid-run included (e.g. at a batch resize). Training
    starts at the first iteration (update); brax's, after its evaluation before training."""
    done = dict(zip(summary.get("eval_env_steps", ()), summary.get("eval_done_seconds", ())))
    if steps not in done:
        return None
    starts = summary.get("iteration_start_seconds") or summary.get("update_start_seconds")
    times = summary.get("iteration_seconds") or summary.get("update_seconds")
    if summary.get("learner_busy_seconds") and summary.get("learner_wait_seconds"):
        # The async learner's steps (one may hold several updates: grow_keeps='update_size').
        times = [b + w for b, w in zip(summary["learner_busy_seconds"], summary["learner_wait_seconds"])]
    if starts and times and len(times) > 1:
        start, compile_seconds = starts[0], times[0] - statistics.median(times[1:])
    elif "epoch_seconds" in summary and summary.get("eval_done_seconds"):  # brax
        start, compile_seconds = summary["eval_done_seconds"][0], summary["compile_seconds"]
    else:
        return None
    return done[steps] - start - max(compile_seconds, 0.0)


def interpolated_wall_seconds(summary: dict, threshold: float) -> Optional[float]:
    """An estimate beside the measured wall clock to `threshold`, which evaluations every few million
    env steps quantize: where the straight line between the measured (wall clock, return) points either
    side of the first crossing meets it. The point before the first trained evaluation is the start of
    training (wall clock 0, the return of the evaluation before training); with nothing measured below
    the threshold before the crossing, it is the measured time. None where not reached or an evaluation
    lacks its time."""
    steps, returns = summary.get("eval_env_steps") or [None], summary.get("eval_returns") or [None]
    before = (0.0, returns[0]) if steps[0] == 0 and is_finite_number(returns[0]) else None
    for step, r in trained_evaluations(summary):
        seconds = _wall_seconds_to(summary, step)
        if seconds is None:
            return None
        if r >= threshold:
            if before is None or before[1] >= threshold:  # nothing measured below it: the measured time
                return seconds
            t0, r0 = before
            return t0 + (threshold - r0) / (r - r0) * (seconds - t0)
        before = (seconds, r)
    return None


# -- ratios ---------------------------------------------------------------------------------------

RATIOS = (
    ("jaxrose sequential / brax (steady)", "systems.sequential.steady_sps", "systems.brax.steady_sps"),
    ("jaxrose sequential / brax (incl. evals)", "systems.sequential.steady_sps_with_evals",
     "systems.brax.steady_sps_with_evals"),
    ("jaxrose sequential / rollout ceiling", "systems.sequential.steady_sps", "limits.rollout_ceiling_sps"),
    ("jaxrose sequential / synchronous limit", "systems.sequential.steady_sps", "limits.synchronous_limit_sps"),
    ("jaxrose sequential / synchronous limit (random actions)", "systems.sequential.steady_sps",
     "limits.synchronous_limit_random_actions_sps"),
    ("rollout ceiling: random / zero actions", "limits.rollout_ceiling_random_actions_sps",
     "limits.rollout_ceiling_sps"),
    ("jaxrose overlapped / brax (incl. evals)", "systems.overlapped.steady_sps_with_evals",
     "systems.brax.steady_sps_with_evals"),
    ("jaxrose overlapped / jaxrose sequential (incl. evals)", "systems.overlapped.steady_sps_with_evals",
     "systems.sequential.steady_sps_with_evals"),
    ("jaxrose overlapped (incl. evals) / synchronous limit", "systems.overlapped.steady_sps_with_evals",
     "limits.synchronous_limit_sps"),
    ("jaxrose spread / jaxrose sequential (steady)", "systems.spread.steady_sps", "systems.sequential.steady_sps"),
    ("jaxrose spread / brax (incl. evals)", "systems.spread.steady_sps_with_evals",
     "systems.brax.steady_sps_with_evals"),
    ("jaxrose tuned / brax (incl. evals)", "systems.tuned.steady_sps_with_evals",
     "systems.brax.steady_sps_with_evals"),
    ("jaxrose tuned / jaxrose sequential (incl. evals)", "systems.tuned.steady_sps_with_evals",
     "systems.sequential.steady_sps_with_evals"),
    ("jaxrose tuned (incl. evals) / synchronous limit", "systems.tuned.steady_sps_with_evals",
     "limits.synchronous_limit_sps"),
    ("jaxrose async / brax (incl. evals)", "systems.async.steady_sps_with_evals", "systems.brax.steady_sps_with_evals"),
    ("jaxrose async / rollout ceiling (incl. evals)", "systems.async.steady_sps_with_evals",
     "limits.rollout_ceiling_sps"),
    ("jaxrose async steady (rollout consumed) / jaxrose sequential steady", "systems.async.steady_sps",
     "systems.sequential.steady_sps"),
    ("time to return threshold: brax / jaxrose async (speedup)", "systems.brax.seconds_to_threshold",
     "systems.async.seconds_to_threshold"),
    ("time to return threshold, measured wall clock: brax / jaxrose async (speedup)",
     "systems.brax.wall_seconds_to_threshold", "systems.async.wall_seconds_to_threshold"),
    ("time to return threshold, wall clock interpolated between evaluations (an estimate): brax / jaxrose async "
     "(speedup)", "systems.brax.interpolated_wall_seconds_to_threshold",
     "systems.async.interpolated_wall_seconds_to_threshold"),
    ("time to the highest common return (a stated threshold not reached), measured wall clock: brax / jaxrose "
     "async (speedup)", "systems.brax.common_threshold_times.wall_seconds",
     "systems.async.common_threshold_times.wall_seconds"),
    ("time to return threshold: brax / jaxrose sequential (speedup)", "systems.brax.seconds_to_threshold",
     "systems.sequential.seconds_to_threshold"),
    ("time to return threshold: jaxrose sequential / jaxrose async (speedup)",
     "systems.sequential.seconds_to_threshold", "systems.async.seconds_to_threshold"),
    ("brax / rollout ceiling", "systems.brax.steady_sps", "limits.rollout_ceiling_sps"),
    ("brax / synchronous limit", "systems.brax.steady_sps", "limits.synchronous_limit_sps"),
)


def lookup(results: dict, path: str):
    """The value at a dotted path of the results, or None where any part is missing."""
    node = results
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def compute_ratios(results: dict) -> list[dict]:
    """Every ratio whose two measured values exist in `results`, with the paths it was computed from. An
    asynchronous system that stepped another env count than the ceiling's (started or grown to other
    batch sizes) is not divided by that ceiling: the ceiling at its own env count is another run's."""
    ratios = []
    for name, numerator, denominator in RATIOS:
        if (numerator.startswith("systems.async.") and denominator.startswith("limits.rollout_ceiling")
                and lookup(results, "systems.async.envs_as_ceiling") is False):
            continue
        a, b = lookup(results, numerator), lookup(results, denominator)
        if is_finite_number(a) and is_finite_number(b) and b > 0:
            ratios.append({"name": name, "numerator": numerator, "denominator": denominator, "value": a / b})
    return ratios


# -- run everything -------------------------------------------------------------------------------


class BenchInterrupted(BaseException):
    """SIGTERM reached the bench (a time limit's `timeout`): the system running stops, the ones after it do
    not start, and the outputs are written from what was measured. A BaseException, so that no
    `except Exception` on the way swallows it."""


@contextlib.contextmanager
def _sigterm_stops_the_bench(state: dict):
    """While the bench runs, SIGTERM raises BenchInterrupted once (and records it in `state`); a second
    SIGTERM, say while the outputs are written, kills as usual."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        state["interrupted"] = f"signal {signal.Signals(signum).name}"
        raise BenchInterrupted(state["interrupted"])

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interruption(error: BaseException) -> str:
    """The signal behind BenchInterrupted, or behind train's TerminatedError (its exit code) or a Ctrl-C."""
    if isinstance(error, BenchInterrupted):
        return str(error)
    return "signal SIGTERM" if getattr(error, "exit_code", None) == 143 else "signal SIGINT"


def run_bench(bench: BenchConfig, command: Optional[str] = None) -> dict:
    """Runs the selected systems and writes results.json, results.md and results.png; returns the results.

    Cut short by SIGTERM (or Ctrl-C), it still writes them, from the systems measured so far
    (`results['interrupted']`)."""
    from jaxrose.profiler import GpuActivitySampler

    share_gpu_memory_with_children(bench.systems)

    config = train_config(bench)
    configs = {name: system_config(config, bench, name) for name in bench.systems}  # bad scales fail before any run
    systems: dict[str, dict] = {}
    update = train_result = None
    stop: dict = {}
    # A bench into a folder holding an earlier bench's outputs keeps them (moved aside), never overwrites them.
    set_aside(bench.out_dir, BENCH_OUTPUTS, "--out", "Give each bench its own --out to keep them apart.")
    running = None  # the system started last
    live = _LiveProgress()  # the sequential system's iterations as they come, for an interruption
    with _sigterm_stops_the_bench(stop), GpuActivitySampler() as sampler:
        origin = sampler.mark("bench/start")
        try:
            for name in bench.systems:
                running = name
                own = configs[name]  # its budget (--budget-scales)
                _log(f"{SYSTEM_LABELS[name]}: {own.env.name}, {own.run.total_env_steps:,} env steps, "
                     f"{own.run.num_evals} evaluations")
                try:
                    if name == "brax":
                        systems[name] = run_brax(own, sampler)
                    elif name == "sim":
                        systems[name] = run_sim_ceiling(own, bench.repeats, sampler)
                    elif name == "overlapped":
                        systems[name] = run_overlapped(own, sampler, bench.child_timeout)
                    elif name == "spread":
                        systems[name] = run_spread(own, sampler, bench.spread_processes, bench.child_timeout)
                    elif name == "tuned":
                        systems[name] = run_tuned(own, sampler, bench.tune_iterations, bench.tune_groups,
                                                  bench.tuned_plan, bench.tune_max_candidates,
                                                  bench.tune_evaluation_placement, bench.child_timeout)
                    elif name == "async":
                        systems[name] = run_async(own, sampler, bench.async_group_levels, bench.child_timeout)
                    else:
                        systems[name], train_result = run_sequential(own, sampler, live)
                except Exception as e:  # one failed system must not lose the others' measurements
                    traceback.print_exc()
                    systems[name] = {"status": "error", "reason": f"{type(e).__name__}: {e}"}
                _log(f"{SYSTEM_LABELS[name]}: {_one_line(systems[name])}")
                _write_partial(bench, systems)  # a run cut short by a time limit keeps what it measured
            if systems.get("sim", {}).get("status") == "ok":
                # Reuse the trained executor when there is one: no second env build or trace.
                executor, state = (train_result.executor, train_result.state) if train_result else (None, None)
                try:
                    update = time_learner_update(config, bench.repeats, executor, state)
                except Exception:  # the limits are lost, the systems' measurements are not
                    traceback.print_exc()
        except (BenchInterrupted, KeyboardInterrupt) as e:  # KeyboardInterrupt: train's TerminatedError too
            # Wherever it landed (inside a system, or just after its start was logged), the system started
            # last is charged with it unless it had finished; the ones after it never start.
            stop["interrupted"] = stop.get("interrupted") or _interruption(e)
            if running and running not in systems:
                systems[running] = {"status": "error", "reason": f"interrupted ({stop['interrupted']}) while running"}
                if running == "sequential" and live.iteration_seconds:
                    systems[running]["measured_before_interruption"] = live.summary(configs[running])
            for name in bench.systems:
                systems.setdefault(name, {"status": "skipped", "reason": f"not started: {stop['interrupted']}"})
        sampler.mark("bench/end")

    results = {
        "meta": _meta(bench, command, sampler),
        "bench": {**dataclasses.asdict(bench), "out_dir": bench.out_dir},
        "config": dataclasses.asdict(config),
        "schedule": {"env_steps_per_iteration": config.env_steps_per_iteration,
                     "iterations_per_eval": config.iterations_per_eval, "num_iterations": config.num_iterations,
                     "steady_skip_iterations": steady_skip(config)},
        "budgets": {name: {"total_env_steps": own.run.total_env_steps, "num_evals": own.run.num_evals,
                           "scale": bench.scales[name]} for name, own in configs.items() if own is not config},
        "systems": systems,
        "limits": compute_limits(config, systems.get("sim"), update),
        "threshold": time_to_threshold(systems, bench.return_threshold),
    }
    if stop:
        results["interrupted"] = stop["interrupted"]
    results["ratios"] = compute_ratios(results)
    results["gpu_activity"] = {
        "columns": ["seconds", "sm_activity_pct", "sm_occupancy_pct", "sm_clock_mhz"],
        "samples": [[s.t - origin, s.sm_activity_pct, s.sm_occupancy_pct, s.sm_clock_mhz] for s in sampler.samples()],
        "marks": {label: t - origin for label, t in sampler.marks().items()},
    }
    for summary in systems.values():
        if "window" in summary:
            summary["window"] = [t - origin for t in summary["window"]]
    write_outputs(results, bench)
    return results


BENCH_OUTPUTS = ("results.json", "results.md", "results.png", "partial.json")


def _write_partial(bench: BenchConfig, systems: dict) -> None:
    os.makedirs(bench.out_dir, exist_ok=True)
    write_atomically(os.path.join(bench.out_dir, "partial.json"),
                     json.dumps(jsonable(systems), indent=2, allow_nan=False))


def _meta(bench: BenchConfig, command: Optional[str], sampler) -> dict:
    import brax
    import jax

    import jaxrose

    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command or "jaxrose bench " + _bench_args(bench),
        "preset": bench.preset,
        "device_kind": jax.devices()[0].device_kind,
        "platform": jax.devices()[0].platform,
        "jax_version": jax.__version__,
        "brax_version": brax.__version__,
        "jaxrose_version": jaxrose.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        **git_state(),
        "sm_sampling": {"available": sampler.available, "reason": sampler.reason, "interval_s": sampler.interval_s},
    }


def _bench_args(bench: BenchConfig) -> str:
    parts = []
    for field in dataclasses.fields(bench):
        value = getattr(bench, field.name)
        if value is not None and field.name != "train_args":
            parts += ["--" + field.name.replace("_", "-"), ",".join(value) if isinstance(value, tuple) else str(value)]
    return shlex.join(parts + (["--", *bench.train_args] if bench.train_args else []))


def _one_line(summary: dict) -> str:
    if summary.get("status") != "ok":
        return f"failed ({summary.get('reason')})"
    text = f"steady {summary['steady_sps']:,.0f} steps/s"
    if "steady_sps_with_evals" in summary:
        text += f", {summary['steady_sps_with_evals']:,.0f} incl. evals, final return {summary['final_return']:.4g}"
    if summary.get("random_actions", {}).get("status") == "ok":
        text += f" (zero actions); {summary['random_actions']['steady_sps']:,.0f} with random actions"
    rollouts = summary.get("median_actor_rollout_seconds") or {}
    if rollouts and summary.get("median_steady_learner_busy_seconds") is not None:  # the asynchronous system
        text += (f"; actor rollout {', '.join(f'{t:.3f}' for t in rollouts.values())} s, learner busy "
                 f"{summary['median_steady_learner_busy_seconds']:.3f} s and waiting "
                 f"{summary['median_steady_learner_wait_seconds']:.3f} s per update (medians)")
    return text


def _log(message: str) -> None:
    print(f"[bench] {message}", flush=True)


# -- outputs --------------------------------------------------------------------------------------


def write_outputs(results: dict, bench: BenchConfig) -> None:
    os.makedirs(bench.out_dir, exist_ok=True)
    write_atomically(os.path.join(bench.out_dir, "results.json"), json.dumps(jsonable(results), indent=2, allow_nan=False))
    markdown = render_markdown(results)
    write_atomically(os.path.join(bench.out_dir, "results.md"), markdown)
    plot_results(results, os.path.join(bench.out_dir, "results.png"))
    if bench.record:
        append_record(bench.record, markdown)
    _log(f"results: {os.path.abspath(bench.out_dir)} (results.json, results.md, results.png)")


def main(args: list[str]) -> None:
    bench = parse_args(args)
    results = run_bench(bench, command=shlex.join(["jaxrose", "bench", *args]))
    sys.stdout.write(render_markdown(results))
    if results.get("interrupted"):
        _log(f"interrupted ({results['interrupted']}): the outputs hold what was measured before it")
        raise SystemExit(128 + (signal.SIGTERM if "SIGTERM" in results["interrupted"] else signal.SIGINT))
    failed = [name for name, s in results["systems"].items() if s.get("status") not in ("ok", "skipped")]
    if failed:
        _log(f"failed systems: {', '.join(failed)} (see results.json for the reasons)")
        raise SystemExit(1)
