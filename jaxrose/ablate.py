"""Ablations and sweeps: every preset × arm × seed is tuned with that arm's switches, then its chosen
plan is measured end to end; speedups are against the sequential plan of the same preset and seed.

Arms name sets of `tune.Switches`: `sequential` (no optimization, no tuning), `all` (every switch
on), `no-<switch>` (that one off, the rest on) and `only-<switch>` (that one alone on). The
sequential arm always runs, first, because every speedup is measured against it.

By default the arms of one preset and seed share their tuning measurements (`tune.Measurements`): the
sequential plan's noise pair, the stage profile and any candidate plan an earlier arm measured are not
measured again (each row counts them in `measurements_reused`). Each arm's final plan is always measured
afresh for its row. `reuse_measurements=False` tunes every arm from scratch.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from typing import Callable, Mapping, Optional, Sequence, Union

from jaxrose.config import ConfigError, TrainConfig, replace
from jaxrose.plan import Plan, sequential_plan
from jaxrose.tune import Measurements, Switches, measure_plan, tune

SEQUENTIAL, ALL = "sequential", "all"


def switch_names() -> list[str]:
    # Read from the dataclass, so a switch added to `Switches` gets its arms without a change here.
    return [field.name for field in dataclasses.fields(Switches)]


def known_arms() -> list[str]:
    names = switch_names()
    return [SEQUENTIAL, ALL] + [f"no-{n}" for n in names] + [f"only-{n}" for n in names]


def default_arms() -> list[str]:
    return [SEQUENTIAL, ALL] + [f"no-{n}" for n in switch_names()]


def arm_switches(arm: str) -> Optional[Switches]:
    """The switches an arm tunes with; None for `sequential`, which is not tuned at all."""
    names = switch_names()
    kind, _, name = arm.partition("-")
    name = name.replace("-", "_")
    if arm == SEQUENTIAL:
        return None
    if arm == ALL:
        return Switches(**{n: True for n in names})
    if kind in ("no", "only") and name in names:
        return Switches(**{n: (n != name) if kind == "no" else (n == name) for n in names})
    raise ConfigError(f"Unknown arm {arm!r} in arms. Known arms: {', '.join(known_arms())}.")


def ablate(presets: Union[str, Sequence[str], Mapping[str, TrainConfig]], arms: Optional[Sequence[str]] = None,
           seeds: Sequence[int] = (0,), iterations: int = 5, max_candidates: int = 4,
           out_dir: Optional[str] = "runs/ablate", progress_fn: Optional[Callable[[dict], None]] = None,
           reuse_measurements: bool = True) -> list[dict]:
    """Runs every preset × arm × seed and returns one row per run (see `_row` for the fields).

    `presets`: preset names, or a mapping from a label to a config (e.g. a preset made small for a
    CPU). `iterations`: timed iterations per measurement, in tuning and in the final measurement.
    Writes table.csv, table.json, summary.md, plots and plans.json (each run's chosen plan, by
    `plan_key`) to `out_dir` after every run (None: write nothing).
    """
    from jaxrose.ablate_report import write_report
    from jaxrose.profiler import GpuActivitySampler

    configs = _check_presets(presets)
    arms = _check_arms(arms)
    seeds = _check_seeds(seeds)
    if not isinstance(iterations, int) or iterations < 1:
        raise ConfigError(f"iterations must be an integer >= 1 (timed iterations per measurement), got {iterations!r}.")
    if not isinstance(max_candidates, int) or max_candidates < 0:
        raise ConfigError(f"max_candidates must be an integer >= 0, got {max_candidates!r}.")
    rows, plans = [], {}
    if out_dir is not None:  # an earlier ablation's tables are kept, moved aside, not overwritten
        from jaxrose.ablate_report import REPORT_FILES
        from jaxrose.run_folder import set_aside

        set_aside(out_dir, REPORT_FILES, "The ablation's out_dir", "Give each ablation its own out_dir.")
    with GpuActivitySampler() as sampler:
        for label, config in configs.items():
            if config.run.compile_cache:
                from jaxrose.train import use_compile_cache

                use_compile_cache(config.run.compile_cache)
            for seed in seeds:
                seeded = replace(config, **{"run.seed": seed})
                shared = Measurements(seeded) if reuse_measurements else None
                for arm in arms:  # sequential first: the reference of this preset and seed
                    row, plan = _run_arm(label, arm, seeded, iterations, max_candidates, sampler, shared)
                    plans[plan_key(label, arm, seed)] = json.loads(plan.to_json())
                    if arm == SEQUENTIAL:
                        reference = row["seconds_per_iteration"]
                    row["speedup"] = reference / row["seconds_per_iteration"]
                    rows.append(row)
                    if out_dir is not None:  # after every run: a long ablation that fails keeps what it measured
                        write_report(rows, out_dir, sm_note(rows, sampler.reason), plans)
                    if progress_fn is not None:
                        progress_fn(row)
    return rows


def _run_arm(label: str, arm: str, config: TrainConfig, iterations: int, max_candidates: int,
             sampler, shared: Optional[Measurements] = None) -> tuple[dict, Plan]:
    switches = arm_switches(arm)
    reused = 0
    if switches is None:
        from jaxrose.sequential import SequentialExecutor

        plan, trials, tuning_seconds, noise = sequential_plan(SequentialExecutor(config).program), [], 0.0, None
    else:
        # Rows compare seconds per iteration, evaluation excluded: the evaluation's placement is not an arm.
        result = tune(config, switches, max_candidates, iterations, measurements=shared, place_evaluation=False)
        plan, trials, tuning_seconds, noise = result.plan, result.trials, result.tuning_seconds, result.noise_seconds
        reused = result.measurements_reused
    seconds, activity = measure(config, plan, iterations, sampler)
    median = statistics.median(seconds)
    tried = [t for t in trials if not t.reason.startswith("skipped")]  # e.g. quotas where MPS is missing
    return {
        "preset": label, "arm": arm, "seed": config.run.seed,
        **{f"switch_{n}": bool(switches and getattr(switches, n)) for n in switch_names()},
        "iterations": iterations,
        "seconds_per_iteration": median,
        "env_steps_per_second": config.env_steps_per_iteration / median,
        "speedup": None,  # filled in against the sequential arm of the same preset and seed
        "sm_activity_pct": activity["sm_activity_pct"] if activity else None,
        "sm_occupancy_pct": activity["sm_occupancy_pct"] if activity else None,
        "sm_samples": activity["num_samples"] if activity else 0,
        "tuning_seconds": tuning_seconds,
        "noise_seconds": noise,
        "candidates_tried": len(tried),
        "candidates_kept": sum(t.kept for t in tried),
        "measurements_reused": reused,
        "plan": "; ".join(plan.history) or "sequential",
    }, plan


def plan_key(label: str, arm: str, seed: int) -> str:
    """The key of a run's chosen plan in plans.json: reuse it with `Plan.from_json(json.dumps(plans[key]))`."""
    return f"{label}/{arm}/seed{seed}"


