"""Evaluation episodes: a fixed number of envs each run one full episode, no auto-reset.

Deterministic for a given key; by default the policy acts with its mode (`run.deterministic_eval`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from envs.core import Env
from envs.wrappers import EpisodeWrapper, GroupWrapper
from jaxrose.networks import ActorCritic


def evaluation_key(seed: int, iteration: int) -> jax.Array:
    """The evaluation key of an iteration: a function of the seed alone, so resumed runs, inline and
    out-of-process evaluation all see the same episodes."""
    return jax.random.fold_in(jax.random.PRNGKey(seed + 1_000_003), iteration)


SUCCESS_METRIC = "success"  # a task that reports it (e.g. arm_push) gets its success rate evaluated


def make_evaluate(env: Env, net: ActorCritic, num_envs: int, episode_length: int, deterministic: bool):
    """Returns a jitted evaluate(params, normalizer, key) -> metrics dict of scalars. For a task whose
    `metrics` hold `success`, `success_rate` is the share of episodes that end in success (its value
    at each episode's last step)."""
    eval_env = GroupWrapper(EpisodeWrapper(env, episode_length), 1, num_envs)

    def evaluate(params, normalizer, key):
        reset_key, act_key = jax.random.split(key)
        state = eval_env.reset(reset_key)
        has_success = SUCCESS_METRIC in state.metrics

        def step(carry, _):
            state, active, total, length, success, key = carry
            key, sample_key = jax.random.split(key)
            if deterministic:
                action = net.act_deterministic(params, normalizer, state.obs)
            else:
                action, _ = net.act(params, normalizer, state.obs, sample_key)
            state = eval_env.step(state, action)
            # where, not a product: an episode that ended may go on to a NaN state (0 * NaN = NaN).
            total = total + jnp.where(active > 0, state.reward, 0.0)
            length = length + active
            if has_success:
                success = jnp.where(active > 0, state.metrics[SUCCESS_METRIC], success)
            active = active * (1.0 - state.done)
            return (state, active, total, length, success, key), None

        ones = jnp.ones(eval_env.batch_shape)
        zeros = jnp.zeros(eval_env.batch_shape)
        (_, _, total, length, success, _), _ = jax.lax.scan(
            step, (state, ones, zeros, zeros, zeros, act_key), None, length=episode_length)
        metrics = {"episode_return": jnp.mean(total), "episode_return_std": jnp.std(total),
                   "episode_length": jnp.mean(length)}
        if has_success:
            metrics["success_rate"] = jnp.mean(success)
        return metrics

    return jax.jit(evaluate)
