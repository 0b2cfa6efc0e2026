"""Measuring a program: each top-level node of the iteration timed as its own jitted chunk, with
the device synchronized around it, and the GPU's SM activity (NVML GPM) over its span.

The result is the `Profile` the planner works from. Nodes that are loops (the rollout, the
epochs) are timed whole; the per-trip split between their stages is not observable this way.
"""

from __future__ import annotations

import statistics
import time
from typing import Optional

import jax

from jaxrose.plan import Chunk, Plan, top_level_names
from jaxrose.plan_executor import PlanExecutor
from jaxrose.planner import Profile, StageProfile
from jaxrose.ppo_program import run_state_to_program_state


def profile_program(executor_factory, config, iterations: int = 3, sampler=None, seed: int = 0) -> Profile:
    """`executor_factory(config, plan)` builds a PlanExecutor-like object for a plan (e.g. PlanExecutor).

    Each node runs `iterations` times after one warm-up iteration; its time is the median, its SM
    activity the GPM mean over its spans (0 where no GPU sampler is available, noted in `source`).
    """
    from jaxrose.sequential import SequentialExecutor, next_run_state

    program = SequentialExecutor(config).program
    plan = Plan(program.name, tuple(Chunk(name, (name,)) for name in top_level_names(program)))
    executor = executor_factory(config, plan)
    state = executor.init(jax.random.PRNGKey(seed))
    times: dict[str, list[float]] = {name: [] for name in top_level_names(program)}
    spans: dict[str, list[tuple[float, float]]] = {name: [] for name in times}
    for round_ in range(iterations + 1):  # round 0 compiles
        values = run_state_to_program_state(state)
        for chunk, fn in zip(plan.chunks, executor._chunk_fns):
            jax.block_until_ready(values)
            start = time.perf_counter()
            values = jax.block_until_ready(fn(values))
            end = time.perf_counter()
            if round_:
                times[chunk.name].append(end - start)
                spans[chunk.name].append((start, end))
        state = next_run_state(values, state)  # the chunks ran the whole iteration: no second run of it
    medians = {name: statistics.median(seconds) for name, seconds in times.items()}
    # A chunk call costs more than its work (dispatch, argument handling for the whole state): the
    # cheapest node (a key split) is almost all overhead, so take it as the per-chunk cost and the
    # rest of each node's time as its work.
    overhead = min(medians.values())
    stages = {}
    for name, seconds in medians.items():
        activity = _mean_activity(sampler, spans[name])
        stages[name] = StageProfile(max(seconds - overhead, 0.0), activity if activity is not None else 0.0)
    device = jax.devices()[0]
    available = sampler is not None and getattr(sampler, "available", False)
    source = f"measured on {device.device_kind}" + ("" if available else " (no SM activity: no GPU sampler)")
    return Profile(stages, dispatch_seconds=overhead, source=source)


def _mean_activity(sampler, spans) -> Optional[float]:
    if sampler is None or not getattr(sampler, "available", False):
        return None
    # Widen each span by one sampling interval: GPM samples are >= 100 ms apart, chunks can be shorter.
    pad = getattr(sampler, "interval_s", 0.1)
    means = [m["sm_activity_pct"] for m in (sampler.mean(a - pad, b + pad) for a, b in spans) if m]
    return statistics.mean(means) if means else None


def default_executor_factory(config, plan):
    return PlanExecutor(config, plan)
