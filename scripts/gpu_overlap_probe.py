"""On a GPU: how much of the asynchronous learner's work hides behind the actor's rollout, per learner SM quota.

The async system at 2 groups runs at 0.64-0.68 of the 8,192-env simulation ceiling, about its synchronous limit
(BENCHMARKS.md, session 36), short of #8's 95%. This probe says whether any learner quota could do better. In this
process (an MPS client without a cap) it times the simulation ceiling (zero actions, nothing stored) and the
actor's rollout of `--groups` env groups alone. Then, per learner quota Q, a learner process (another MPS client,
capped at Q%) runs the asynchronous learner's step back to back: a stale batch's proximal log-probs and one
update on a batch of the preset's own groups (what `grow_keeps=update_size` learns per update). Its update rate is
taken from its completion times, on the clock both processes share, once with this process idle and once while
this process rolls out.

Per quota:
- actor share: the rollout's time alone over its time beside the learner;
- learner share: its updates per second beside the actor over its rate alone at 100%;
- overlap: their sum. 1 means the GPU only takes turns (nothing hides); 2, both run as fast as alone;
- both busy: env steps/s with the learner learning back to back beside the actor, each at its rate measured beside
  the other: steps / max(rollout beside, updates per rollout / learner rate beside);
- best mix: the largest rate of any schedule that switches between the two measured modes, both busy and one of
  them alone (the actor, or the learner at its quota), with the learner learning every rollout's updates: what
  the measured concurrency allows at best. Each over the simulation ceiling, which #8 asks to reach >= 0.95.

Usage: python3 scripts/gpu_overlap_probe.py [PRESET] [REPEATS] [--groups=2] [--quotas=100,50,25] [--window=3]
       [--out=PATH] [-- TRAIN SETTINGS, e.g. --ppo.off-policy-correction vtrace]
       python3 scripts/gpu_overlap_probe.py --summarize=STORED.json --out=PATH (the summaries again, from raw times)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

from gpu_output import write_out  # scripts/ is on the path when a script runs


def window_rate(completions: list[float], start: float, end: float) -> Optional[float]:
    """Events per second among the completion times inside [start, end], from the first such event to the
    last (None with fewer than two): a window's edges do not count a partial interval."""
    inside = sorted(t for t in completions if start <= t <= end)
    if len(inside) < 2 or inside[-1] == inside[0]:
        return None
    return (len(inside) - 1) / (inside[-1] - inside[0])


def summarize(env_steps: int, updates_per_rollout: float, ceiling_s: float, actor_alone_s: float,
              learner_reference_rate: float, quota: dict) -> dict:
    """One quota's shares, overlap and rates (module docstring) from its measured times and rates."""
    actor_share = actor_alone_s / quota["actor_beside_s"]
    learner_rate = quota["learner_rate_beside"]
    learner_share = learner_rate / learner_reference_rate
    learning_s = updates_per_rollout / learner_rate  # the rollout's updates, at the rate beside the actor
    pace = max(quota["actor_beside_s"], learning_s)
    both_busy = env_steps / pace
    best = env_steps / actor_alone_s * best_mix(updates_per_rollout, actor_alone_s, learner_reference_rate,
                                                actor_share, learner_share,
                                                quota["learner_rate_alone"] / learner_reference_rate)
    ceiling = env_steps / ceiling_s
    return {"actor_share": actor_share, "learner_share": learner_share, "overlap": actor_share + learner_share,
            "pace_s": pace, "paced_by": "actor" if quota["actor_beside_s"] >= learning_s else "learner",
            "both_busy_steps_per_s": both_busy, "both_busy_over_ceiling": both_busy / ceiling,
            "best_mix_steps_per_s": best, "best_mix_over_ceiling": best / ceiling}


def best_mix(updates_per_rollout: float, actor_alone_s: float, learner_reference_rate: float, actor_share: float,
             learner_share: float, learner_alone_share: float) -> float:
    """The actor's rollout rate, as a fraction of its rate alone, of the best schedule that switches between
    both busy (at `actor_share`, `learner_share`) and one process alone: the actor (1, 0), or the learner at its
    quota (0, `learner_alone_share`), shares of each one's rate alone at 100%. The learner must do
    `updates_per_rollout` updates per rollout: in shares, `need` of its time per unit of the actor's."""
    need = (updates_per_rollout / learner_reference_rate) / actor_alone_s
    if learner_share >= need * actor_share:  # both busy, the learner has room: mix in the actor alone
        mix = (learner_share - need * actor_share) / (learner_share + need * (1.0 - actor_share))
        return actor_share + mix * (1.0 - actor_share)
    # both busy, the learner falls behind: mix in the learner alone
    mix = (need * actor_share - learner_share) / (learner_alone_share - learner_share + need * actor_share)
    return actor_share * (1.0 - mix)


