"""On a GPU: where the asynchronous actor's rollout time goes (BENCHMARKS.md, session 19: the actor's
rollout of 327,680 ant steps takes 0.276 s with the learner idle and 0.315 s beside it, against 0.228 s
for the simulation ceiling). Times, in this process (an MPS client), one rollout of the preset's
iteration as

- `sim_flat_zero`: the bench's ceiling: one flat scan of every step, zero actions, nothing stored;
- `flat_policy_nostore`: the same scan with the policy choosing the actions, nothing stored;
- `flat_policy_store`: ... and every transition stored, as a rollout must;
- `nested_policy_store`: ... in the actor's loop shape (unrolls × unroll_length nested scans);
- `nested_inner_unrolled`: ... with the inner scan unrolled (`lax.scan(unroll=True)`: one while loop, not two);
- `actor_collect`: the actor's own jitted program (`jaxrose.async_actor`);

then `actor_collect` again while a learner process (another MPS client) runs PPO updates back to
back, once at normal and once at below-normal MPS priority, each with the updates' own rate.
Usage: python3 scripts/gpu_actor_probe.py [PRESET] [REPEATS] [--alone-only] [--out=PATH]
(--alone-only: the five rollouts alone, no learner process)
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from gpu_output import write_out  # scripts/ is on the path when a script runs
from gpu_overlap_probe import window_rate


def learner_loop(preset: str, stop_file: str, report_file: str) -> None:
    """Runs PPO updates back to back on one collected batch until `stop_file` appears."""
    import jax

    from jaxrose.presets import get_preset
    from jaxrose.sequential import SequentialExecutor

    config = get_preset(preset)
    executor = SequentialExecutor(config)
    state = executor.init(jax.random.PRNGKey(0))
    learner = state.learner
    _, batch, _ = jax.jit(executor.collect)(learner.params, learner.normalizer, state.env_state, jax.random.PRNGKey(1))
    update = jax.jit(executor.learner.update)
    jax.block_until_ready(update(learner, batch))
    open(report_file + ".ready", "w").close()
    count, start, completions = 0, time.perf_counter(), []
    while not os.path.exists(stop_file):
        jax.block_until_ready(update(learner, batch))
        count += 1
        completions.append(time.monotonic())  # one clock for every process of the machine
    # updates / seconds: the whole loop, from its ready mark to the stop (the actor's compile and warm-up
    # included); the rate beside the actor's timed rollouts alone is the parent's `learner_rate_beside`
    with open(report_file, "w") as f:
        json.dump({"updates": count, "seconds": time.perf_counter() - start, "completions": completions,
                   "core_count": getattr(jax.devices()[0], "core_count", None)}, f)


def timed(fn, args, repeats: int, min_seconds: float = 0.0) -> dict:
    """`repeats` timed calls after a compile and a warm-up call, more until they span `min_seconds` (a window
    long enough to hold several of a learner's updates beside them)."""
    import jax

    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_seconds = time.perf_counter() - start
    jax.block_until_ready(compiled(*args))
    seconds, window_start = [], time.monotonic()
    while len(seconds) < repeats or time.monotonic() - window_start < min_seconds:
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        seconds.append(time.perf_counter() - start)
    return {"median_seconds": statistics.median(seconds), "seconds": seconds, "compile_seconds": compile_seconds,
            "window": [window_start, time.monotonic()]}  # the timed repeats, on time.monotonic


def main() -> None:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the learner process beside it needs memory too
    from jaxrose.mps import prepare_clients

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    preset, repeats = (args[0] if args else "ant-mlp"), int(args[1]) if len(args) > 1 else 7
    envs = prepare_clients({"learner_normal": None, "learner_below": None},
                           compile_cache=os.environ.get("JAX_COMPILATION_CACHE_DIR"),
                           priorities={"learner_normal": "normal", "learner_below": "below-normal"})
    import jax
    import jax.numpy as jnp

    from envs.wrappers import wrap_for_training
    from jaxrose.networks import make_actor_critic
    from jaxrose.ppo_program import make_learner
    from jaxrose.ppo_program import rollout_nodes
    from jaxrose.presets import get_preset
    from jaxrose.program import Program, run_program
    from jaxrose.sequential import make_env

    config = get_preset(preset)
    env = make_env(config)
    groups, per_group = config.env.num_groups, config.env.envs_per_group
    layout = wrap_for_training(env, config.env.episode_length, groups, per_group)
    net = make_actor_critic(env.observation_size, env.action_size, config.network, config.ppo.normalize_observations)
    learner = make_learner(net, env.observation_size, config.ppo).init(jax.random.PRNGKey(0))
    params, normalizer = learner.params, learner.normalizer
    state = jax.jit(layout.reset)(jax.random.PRNGKey(1))
    key = jax.random.PRNGKey(2)
    unrolls, length = config.unrolls_per_iteration, config.ppo.unroll_length
    steps = unrolls * length
    action_shape = layout.batch_shape + (env.action_size,)

    def policy_step(store: bool):
        def step(carry, _):
            state, key = carry
            key, act_key = jax.random.split(key)
            action, extras = net.act(params_in[0], params_in[1], state.obs, act_key)
            nxt = layout.step(state, action)
            out = {"obs": state.obs, "log_prob": extras["log_prob"], "raw_action": extras["raw_action"],
                   "reward": nxt.reward, "done": nxt.done} if store else None
            return (nxt, key), out
        return step

    params_in = [params, normalizer]  # closed over through the list, passed as arguments below

    def sim_flat_zero(state, key):
        def step(carry, _):
            return (layout.step(carry[0], jnp.zeros(action_shape)), carry[1]), None
        return jax.lax.scan(step, (state, key), None, length=steps)[0]

    def with_params(body):
        def fn(p, n, state, key):
            params_in[0], params_in[1] = p, n
            return body(state, key)
        return fn

    def flat(store):
        return with_params(lambda state, key: jax.lax.scan(policy_step(store), (state, key), None, length=steps))

    def nested(state, key, inner_unrolled=False):
        def unroll(carry, _):
            return jax.lax.scan(policy_step(True), carry, None, length=length, unroll=inner_unrolled)
        return jax.lax.scan(unroll, (state, key), None, length=unrolls)

    program = Program("rollout", rollout_nodes(layout, net, config))

    def actor_collect(p, n, state, key):
        out = run_program(program, {"params": p, "normalizer": n, "env_state": state, "key": key})
        return out["env_state"], out["key"], out["unrolls"]

    result = {"preset": preset, "repeats": repeats, "env_steps": steps * config.env.num_envs, "alone": {}}
    full = (params, normalizer, state, key)
    variants = {"sim_flat_zero": (sim_flat_zero, (state, key)), "flat_policy_nostore": (flat(False), full),
                "flat_policy_store": (flat(True), full), "nested_policy_store": (with_params(nested), full),
                "actor_collect": (actor_collect, full),
                "nested_inner_unrolled": (with_params(lambda s, k: nested(s, k, inner_unrolled=True)), full)}
    for name, (fn, fn_args) in variants.items():
        result["alone"][name] = timed(fn, fn_args, repeats)
        print(name, f"{result['alone'][name]['median_seconds']:.4f}", file=sys.stderr, flush=True)
        write_out(result)  # a run cut at its time limit keeps what it measured

    result["beside_learner"] = {}
    for worker, priority in () if "--alone-only" in sys.argv else (("learner_normal", "normal"),
                                                                    ("learner_below", "below-normal")):
        folder = tempfile.mkdtemp()
        stop, report = os.path.join(folder, "stop"), os.path.join(folder, "report.json")
        env_vars = {**os.environ, **envs[worker], "PYTHONPATH": os.pathsep.join(sys.path)}
        child = subprocess.Popen([sys.executable, __file__, preset, f"--learner-loop={stop},{report}"], env=env_vars)
        deadline = time.time() + 240
        while not os.path.exists(report + ".ready") and child.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        measured = timed(actor_collect, full, repeats, min_seconds=3.0)
        open(stop, "w").close()
        child.wait(timeout=60)
        learner_report = json.load(open(report)) if os.path.exists(report) else None
        # The learner's updates per second while the actor's timed rollouts ran, not over its whole loop
        rate = window_rate(learner_report["completions"], *measured["window"]) if learner_report else None
        result["beside_learner"][priority] = {**measured, "learner_rate_beside": rate, "learner": learner_report}
        print(priority, f"{measured['median_seconds']:.4f}", "learner updates/s beside:", rate,
              file=sys.stderr, flush=True)
    print(json.dumps(result))
    write_out(result)


if __name__ == "__main__":
    loop = [a for a in sys.argv if a.startswith("--learner-loop=")]
    if loop:
        stop_file, report_file = loop[0].split("=", 1)[1].split(",")
        learner_loop(sys.argv[1], stop_file, report_file)
    else:
        main()
