"""Collecting trajectory segments: policy inference and env steps as one `lax.scan`.

The env is group-wrapped, so every array is laid out [groups, envs_per_group, ...]; segments come
out flattened to [unrolls * groups * envs_per_group, unroll_length, ...] in brax's order.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxrose.networks import ActorCritic
from jaxrose.ppo import Batch


def make_collect(env, net: ActorCritic, unroll_length: int, num_unrolls: int, keep_final_obs: bool) -> Callable:
    """Returns collect(params, normalizer, env_state, key) -> (env_state, Batch, episode stats)."""

    def env_step(carry, _):
        params, normalizer, state, key = carry
        key, act_key = jax.random.split(key)
        action, extras = net.act(params, normalizer, state.obs, act_key)
        next_state = env.step(state, action)
        record = {
            "obs": state.obs,
            "raw_action": extras["raw_action"],
            "log_prob": extras["log_prob"],
            "reward": next_state.reward,
            "discount": 1.0 - next_state.done,
            "truncation": next_state.info["truncation"],
            "episode_done": next_state.info["episode_done"],
            "episode_return": next_state.info["episode_metrics"]["sum_reward"],
            "episode_length": next_state.info["episode_metrics"]["length"],
        }
        if keep_final_obs:
            record["final_obs"] = next_state.info["final_obs"]
        return (params, normalizer, next_state, key), record

    def unroll(carry, _):
        params, normalizer, state, key = carry
        key, unroll_key = jax.random.split(key)
        (_, _, state, _), steps = jax.lax.scan(env_step, (params, normalizer, state, unroll_key), None,
                                               length=unroll_length)
        steps["last_obs"] = state.obs
        return (params, normalizer, state, key), steps

    def collect(params, normalizer, env_state, key):
        (_, _, env_state, _), data = jax.lax.scan(unroll, (params, normalizer, env_state, key), None,
                                                  length=num_unrolls)
        # data[k]: [U, T, G, E, ...] -> [U * G * E, T, ...]; last_obs: [U, G, E, obs] -> [U * G * E, obs]
        def to_segments(x):
            x = jnp.moveaxis(x, 1, 3)
            return x.reshape((-1,) + x.shape[3:])

        last_obs = data.pop("last_obs")
        done = data.pop("episode_done")
        ep_return, ep_length = data.pop("episode_return"), data.pop("episode_length")
        segments = {k: to_segments(v) for k, v in data.items()}
        batch = Batch(last_obs=last_obs.reshape((-1,) + last_obs.shape[3:]), **segments)
        finished = jnp.sum(done)
        stats = {
            "episodes": finished,
            "episode_return": jnp.sum(ep_return * done) / jnp.maximum(finished, 1.0),
            "episode_length": jnp.sum(ep_length * done) / jnp.maximum(finished, 1.0),
        }
        return env_state, batch, stats

    return collect