def synchronous_limit(env_steps: int, updates_per_rollout: float, actor_alone_s: float,
                      learner_reference_rate: float) -> float:
    """Env steps/s with the rollout and its updates one after the other, each as fast as alone."""
    return env_steps / (actor_alone_s + updates_per_rollout / learner_reference_rate)


def split_args(argv: list[str]) -> tuple[list[str], dict[str, str], list[str]]:
    """(positional, --name=value options, train settings after `--`)."""
    cut = argv.index("--") if "--" in argv else len(argv)
    head, train_args = argv[:cut], argv[cut + 1:]
    options = dict(a[2:].split("=", 1) for a in head if a.startswith("--") and "=" in a)
    return [a for a in head if not a.startswith("--")], options, train_args


def load_config(preset: str, train_args: list[str]):
    import tyro

    from jaxrose.config import TrainConfig
    from jaxrose.presets import get_preset

    return tyro.cli(TrainConfig, default=get_preset(preset), args=train_args, prog="gpu_overlap_probe")


def require_groups(config, groups: int) -> None:
    """Stops with the fix named unless `groups` is a positive multiple of the preset's groups per update."""
    if groups < 1 or groups % config.env.num_groups:
        sys.exit(f"--groups={groups}: the actor's env groups must be a positive multiple of the preset's "
                 f"env.num_groups ({config.env.num_groups}), one learner update per {config.env.num_groups}; "
                 f"pass e.g. --groups={2 * config.env.num_groups}.")


def learner_step_on_zeros(config):
    """The asynchronous learner's step, jitted: a stale batch's proximal log-probs and one update on a batch of
    the preset's own groups. With its first learner state and zeros of that batch's trajectory shapes: the
    update's cost does not depend on the values, so no rollout is compiled."""
    import jax
    import jax.numpy as jnp

    from jaxrose.ppo_program import learner_batch, rollout_nodes
    from jaxrose.program import Program, run_program
    from jaxrose.sequential import SequentialExecutor

    executor = SequentialExecutor(config)
    learner = executor.learner.init(jax.random.PRNGKey(0))
    rollout = Program("rollout", rollout_nodes(executor.train_env, executor.net, config))
    env_state = jax.eval_shape(executor.train_env.reset, jax.random.PRNGKey(1))
    shapes = jax.eval_shape(lambda s: run_program(rollout, {"params": learner.params, "normalizer": learner.normalizer,
                                                            "env_state": s, "key": jax.random.PRNGKey(2)})["unrolls"],
                            env_state)
    unrolls = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    @jax.jit
    def step(learner, unrolls):
        return executor.learner.update(learner, learner_batch(executor.net, unrolls, learner, stale=True)[0])[0]

    return step, learner, unrolls


def learner_loop(preset: str, train_args: list[str], stop_file: str, report_file: str) -> None:
    """Runs the asynchronous learner's step back to back until `stop_file` appears; writes every
    step's completion time (time.monotonic, shared by the processes of one machine)."""
    import jax

    config = load_config(preset, train_args)
    step, learner, unrolls = learner_step_on_zeros(config)
    learner = jax.block_until_ready(step(learner, unrolls))
    learner = jax.block_until_ready(step(learner, unrolls))
    open(report_file + ".ready", "w").close()
    completions = []
    while not os.path.exists(stop_file):
        learner = jax.block_until_ready(step(learner, unrolls))
        completions.append(time.monotonic())
    with open(report_file, "w") as f:
        json.dump({"completions": completions, "core_count": getattr(jax.devices()[0], "core_count", None),
                   "segments_per_update": config.ppo.segments_per_iteration}, f)