def measure(config: TrainConfig, plan: Plan, iterations: int, sampler) -> tuple[list[float], Optional[dict]]:
    """`tune.measure_plan` with SM activity averaged over its timed window only (compilation excluded)."""
    seconds = measure_plan(config, plan, iterations, sampler=sampler)
    marks = sampler.marks()
    return seconds, sampler.mean(marks["measure/start"], marks["measure/end"])


def sm_note(rows: list[dict], reason: Optional[str]) -> Optional[str]:
    """Why SM activity is missing, where it is (`reason`: the sampler's); None when every row has it."""
    missing = sum(r["sm_activity_pct"] is None for r in rows)
    if not missing:
        return None
    if reason and missing == len(rows):
        return f"SM activity was not measured: {reason}"
    why = reason or "their timed window held no GPM sample (samples are >= 0.1 s apart); raise iterations."
    return f"SM activity is missing for {missing} of {len(rows)} runs: {why}"


def _check_presets(presets) -> dict[str, TrainConfig]:
    from jaxrose.presets import get_preset

    if isinstance(presets, str):
        presets = [presets]
    if isinstance(presets, Mapping):
        configs = dict(presets)
    else:
        configs = {name: get_preset(name) for name in presets}  # an unknown name raises, listing the known
    if not configs:
        raise ConfigError("presets is empty: name at least one preset (see `jaxrose presets`).")
    for label, config in configs.items():
        if not isinstance(config, TrainConfig):
            raise ConfigError(f"presets[{label!r}] must be a TrainConfig, got {type(config).__name__}.")
    return configs


