"""On a GPU: seconds per iteration of a preset's sequential plan against its rollout spread over
two group processes (MPS), each measured end to end by `tune.measure_plan` with SM activity over the
timed window. Usage: python3 scripts/gpu_spread_check.py PRESET [ITERATIONS]. Prints one JSON object."""

import json
import statistics
import sys

from jaxrose.mps import prepare_clients


def main() -> None:
    prepare_clients({})  # this process joins a private MPS daemon before its GPU starts
    from jaxrose.graph import build_graph
    from jaxrose.plan import sequential_plan, spread_rollout
    from jaxrose.ppo_program import ITERATION_INPUTS
    from jaxrose.presets import get_preset
    from jaxrose.profiler import GpuActivitySampler
    from jaxrose.sequential import SequentialExecutor
    from jaxrose.tune import measure_plan

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    preset, iterations = args[0], int(args[1]) if len(args) > 1 else 3
    config = get_preset(preset)
    program = SequentialExecutor(config).program
    graph = build_graph(program, ITERATION_INPUTS)
    plans = {**({} if "--spread-only" in sys.argv else {"sequential": sequential_plan(program)}),
             "spread2": spread_rollout(sequential_plan(program), program, graph, ("group0", "group1"),
                                       config.env.num_envs)}
    result = {"preset": preset, "env_steps_per_iteration": config.env_steps_per_iteration}
    with GpuActivitySampler() as sampler:
        for name, plan in plans.items():
            seconds = measure_plan(config, plan, iterations, sampler=sampler)
            marks = sampler.marks()
            median = statistics.median(seconds)
            result[name] = {"seconds": seconds, "median_seconds": median,
                            "env_steps_per_second": config.env_steps_per_iteration / median,
                            "sm": sampler.mean(marks["measure/start"], marks["measure/end"])}
            print(json.dumps({name: result[name]}), flush=True)
    if "sequential" in result:
        result["speedup"] = result["sequential"]["median_seconds"] / result["spread2"]["median_seconds"]
    json.dump(result, sys.stdout, indent=2)


if __name__ == "__main__":
    main()
