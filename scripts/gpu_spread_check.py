"""On a GPU: seconds per iteration of a preset's sequential plan against its rollout spread over
two group processes (MPS), each measured end to end by `tune.measure_plan` with SM activity over the
timed window. Usage: python3 scripts/gpu_spread_check.py PRESET [ITERATIONS] [--processes=2,4] [--spread-only].
Prints one JSON line per plan as it is measured, then one JSON object; phases go to stderr."""

import json
import logging
import statistics
import sys

from jaxrose.mps import prepare_clients

from gpu_output import write_out  # scripts/ is on the path when a script runs


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s", force=True)
    logging.getLogger("jaxrose").setLevel(logging.DEBUG)  # phases and per-iteration group rollout times
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
    counts = [int(c) for a in sys.argv if a.startswith("--processes=") for c in a.split("=")[1].split(",")] or [2]
    # Spread first: if the call runs out of time, the figure not yet measured elsewhere is in.
    plans = {f"spread{n}": spread_rollout(sequential_plan(program), program, graph,
                                          tuple(f"group{i}" for i in range(n)), config.env.num_envs)
             for n in counts}
    if "--spread-only" not in sys.argv:
        plans["sequential"] = sequential_plan(program)
    result = {"preset": preset, "env_steps_per_iteration": config.env_steps_per_iteration}
    with GpuActivitySampler() as sampler:
        for name, plan in plans.items():
            logging.getLogger("jaxrose").info("measuring %s", name)
            seconds = measure_plan(config, plan, iterations, sampler=sampler)
            marks = sampler.marks()
            median = statistics.median(seconds)
            result[name] = {"seconds": seconds, "median_seconds": median,
                            "env_steps_per_second": config.env_steps_per_iteration / median,
                            "sm": sampler.mean(marks["measure/start"], marks["measure/end"])}
            print(json.dumps({name: result[name]}), flush=True)
    if "sequential" in result:
        for name in plans:
            if name != "sequential":
                result[name]["speedup"] = result["sequential"]["median_seconds"] / result[name]["median_seconds"]
    json.dump(result, sys.stdout, indent=2)
    write_out(result)




if __name__ == "__main__":
    main()
