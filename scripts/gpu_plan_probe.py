"""On a GPU: where the tuned ant-mlp plan's gain comes from (BENCHMARKS.md, 2026-12-02: `jaxrose tune`
kept "reduce_metrics on a helper, deferred" at 315 ms per iteration against 353 ms sequential, while
reduce_metrics alone takes ~3 ms). Measures, by `tune.measure_plan` in one process, the sequential
plan, the same program split before reduce_metrics with both chunks in this process, and the split with
the tail on a deferred helper, then the sequential plan again (drift check).
Usage: python3 scripts/gpu_plan_probe.py [PRESET] [ITERATIONS] [--no-mps] [--companion] [--out=PATH]. With
--no-mps this process does not join the MPS daemon before its GPU starts (as `jaxrose ablate` did then).

Measured on the H200 (BENCHMARKS.md, session 19): the deferred helper shortens the iteration by 10% only
without MPS, while the same split in one process does nothing. `--companion` adds two plans that test
whether any second CUDA context does it: the sequential plan beside a plain process that only holds a
GPU context (`beside_idle_context`), and beside one that runs a small jitted reduction every 0.35 s, about
the helper's cadence and work (`beside_ticking_context`)."""

import json
import os
import statistics
import subprocess
import sys
import time

from gpu_output import write_out  # scripts/ is on the path when a script runs


def main() -> None:
    from jaxrose.mps import prepare_clients

    if "--no-mps" not in sys.argv:
        prepare_clients({})  # this process joins a private MPS daemon before its GPU starts
    from jaxrose.graph import build_graph
    from jaxrose.plan import defer, place, sequential_plan, split_chunk
    from jaxrose.ppo_program import ITERATION_INPUTS
    from jaxrose.presets import get_preset
    from jaxrose.sequential import SequentialExecutor
    from jaxrose.tune import measure_plan

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    preset, iterations = (args[0] if args else "ant-mlp"), int(args[1]) if len(args) > 1 else 7
    config = get_preset(preset)
    program = SequentialExecutor(config).program
    graph = build_graph(program, ITERATION_INPUTS)
    sequential = sequential_plan(program)
    split = split_chunk(sequential, sequential.chunks[0].name, "reduce_metrics")
    tail = split.chunks[1].name
    helper = defer(place(split, tail, "helper0"), program, graph, tail)
    result = {"preset": preset, "iterations": iterations, "mps": "--no-mps" not in sys.argv, "plans": {}}
    for name, plan in (("sequential", sequential), ("split_in_main", split), ("split_helper", helper),
                       ("sequential_again", sequential)):
        seconds = measure_plan(config, plan, iterations)
        result["plans"][name] = {"median_seconds": statistics.median(seconds), "seconds": seconds}
        print(json.dumps({name: result["plans"][name]}), flush=True)
    if "--companion" in sys.argv:
        for name, tick in (("beside_idle_context", 0), ("beside_ticking_context", 1)):
            companion = subprocess.Popen([sys.executable, __file__, f"--companion-loop={tick}"],
                                         stdin=subprocess.PIPE, env={**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
            time.sleep(20)  # its JAX and GPU context up (and its first compile) before the timing
            seconds = measure_plan(config, sequential, iterations)
            companion.stdin.close()
            companion.wait(timeout=60)
            result["plans"][name] = {"median_seconds": statistics.median(seconds), "seconds": seconds}
            print(json.dumps({name: result["plans"][name]}), flush=True)
    print(json.dumps(result))
    write_out(result)


def companion_loop(tick: bool) -> None:
    """A second CUDA context (plain, or an MPS client where this process's environment says so): holds
    the GPU until its stdin closes, with a small reduction every 0.35 s when `tick`."""
    import threading

    import jax
    import jax.numpy as jnp

    x = jnp.ones((128, 32), jnp.float32)
    reduce = jax.jit(lambda v: (jnp.mean(v, axis=0), jnp.std(v, axis=0)))
    jax.block_until_ready(reduce(x))
    closed = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), closed.set()), daemon=True).start()
    while not closed.wait(0.35):
        if tick:
            jax.block_until_ready(reduce(x))


if __name__ == "__main__":
    loops = [a for a in sys.argv if a.startswith("--companion-loop=")]
    if loops:
        companion_loop(loops[0].split("=", 1)[1] == "1")
    else:
        main()
