"""Where a transformer preset's rollout time goes, one piece at a time on the GPU: policy inference
(with and without sampling, at the full env batch and at half of it, at the default and at bf16 matmul
precision), one env step, and one rollout step (inference + env step) scanned over an unroll.
Usage: python3 scripts/gpu_inference_check.py [PRESET]. Prints one JSON object (milliseconds per call,
median of 20 after warm-up)."""

import json
import statistics
import sys
import time

import jax

from gpu_output import write_out  # scripts/ is on the path when a script runs


def timed(fn, *args, repeats: int = 20) -> float:
    jax.block_until_ready(fn(*args))  # compile and warm up
    jax.block_until_ready(fn(*args))
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        seconds.append(time.perf_counter() - start)
    return 1e3 * statistics.median(seconds)


def main() -> None:
    from jaxrose.presets import get_preset
    from jaxrose.sequential import SequentialExecutor

    preset = next((a for a in sys.argv[1:] if not a.startswith("--")), "pusher-transformer")
    config = get_preset(preset)
    executor = SequentialExecutor(config)
    net, env = executor.net, executor.train_env
    state = executor.init(jax.random.PRNGKey(0))
    params, normalizer, env_state = state.learner.params, state.learner.normalizer, state.env_state
    obs, key = env_state.obs, jax.random.PRNGKey(1)
    half = obs[:, : obs.shape[1] // 2]
    result = {"preset": preset, "obs_shape": list(obs.shape), "device": jax.devices()[0].device_kind}

    logits = jax.jit(net.policy_logits)
    act = jax.jit(lambda p, n, o, k: net.act(p, n, o, k))
    result["policy_logits_ms"] = timed(logits, params, normalizer, obs)
    result["policy_logits_half_batch_ms"] = timed(logits, params, normalizer, half)
    result["act_ms"] = timed(act, params, normalizer, obs, key)
    with jax.default_matmul_precision("bfloat16"):
        bf16 = jax.jit(net.policy_logits)
        result["policy_logits_bf16_ms"] = timed(bf16, params, normalizer, obs)
    with jax.default_matmul_precision("highest"):
        highest = jax.jit(net.policy_logits)
        result["policy_logits_highest_ms"] = timed(highest, params, normalizer, obs)
    action, _ = act(params, normalizer, obs, key)
    step = jax.jit(env.step)
    result["env_step_ms"] = timed(step, env_state, action)

    def unroll(env_state, key):
        def body(carry, _):
            env_state, key = carry
            key, act_key = jax.random.split(key)
            action, extras = net.act(params, normalizer, env_state.obs, act_key)
            next_state = env.step(env_state, action)
            return (next_state, key), (extras["log_prob"], next_state.reward)

        return jax.lax.scan(body, (env_state, key), None, length=config.ppo.unroll_length)

    result["unroll_ms"] = timed(jax.jit(unroll), env_state, key, repeats=5)
    result["unroll_length"] = config.ppo.unroll_length
    result["rollout_step_ms"] = result["unroll_ms"] / config.ppo.unroll_length
    print(json.dumps(result, indent=1))
    write_out(result)




if __name__ == "__main__":
    main()
