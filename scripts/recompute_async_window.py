"""Recomputes the steady window of asynchronous bench results written before each update's env steps
were recorded (`update_env_steps`, session 44). Those placed the window at ceil(first period / average
env steps per update) and subtracted that many average updates: wrong where batches grew (updates of
different sizes), and, where a learner step holds several updates, it could open the window between
two updates of one step (the second's env steps counted, its time not).

    python scripts/recompute_async_window.py docs/bench/<run> [1x10,2x30,4x7]

The optional sizes are the env groups each update learned, in order (read from `learner_busy_seconds`,
whose level steps up with each batch size); without them every update has the same size. The total
env steps follow from the recorded steady steps (the old formula inverted), and are checked to be a whole
number. Learner steps come from `learner_step_updates` where recorded, else from the update timestamps:
an update's start is when the previous one was reported, so the first update of each learner step is
followed by the step's whole duration, and the other updates of the step by milliseconds; the
`len(learner_busy_seconds)` longest gaps mark the steps' first updates.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Optional

from jaxrose.bench import async_steady_start


def learner_steps(run: dict) -> list[int]:
    """Cumulative update count at the end of each learner step."""
    if run.get("learner_step_updates"):
        return list(run["learner_step_updates"])
    starts, steps = run["update_start_seconds"], len(run["learner_busy_seconds"])
    if steps >= len(starts):
        return list(range(1, len(starts) + 1))
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    firsts = sorted(sorted(range(len(gaps)), key=lambda i: -gaps[i])[:steps])
    return [*firsts[1:], len(starts)]


def recompute(path: str, sizes_text: Optional[str] = None) -> dict:
    """`path`: a bench output folder, or a results JSON file (its async system under `systems.async`)."""
    results = json.load(open(path if path.endswith(".json") else f"{path}/results.json"))
    run, config = results["systems"]["async"], results["config"]
    folder = path
    per_iteration = config["ppo"]["batch_size"] * config["ppo"]["num_minibatches"] * config["ppo"]["unroll_length"]
    first_period = results["schedule"]["iterations_per_eval"] * per_iteration
    starts, seconds = run["update_start_seconds"], run["update_seconds"]
    n = len(starts)
    # The old window: k = ceil(first period / average); recorded steady = total - k * total / n.
    candidates = [(k, run["steady_env_steps"] / (1 - k / n)) for k in range(1, n)]
    k, total = next((k, t) for k, t in candidates
                    if math.ceil(first_period / (t / n) - 1e-9) == k and abs(t - round(t)) < 1e-3)
    total = round(total)
    if sizes_text:
        sizes = [int(g) for part in sizes_text.split(",") for g in [part.split("x")[0]] * int(part.split("x")[1])]
        if len(sizes) != n or total % sum(sizes):
            raise SystemExit(f"{len(sizes)} update sizes summing to {sum(sizes)} groups do not fit the run's {n} "
                             f"updates and {total} env steps.")
        group = total // sum(sizes)
        cumulative = [sum(sizes[:i + 1]) * group for i in range(n)]
    else:
        cumulative = [total * (i + 1) / n for i in range(n)]
    first, before = async_steady_start(cumulative, learner_steps(run), first_period)
    steady = total - before
    t0, end, t1 = starts[first], starts[-1] + seconds[-1], max(run["eval_done_seconds"])
    out = {"run": folder.rstrip("/").split("/")[-1], "recorded_first_steady_update": k, "first_steady_update": first,
           "recorded_steady_env_steps": run["steady_env_steps"], "steady_env_steps": steady,
           "recorded_steady_sps": run["steady_sps"], "steady_sps": steady / (end - t0),
           "recorded_steady_sps_with_evals": run["steady_sps_with_evals"], "steady_sps_with_evals": steady / (t1 - t0)}
    brax = results["systems"].get("brax", {})
    if brax.get("status") == "ok":
        out["brax_steady_sps_with_evals"] = brax["steady_sps_with_evals"]
        out["recorded_ratio_to_brax_with_evals"] = run["steady_sps_with_evals"] / brax["steady_sps_with_evals"]
        out["ratio_to_brax_with_evals"] = out["steady_sps_with_evals"] / brax["steady_sps_with_evals"]
    return out


if __name__ == "__main__":
    print(json.dumps(recompute(*sys.argv[1:3]), indent=1))
