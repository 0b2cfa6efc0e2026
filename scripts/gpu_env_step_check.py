"""What one env step of a preset costs on the GPU, by action and wrapper: zero actions (the sim-only
ceiling's trivial policy) against uniform random actions in [-1, 1] (what an untrained policy sends),
with and without the policy's observation history. MJX's constraint solver iterates until it
converges, so the cost of a step depends on the actions. Usage: python3 scripts/gpu_env_step_check.py
PRESET [PRESET ...] [--bare-only]. Prints one JSON object: milliseconds per step, each the median of 5 scans of
one unroll after warm-up."""

import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from gpu_output import write_out  # scripts/ is on the path when a script runs


def step_ms(train_env, action_size: int, random_actions: bool, length: int) -> float:
    def unroll(state, key):
        def body(carry, _):
            state, key = carry
            key, action_key = jax.random.split(key)
            shape = train_env.batch_shape + (action_size,)
            action = (jax.random.uniform(action_key, shape, minval=-1.0, maxval=1.0) if random_actions
                      else jnp.zeros(shape))
            return (train_env.step(state, action), key), None

        return jax.lax.scan(body, (state, key), None, length=length)[0]

    run = jax.jit(unroll)
    carry = (jax.jit(train_env.reset)(jax.random.PRNGKey(0)), jax.random.PRNGKey(1))
    carry = jax.block_until_ready(run(*carry))
    seconds = []
    for _ in range(5):
        start = time.perf_counter()
        carry = jax.block_until_ready(run(*carry))
        seconds.append(time.perf_counter() - start)
    return 1e3 * statistics.median(seconds) / length


def main() -> None:
    import envs
    from envs.wrappers import wrap_for_training
    from jaxrose.presets import get_preset
    from jaxrose.sequential import make_env

    result = {"device": jax.devices()[0].device_kind}
    presets = [a for a in sys.argv[1:] if not a.startswith("--")] or ["pusher-transformer"]
    for preset in presets:
        config = get_preset(preset)
        entry = result[preset] = {"num_envs": config.env.num_envs}
        stacks = {"bare": envs.make(config.env.name)}
        if "--bare-only" not in sys.argv:
            stacks["as_trained"] = make_env(config)
        for stack, env in stacks.items():
            train_env = wrap_for_training(env, config.env.episode_length, 1, config.env.num_envs)
            for actions in ("zero", "random"):
                entry[f"{stack}_{actions}_ms"] = step_ms(train_env, env.action_size, actions == "random",
                                                         config.ppo.unroll_length)
        print(json.dumps({preset: entry}), file=sys.stderr, flush=True)
    print(json.dumps(result, indent=1))
    write_out(result)




if __name__ == "__main__":
    main()
