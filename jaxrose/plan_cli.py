"""`jaxrose plan`: measure a preset's iteration, rank the legal transformations, save the best plan
and draw the timeline before and after."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os


def main(args: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="jaxrose plan", description=__doc__)
    parser.add_argument("--preset", default="point-mass", help="named workload (default: point-mass)")
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations per node (default: 3)")
    parser.add_argument("--threshold", type=float, default=50.0, help="SM activity %% below which a window counts")
    parser.add_argument("--out", default=None, help="output folder (default: plans/<preset>)")
    parser.add_argument("--profile", default=None,
                        help="plan from a profile.json saved by an earlier run (e.g. measured on a GPU) instead "
                             "of measuring here")
    options = parser.parse_args(args)

    from jaxrose.graph import build_graph
    from jaxrose.plan import sequential_plan
    from jaxrose.planner import draw_timeline, rank, simulate
    from jaxrose.presets import get_preset
    from jaxrose.profiler import GpuActivitySampler
    from jaxrose.program_profiler import default_executor_factory, profile_program
    from jaxrose.ppo_program import ITERATION_INPUTS
    from jaxrose.sequential import SequentialExecutor

    config = get_preset(options.preset)
    out = options.out or os.path.join("plans", options.preset)
    os.makedirs(out, exist_ok=True)
    if options.profile:
        profile = load_profile(options.profile)
    else:
        with GpuActivitySampler() as sampler:
            profile = profile_program(default_executor_factory, config, options.iterations, sampler)
    program = SequentialExecutor(config).program
    graph = build_graph(program, ITERATION_INPUTS)
    base = sequential_plan(program)
    ranked = rank(base, program, graph, profile, threshold=options.threshold)
    print(f"profile ({profile.source}; one extra dispatch {profile.dispatch_seconds * 1e6:.0f} µs):")
    for name, stage in profile.stages.items():
        print(f"  {name:22s} {stage.seconds * 1e3:9.3f} ms  {stage.sm_activity:5.1f}% SM activity")
    print("candidates, by predicted gain:")
    for candidate in ranked[:8]:
        print(f"  {candidate.predicted_gain:+8.3%}  {candidate.description}")
    best = ranked[0] if ranked and ranked[0].predicted_gain > 0 else None
    chosen = best.plan if best else base
    chosen.save(os.path.join(out, "plan.json"))
    with open(os.path.join(out, "profile.json"), "w") as f:
        json.dump({"source": profile.source, "dispatch_seconds": profile.dispatch_seconds,
                   "stages": {k: dataclasses.asdict(v) for k, v in profile.stages.items()}}, f, indent=2)
    draw_timeline(simulate(base, program, graph, profile, 3), os.path.join(out, "timeline_before.png"),
                  f"{options.preset}: sequential plan ({profile.source})")
    draw_timeline(simulate(chosen, program, graph, profile, 3), os.path.join(out, "timeline_after.png"),
                  f"{options.preset}: chosen plan")
    print(f"chosen: {best.description if best else 'the sequential plan (no candidate predicts a gain)'}")
    print(f"outputs: {out} (plan.json, profile.json, timeline_before.png, timeline_after.png)")


def load_profile(path: str):
    """A `Profile` from the profile.json that `jaxrose plan` writes."""
    from jaxrose.planner import Profile, StageProfile

    with open(path) as f:
        data = json.load(f)
    return Profile({name: StageProfile(**stage) for name, stage in data["stages"].items()},
                   data["dispatch_seconds"], data["source"])
