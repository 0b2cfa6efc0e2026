"""The iteration as it was written by hand before the `Program` interface: plain nested `lax.scan`s.

Kept only as an independent reference: the Program-driven sequential executor must reproduce it
bit for bit on CPU.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from jaxrose import normalization
from jaxrose.networks import ActorCritic
from jaxrose.config import PPOConfig
from jaxrose.ppo import Batch, Learner, LearnerState, make_optimizer, ppo_loss



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


def make_reference_learner(net: ActorCritic, observation_size: int, config: PPOConfig) -> Learner:
    optimizer = make_optimizer(config)
    grad_fn = jax.grad(ppo_loss, has_aux=True)

    def init(key: jax.Array) -> LearnerState:
        params_key, learner_key = jax.random.split(key)
        params = net.init(params_key)
        return LearnerState(params, optimizer.init(params), normalization.init(observation_size), learner_key)

    def minibatch_step(carry, minibatch, normalizer):
        params, opt_state, key = carry
        key, loss_key = jax.random.split(key)
        grads, metrics = grad_fn(params, normalizer, minibatch, loss_key, net, config)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, key), metrics

    def epoch(carry, _, batch, normalizer):
        params, opt_state, key = carry
        key, perm_key, grad_key = jax.random.split(key, 3)
        perm = jax.random.permutation(perm_key, batch.obs.shape[0])
        shuffled = jax.tree.map(
            lambda x: x[perm].reshape((config.num_minibatches, -1) + x.shape[1:]), batch)
        (params, opt_state, _), metrics = jax.lax.scan(
            lambda c, mb: minibatch_step(c, mb, normalizer), (params, opt_state, grad_key), shuffled)
        return (params, opt_state, key), metrics

    def update(state: LearnerState, batch: Batch) -> tuple[LearnerState, dict]:
        normalizer = state.normalizer
        if config.normalize_observations:
            normalizer = normalization.update(normalizer, batch.obs)
        key, epoch_key = jax.random.split(state.key)
        (params, opt_state, _), metrics = jax.lax.scan(
            lambda c, x: epoch(c, x, batch, normalizer), (state.params, state.opt_state, epoch_key),
            None, length=config.num_updates_per_batch)
        metrics = jax.tree.map(jnp.mean, metrics)
        return LearnerState(params, opt_state, normalizer, key), metrics

    return Learner(init, update)


def make_reference_iteration(executor):
    """The old `SequentialExecutor._iteration`, over the executor's env, network and config."""
    config = executor.config
    collect = make_collect(executor.train_env, executor.net, config.ppo.unroll_length,
                           config.unrolls_per_iteration, config.ppo.bootstrap_on_truncation)
    learner = make_reference_learner(executor.net, executor.observation_size, config.ppo)

    def iteration(state):
        key, collect_key = jax.random.split(state.key)
        env_state, batch, episode_stats = collect(state.learner.params, state.learner.normalizer,
                                                  state.env_state, collect_key)
        new_learner, loss_metrics = learner.update(state.learner, batch)
        metrics = {**{f"train/{k}": v for k, v in loss_metrics.items()},
                   **{f"train/{k}": v for k, v in episode_stats.items()}}
        return state.replace(learner=new_learner, env_state=env_state, key=key,
                             iteration=state.iteration + 1), metrics

    return iteration
