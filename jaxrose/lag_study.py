"""What a policy lag costs per env step, and what each off-policy correction recovers.

PPO trained in one process with a fixed lag: update u learns from a trajectory collected with the
parameters of update u - lag (the first `lag` with the initial ones), from one continuing env
stream. This is what the asynchronous mode's learner sees at a steady lag, without its processes,
timing noise or variable lags, so the cost of staleness can be measured on its own, seed by seed,
on any machine. Every (lag, correction, seed) run learns from the same number of env steps and is
evaluated on the synchronous trainer's schedule with the same evaluation episodes; lag 0 is the
sequential executor's training (tested).

`jaxrose lag-study --preset pendulum --lags 0 1 2 4 8 [-- TRAIN SETTINGS]` writes `results.json` (every curve),
`results.md` (final return, mean return over the run, env steps to a threshold) and `lag_study.png`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import statistics
import time
from typing import Callable, Optional, Sequence

import jax
import numpy as np

from jaxrose.config import ConfigError, TrainConfig, replace
from jaxrose.run_folder import set_aside, write_atomically

CORRECTIONS = ("decoupled", "vtrace", "behaviour")


@dataclasses.dataclass
class LagRun:
    lag: int
    correction: str
    seed: int
    env_steps: list[int]  # at each evaluation
    returns: list[float]  # mean evaluation return at each evaluation
    behaviour_versions: list[int]  # per update: the parameters (update count) its trajectory was collected with
    off_policy_weight: list[float]  # per update: the loss's mean truncated importance weight
    # per update: the fraction of samples outside the trust region around the loss's anchor (the
    # proximal policy, or the behaviour policy for `behaviour`), over the update's SGD steps
    clip_fraction: list[float]
    seconds: float  # wall time of the run, compile included

    @property
    def final_return(self) -> float:
        return self.returns[-1]

    @property
    def mean_return(self) -> float:
        """The mean of the evaluations after the initial one: the area under the learning curve."""
        return float(np.mean(self.returns[1:]))

    def steps_to(self, threshold: float) -> Optional[int]:
        """Env steps to the first evaluation after training began at or above `threshold` (the initial
        evaluation, before any update, does not count, as in `jaxrose bench`)."""
        return next((s for s, r in zip(self.env_steps[1:], self.returns[1:]) if r >= threshold), None)


def train_with_lag(config: TrainConfig, lag: int, correction: str = "decoupled", seed: Optional[int] = None,
                   env=None) -> LagRun:
    """Trains `config` for its env-step budget, each update on a trajectory `lag` updates stale."""
    from jaxrose.evaluation import evaluation_key, make_evaluate
    from jaxrose.ppo_program import learner_batch, rollout_nodes
    from jaxrose.program import Program, run_program
    from jaxrose.sequential import SequentialExecutor

    if lag < 0:
        raise ConfigError(f"A policy lag must be >= 0, got {lag}.")
    if correction not in CORRECTIONS:
        raise ConfigError(f"Unknown off-policy correction {correction!r}; choose one of {', '.join(CORRECTIONS)}.")
    seed = config.run.seed if seed is None else seed
    config = replace(config, **{"ppo.off_policy_correction": correction, "run.seed": seed})
    executor = SequentialExecutor(config, env=env)
    net, steps_per_update = executor.net, config.env_steps_per_iteration
    rollout = Program("rollout", rollout_nodes(executor.train_env, net, config))

    @jax.jit
    def collect(params, normalizer, env_state, key):
        out = run_program(rollout, {"params": params, "normalizer": normalizer, "env_state": env_state, "key": key})
        return out["env_state"], out["key"], out["unrolls"]

    # As the asynchronous learner does: a stale batch gets the log-probs of the learner's policy at the
    # update's start; at lag 0 the batch is PPO's as the program builds it.
    prepare = jax.jit(functools.partial(learner_batch, net, stale=lag > 0))

    update = jax.jit(executor.learner.update)
    evaluate = jax.jit(make_evaluate(executor.env, net, config.run.num_eval_envs, config.env.episode_length,
                                     config.run.deterministic_eval))

    start = time.perf_counter()
    state = executor.init(jax.random.PRNGKey(seed))
    learner, env_state, key = state.learner, state.env_state, state.key
    # The parameters of the last `lag + 1` updates, oldest first: the oldest collects the next trajectory.
    recent = collections.deque([(0, learner.params, learner.normalizer)], maxlen=lag + 1)
    run = LagRun(lag, correction, seed, [], [], [], [], [], 0.0)

    def record_evaluation(iteration: int) -> None:
        metrics = evaluate(learner.params, learner.normalizer, evaluation_key(seed, iteration))
        run.env_steps.append(iteration * steps_per_update)
        run.returns.append(float(metrics["episode_return"]))

    record_evaluation(0)
    for iteration in range(1, config.num_iterations + 1):
        version, params, normalizer = recent[0]
        env_state, key, unrolls = collect(params, normalizer, env_state, key)
        learner, metrics = update(learner, prepare(unrolls, learner)[0])
        recent.append((iteration, learner.params, learner.normalizer))
        run.behaviour_versions.append(version)
        weight, clip_fraction = jax.device_get((metrics["off_policy_weight"], metrics["clip_fraction"]))
        run.off_policy_weight.append(float(weight))
        run.clip_fraction.append(float(clip_fraction))
        if iteration % config.iterations_per_eval == 0:
            record_evaluation(iteration)
    run.seconds = time.perf_counter() - start
    run.learner = learner  # not a field: results.json holds the curves, not the parameters
    return run


def lag_study(config: TrainConfig, lags: Sequence[int], corrections: Sequence[str] = CORRECTIONS,
              seeds: Sequence[int] = (0,), progress_fn: Optional[Callable[[LagRun], None]] = None) -> list[LagRun]:
    """Every lag x correction x seed. At lag 0 the corrections coincide, so only the first runs."""
    if config.run.compile_cache:  # each run jits fresh closures: the persistent cache turns their compiles into loads
        from jaxrose.train import use_compile_cache

        use_compile_cache(config.run.compile_cache)
    runs = []
    for seed in seeds:
        for lag in lags:
            for correction in (corrections[:1] if lag == 0 else corrections):
                run = train_with_lag(config, lag, correction, seed)
                runs.append(run)
                if progress_fn is not None:
                    progress_fn(run)
    return runs


def summary_rows(runs: Sequence[LagRun], threshold: Optional[float] = None) -> list[dict]:
    """One row per (lag, correction): the seeds' mean and spread of the final and the mean return,
    and the median env steps to `threshold` (None where a seed missed it: that row says how many did)."""
    groups: dict[tuple, list[LagRun]] = collections.defaultdict(list)
    for run in runs:
        groups[(run.lag, run.correction)].append(run)
    rows = []
    for (lag, correction), members in sorted(groups.items()):
        finals, means = [r.final_return for r in members], [r.mean_return for r in members]
        reached = [r.steps_to(threshold) for r in members] if threshold is not None else []
        hit = [s for s in reached if s is not None]
        rows.append({"lag": lag, "correction": "any" if lag == 0 else correction, "seeds": len(members),
                     "final_return": statistics.mean(finals), "final_return_std": _std(finals),
                     "mean_return": statistics.mean(means), "mean_return_std": _std(means),
                     "clip_fraction": statistics.mean(float(np.mean(r.clip_fraction)) for r in members),
                     "threshold": threshold, "seeds_reaching": len(hit) if threshold is not None else None,
                     "median_steps_to_threshold": statistics.median(hit) if hit else None})
    return rows


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def render_markdown(rows: list[dict], preset: str, env_steps: int) -> str:
    threshold = rows[0]["threshold"] if rows else None
    head = ["lag", "correction", "seeds", "final return", "mean return over the run", "clip fraction"]
    if threshold is not None:
        head.append(f"env steps to {threshold:g} (median; seeds reaching)")
    lines = [f"Policy lag study, `{preset}`, {env_steps:,} env steps per run (mean ± std over seeds).", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        cells = [str(row["lag"]), row["correction"], str(row["seeds"]),
                 f"{row['final_return']:.1f} ± {row['final_return_std']:.1f}",
                 f"{row['mean_return']:.1f} ± {row['mean_return_std']:.1f}", f"{row['clip_fraction']:.3f}"]
        if threshold is not None:
            steps = row["median_steps_to_threshold"]
            cells.append(f"{'—' if steps is None else f'{steps:,.0f}'} ({row['seeds_reaching']}/{row['seeds']})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(runs: Sequence[LagRun], path: str, title: str) -> None:
    """One panel per correction, one line per lag (the seeds' mean); lag 0 is drawn in every panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    corrections = [c for c in CORRECTIONS if any(r.correction == c and r.lag for r in runs)] or [runs[0].correction]
    lags = sorted({r.lag for r in runs})
    figure, axes = plt.subplots(1, len(corrections), figsize=(5 * len(corrections), 4), sharey=True, squeeze=False)
    for axis, correction in zip(axes[0], corrections):
        for lag in lags:
            members = [r for r in runs if r.lag == lag and (lag == 0 or r.correction == correction)]
            if members:
                axis.plot(members[0].env_steps, np.mean([r.returns for r in members], axis=0), label=f"lag {lag}")
        axis.set_title(correction)
        axis.set_xlabel("env steps")
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("evaluation return (mean over seeds)")
    axes[0][-1].legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_outputs(runs: Sequence[LagRun], rows: list[dict], out_dir: str, preset: str, config: TrainConfig) -> None:
    os.makedirs(out_dir, exist_ok=True)
    write_atomically(os.path.join(out_dir, "results.json"), json.dumps(
        {"preset": preset, "env_steps": config.num_iterations * config.env_steps_per_iteration,
         "updates": config.num_iterations, "backend": jax.default_backend(), "config": dataclasses.asdict(config),
         "runs": [dataclasses.asdict(r) for r in runs], "summary": rows}, indent=1))
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(render_markdown(rows, preset, config.num_iterations * config.env_steps_per_iteration))
    plot(runs, os.path.join(out_dir, "lag_study.png"), f"{preset}: return against env steps at a fixed policy lag")


def main(args: list[str]) -> None:
    import argparse

    from jaxrose.presets import get_preset

    train_args = args[args.index("--") + 1:] if "--" in args else []  # `jaxrose train` settings, e.g.
    args = args[:args.index("--")] if "--" in args else args           # -- --ppo.max-off-policy-weight 2
    parser = argparse.ArgumentParser(prog="jaxrose lag-study", description=__doc__.split("\n\n")[0],
                                     epilog="After `--`, any `jaxrose train` setting applies to every run.")
    parser.add_argument("--preset", default="pendulum", help="preset name (see `jaxrose presets`)")
    parser.add_argument("--lags", nargs="+", type=int, default=[0, 1, 2, 4, 8])
    parser.add_argument("--corrections", nargs="+", default=list(CORRECTIONS), choices=CORRECTIONS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--env-steps", type=int, default=None, help="env steps per run (default: the preset's)")
    parser.add_argument("--num-evals", type=int, default=None, help="evaluations per run (default: the preset's)")
    parser.add_argument("--return-threshold", type=float, default=None,
                        help="also report the env steps each run needed to reach this evaluation return")
    parser.add_argument("--out", default="runs/lag-study", help="output folder (default: runs/lag-study)")
    options = parser.parse_args(args)
    overrides = {}
    if options.env_steps is not None:
        overrides["run.total_env_steps"] = options.env_steps
    if options.num_evals is not None:
        overrides["run.num_evals"] = options.num_evals
    config = replace(get_preset(options.preset), **overrides)
    if train_args:
        import tyro

        config = tyro.cli(TrainConfig, default=config, args=train_args, prog="jaxrose lag-study ... --")

    done: list[LagRun] = []
    # An earlier study's outputs are kept, moved aside: this one rewrites its files after every run.
    set_aside(options.out, ("results.json", "results.md", "lag_study.png"), "--out",
              "Give each study its own --out to keep them apart.")

    def progress(run: LagRun) -> None:
        print(f"lag {run.lag} {run.correction:>9s} seed {run.seed}: final {run.final_return:.1f}, "
              f"mean {run.mean_return:.1f}, {run.seconds:.0f} s", flush=True)
        done.append(run)  # the outputs are rewritten after each run: a study cut short keeps what it measured
        write_outputs(done, summary_rows(done, options.return_threshold), options.out, options.preset, config)

    runs = lag_study(config, options.lags, options.corrections, options.seeds, progress)
    rows = summary_rows(runs, options.return_threshold)
    print("\n" + render_markdown(rows, options.preset, config.num_iterations * config.env_steps_per_iteration))
    print(f"outputs: {os.path.abspath(options.out)} (results.json, results.md, lag_study.png)")