def actor_parts(config, groups: int) -> dict:
    """The actor's rollout of `groups` env groups and the simulation ceiling's zero-action scan of as many
    steps (nothing stored), with their arguments; the rollout's env steps and learner updates."""
    import jax
    import jax.numpy as jnp

    from envs.wrappers import wrap_for_training
    from jaxrose.networks import make_actor_critic
    from jaxrose.ppo_program import make_learner, rollout_nodes
    from jaxrose.program import Program, run_program
    from jaxrose.sequential import make_env

    env = make_env(config)
    net = make_actor_critic(env.observation_size, env.action_size, config.network, config.ppo.normalize_observations)
    learner = make_learner(net, env.observation_size, config.ppo).init(jax.random.PRNGKey(0))
    per_group = config.env.envs_per_group
    layout = wrap_for_training(env, config.env.episode_length, groups, per_group)
    state = jax.jit(layout.reset)(jax.random.PRNGKey(1))
    key = jax.random.PRNGKey(2)
    steps = config.unrolls_per_iteration * config.ppo.unroll_length
    program = Program("rollout", rollout_nodes(layout, net, config))

    def actor_collect(p, n, state, key):
        out = run_program(program, {"params": p, "normalizer": n, "env_state": state, "key": key})
        return out["env_state"], out["key"], out["unrolls"]

    def sim_flat_zero(state, key):
        zeros = jnp.zeros(layout.batch_shape + (env.action_size,))

        def step(carry, _):
            return (layout.step(carry[0], zeros), carry[1]), None
        return jax.lax.scan(step, (state, key), None, length=steps)[0]

    return {"envs": groups * per_group, "env_steps": steps * groups * per_group,
            "updates_per_rollout": groups / config.env.num_groups,
            "sim_flat_zero": (sim_flat_zero, (state, key)),
            "actor": (actor_collect, (learner.params, learner.normalizer, state, key))}


def timed(compiled, args, repeats: int, min_seconds: float = 0.0) -> dict:
    """`repeats` runs, and more until `min_seconds` have passed: the median and every run's seconds."""
    import jax

    seconds, until = [], time.perf_counter() + min_seconds
    while len(seconds) < repeats or time.perf_counter() < until:
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        seconds.append(time.perf_counter() - start)
    return {"median_s": statistics.median(seconds), "seconds": seconds}


def add_summaries(result: dict) -> None:
    """Each measured quota's summary, and the run's reference rates, from the raw times in `result`."""
    measured = {q: e for q, e in result["quotas"].items()
                if e.get("learner_rate_beside") and e.get("learner_rate_alone")}
    if not measured:
        return
    env_steps, updates_per_rollout = result["env_steps"], result["updates_per_rollout"]
    reference_quota = max(measured, key=int)
    reference = measured[reference_quota]["learner_rate_alone"]
    ceiling_s, actor_alone = result["ceiling"]["median_s"], result["actor_alone"]["median_s"]
    result["learner_reference"] = {"quota": int(reference_quota), "updates_per_s": reference}
    result["ceiling_steps_per_s"] = env_steps / ceiling_s
    result["synchronous_limit_steps_per_s"] = synchronous_limit(env_steps, updates_per_rollout, actor_alone, reference)
    for q, entry in measured.items():
        entry["summary"] = summarize(env_steps, updates_per_rollout, ceiling_s, actor_alone, reference, entry)
        print(f"learner at {q}%:", entry["summary"], file=sys.stderr, flush=True)