def _check_arms(arms) -> list[str]:
    arms = default_arms() if arms is None else [arms] if isinstance(arms, str) else list(arms)
    for arm in arms:
        arm_switches(arm)  # raises on an unknown arm
    return list(dict.fromkeys([SEQUENTIAL, *arms]))


def _check_seeds(seeds) -> list[int]:
    seeds = [seeds] if isinstance(seeds, int) else list(seeds)
    if not seeds:
        raise ConfigError("seeds is empty: give at least one seed, e.g. seeds=[0].")
    for seed in seeds:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(f"seeds must be integers, got {seed!r}.")
    return list(dict.fromkeys(seeds))


def main(args: list[str]) -> None:
    import argparse
    import os

    parser = argparse.ArgumentParser(prog="jaxrose ablate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["point-mass"], help="preset names (see `jaxrose presets`)")
    only = [a for a in known_arms() if a not in default_arms()]
    parser.add_argument("--arms", nargs="+", default=None,
                        help=f"default: {' '.join(default_arms())}; also: {' '.join(only)}")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--iterations", type=int, default=5, help="timed iterations per measurement")
    parser.add_argument("--max-candidates", type=int, default=4, help="structural candidates tuning tries per arm")
    parser.add_argument("--out", default="runs/ablate", help="output folder (default: runs/ablate)")
    parser.add_argument("--no-reuse-measurements", action="store_true",
                        help="tune every arm from scratch instead of sharing measurements of the same plan among the "
                             "arms of one preset and seed")
    parser.add_argument("--compile-cache", default=None,
                        help="persistent compile cache shared by every arm and its worker processes (run.compile_cache)")
    options = parser.parse_args(args)
    from jaxrose.mps import prepare_clients

    # Join a private MPS daemon before this process's GPU starts, as `jaxrose tune` does: after that,
    # helpers could not become MPS clients and the quota arms would measure nothing (the H200 run of
    # 2026-12-02 did, before this).
    prepare_clients({})

    def progress(row: dict) -> None:
        sm = "n/a" if row["sm_activity_pct"] is None else f"{row['sm_activity_pct']:.1f}%"
        print(f"{row['preset']} {row['arm']:>16s} seed {row['seed']}: {row['seconds_per_iteration'] * 1e3:.2f} ms/iter "
              f"{row['speedup']:.3f}x, SM {sm}, tuning {row['tuning_seconds']:.1f} s, "
              f"{row['candidates_kept']}/{row['candidates_tried']} kept", flush=True)

    presets = options.presets
    if options.compile_cache:  # every arm recompiles the same programs: the cache makes the later compiles loads
        from jaxrose.presets import get_preset

        presets = {name: replace(get_preset(name), **{"run.compile_cache": options.compile_cache}) for name in presets}
    ablate(presets, options.arms, options.seeds, options.iterations, options.max_candidates, options.out, progress,
           reuse_measurements=not options.no_reuse_measurements)
    with open(os.path.join(options.out, "summary.md")) as f:
        print("\n" + f.read())
    print(f"outputs: {options.out} (table.csv, table.json, summary.md, speedup.png, sm_activity.png)")