def main() -> None:
    positional, options, train_args = split_args(sys.argv[1:])
    preset = positional[0] if positional else "ant-mlp"
    repeats = int(positional[1]) if len(positional) > 1 else 9
    groups = int(options.get("groups", 2))
    quotas = [int(q) for q in options.get("quotas", "100,50,25").split(",")]
    window = float(options.get("window", 3))

    # This process (the actor) must not preallocate 75% of the GPU as JAX does by default: the learner process
    # beside it then had 25%, too little for pusher-transformer's step (OOM on a 16.9 GiB buffer, H100, session 45).
    # The async trainer runs its processes so too (bench.py, mps.prepare_clients).
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from jaxrose.mps import prepare_clients

    names = {q: f"learner_q{q}" for q in quotas}
    envs = prepare_clients({names[q]: (None if q >= 100 else q) for q in quotas},
                           compile_cache=os.environ.get("JAX_COMPILATION_CACHE_DIR"))
    import jax

    config = load_config(preset, train_args)
    require_groups(config, groups)
    parts = actor_parts(config, groups)
    env_steps, updates_per_rollout = parts["env_steps"], parts["updates_per_rollout"]

    result = {"git_commit": os.environ.get("JAXROSE_GIT_COMMIT"), "preset": preset, "train_args": train_args,
              "repeats": repeats, "groups": groups,
              "envs": parts["envs"], "env_steps": env_steps, "updates_per_rollout": updates_per_rollout,
              # the clients' variables name a pipe directory only where a daemon runs
              "mps": "CUDA_MPS_PIPE_DIRECTORY" in envs[names[quotas[0]]], "device": str(jax.devices()[0]),
              "core_count": getattr(jax.devices()[0], "core_count", None), "compile_s": {}, "quotas": {}}
    actor_args = parts["actor"][1]
    compiled = {}
    for name in ("sim_flat_zero", "actor"):
        fn, args = parts[name]
        start = time.perf_counter()
        compiled[name] = jax.jit(fn).lower(*args).compile()
        jax.block_until_ready(compiled[name](*args))
        result["compile_s"][name] = time.perf_counter() - start
    result["ceiling"] = timed(compiled["sim_flat_zero"], parts["sim_flat_zero"][1], repeats)
    result["actor_alone"] = timed(compiled["actor"], actor_args, repeats)
    print("ceiling", f"{result['ceiling']['median_s']:.4f}", "actor alone", f"{result['actor_alone']['median_s']:.4f}",
          file=sys.stderr, flush=True)
    write_out(result)

    for quota in quotas:
        folder = tempfile.mkdtemp()
        stop, report = os.path.join(folder, "stop"), os.path.join(folder, "report.json")
        child_env = {**os.environ, **envs[names[quota]], "PYTHONPATH": os.pathsep.join(sys.path)}
        started = time.perf_counter()
        child = subprocess.Popen([sys.executable, __file__, preset, f"--learner-loop={stop},{report}", "--",
                                  *train_args], env=child_env)
        deadline = time.time() + 300
        while not os.path.exists(report + ".ready") and child.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        entry = {"learner_start_s": time.perf_counter() - started}
        if not os.path.exists(report + ".ready"):
            child.kill()
            entry["error"] = f"the learner process at {quota}% never got ready (exit code {child.poll()})"
            result["quotas"][str(quota)] = entry
            print(entry["error"], file=sys.stderr, flush=True)
            continue
        alone = (time.monotonic(), None)
        time.sleep(window)
        alone = (alone[0], time.monotonic())
        beside_start = time.monotonic()
        measured = timed(compiled["actor"], actor_args, repeats, min_seconds=window)
        beside = (beside_start, time.monotonic())
        open(stop, "w").close()
        try:
            child.wait(timeout=120)
        except subprocess.TimeoutExpired:
            child.kill()
        completions = json.load(open(report))["completions"] if os.path.exists(report) else []
        entry.update({"actor_beside_s": measured["median_s"], "actor_beside": measured["seconds"],
                      "learner_rate_alone": window_rate(completions, *alone),
                      "learner_rate_beside": window_rate(completions, *beside),
                      "learner_core_count": json.load(open(report)).get("core_count") if completions else None})
        result["quotas"][str(quota)] = entry
        print(f"learner at {quota}%:", {k: v for k, v in entry.items() if k != "actor_beside"}, file=sys.stderr,
              flush=True)
        write_out(result)

    result["actor_alone_after"] = timed(compiled["actor"], actor_args, repeats)
    add_summaries(result)
    print(json.dumps({k: v for k, v in result.items() if k != "quotas"} | {
        "quotas": {q: e.get("summary", e.get("error")) for q, e in result["quotas"].items()}}))
    write_out(result)


if __name__ == "__main__":
    again = [a for a in sys.argv if a.startswith("--summarize=")]
    if again:  # the summaries of a stored run, recomputed from its raw times (written to --out)
        stored = json.load(open(again[0].split("=", 1)[1]))
        add_summaries(stored)
        write_out(stored)
        sys.exit(0)
    loop = [a for a in sys.argv if a.startswith("--learner-loop=")]
    if loop:
        stop_file, report_file = loop[0].split("=", 1)[1].split(",")
        positional, _, train_args = split_args(sys.argv[1:])
        learner_loop(positional[0], train_args, stop_file, report_file)
    else:
        main()
