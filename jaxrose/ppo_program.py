"""PPO's iteration written with the programmable interface: the single description that the
sequential executor runs and the planner transforms.

Stages, their components and their loops (brax PPO's semantics, see `jaxrose.ppo`):

    iteration:  split_iteration_key                       rng
      unroll × U:  split_unroll_key                        rng
        rollout_step × T:  policy_inference               policy
                           env_step                       env
        close_unroll                                      env
      prepare_batch                                       learner
      update_normalizer                                   learner
      split_learner_key                                   rng
      epoch × E:  shuffle                                 learner
        minibatch × M:  sgd_step                          learner
      reduce_metrics                                      logging

State names: `params`, `opt_state`, `normalizer`, `learner_key` (the learner), `env_state`, `key`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxrose import distribution, normalization
from jaxrose.config import PPOConfig, TrainConfig
from jaxrose.networks import ActorCritic
from jaxrose.ppo import Batch, Learner, LearnerState, make_optimizer, ppo_loss
from jaxrose.program import Loop, Program, Stage, run_program

ITERATION_INPUTS = ("params", "opt_state", "normalizer", "learner_key", "env_state", "key")


def rollout_nodes(env, net: ActorCritic, config: TrainConfig, group_slice: tuple[int, int, int] | None = None) -> tuple:
    """Collects `config.unrolls_per_iteration` unrolls of `unroll_length` steps: writes `unrolls`.

    `group_slice=(start, count, total)` builds the rollout of env groups `start .. start + count` of
    `total` (`env` then holds `count` groups): its samples are exactly those groups' samples in the
    rollout of all groups, which is what lets a plan spread groups over processes."""
    keep_final_obs = config.ppo.bootstrap_on_truncation

    def split_iteration_key(key):
        key, collect_key = jax.random.split(key)
        return {"key": key, "collect_key": collect_key}

    def split_unroll_key(collect_key):
        collect_key, step_key = jax.random.split(collect_key)
        return {"collect_key": collect_key, "step_key": step_key}

    def policy_inference(params, normalizer, env_state, step_key):
        step_key, act_key = jax.random.split(step_key)
        action, extras = net.act(params, normalizer, env_state.obs, act_key, group_slice)
        return {"step_key": step_key, "action": action, "policy_extras": extras, "obs": env_state.obs}

    def env_step(env_state, action, policy_extras, obs):
        next_state = env.step(env_state, action)
        transition = {
            "obs": obs, "raw_action": policy_extras["raw_action"], "log_prob": policy_extras["log_prob"],
            "reward": next_state.reward, "discount": 1.0 - next_state.done,
            "truncation": next_state.info["truncation"], "episode_done": next_state.info["episode_done"],
            "episode_return": next_state.info["episode_metrics"]["sum_reward"],
            "episode_length": next_state.info["episode_metrics"]["length"],
        }
        if keep_final_obs:
            transition["final_obs"] = next_state.info["final_obs"]
        return {"env_state": next_state, "transition": transition}

    def close_unroll(steps, env_state):
        return {"unroll": {**steps, "last_obs": env_state.obs}}

    return (
        Stage("split_iteration_key", split_iteration_key, ("key",), ("key", "collect_key"), "rng"),
        Loop("unroll", length=config.unrolls_per_iteration, collect={"unrolls": "unroll"}, body=(
            Stage("split_unroll_key", split_unroll_key, ("collect_key",), ("collect_key", "step_key"), "rng"),
            Loop("rollout_step", length=config.ppo.unroll_length, collect={"steps": "transition"},
                 unroll=config.ppo.unroll_length if config.run.unroll_rollout_steps else 1, body=(
                Stage("policy_inference", policy_inference, ("params", "normalizer", "env_state", "step_key"),
                      ("step_key", "action", "policy_extras", "obs"), "policy"),
                Stage("env_step", env_step, ("env_state", "action", "policy_extras", "obs"),
                      ("env_state", "transition"), "env"),
            )),
            Stage("close_unroll", close_unroll, ("steps", "env_state"), ("unroll",), "env"),
        )),
    )


def to_batch(unrolls: dict) -> tuple[Batch, dict]:
    """[U, T, G, E, ...] unroll records → segments [U * G * E, T, ...] in brax's order, plus episode stats."""
    def to_segments(x):
        x = jnp.moveaxis(x, 1, 3)
        return x.reshape((-1,) + x.shape[3:])

    data = dict(unrolls)
    last_obs = data.pop("last_obs")
    done = data.pop("episode_done")
    ep_return, ep_length = data.pop("episode_return"), data.pop("episode_length")
    batch = Batch(last_obs=last_obs.reshape((-1,) + last_obs.shape[3:]), **{k: to_segments(v) for k, v in data.items()})
    finished = jnp.sum(done)
    stats = {"episodes": finished,
             "episode_return": jnp.sum(ep_return * done) / jnp.maximum(finished, 1.0),
             "episode_length": jnp.sum(ep_length * done) / jnp.maximum(finished, 1.0)}
    return batch, stats


def learner_batch(net: ActorCritic, unrolls: dict, learner: LearnerState, stale: bool) -> tuple[Batch, dict]:
    """The asynchronous learner's batch of a trajectory, plus episode stats. A `stale` one (collected
    with older parameters) gets the log-probs of the learner's policy at the update's start, the
    proximal policy of the decoupled loss; otherwise it is PPO's batch as the program builds it."""
    batch, stats = to_batch(unrolls)
    if stale:
        logits = net.policy_logits(learner.params, learner.normalizer, batch.obs)
        batch = batch.replace(proximal_log_prob=distribution.log_prob(logits, batch.raw_action))
    return batch, stats


def minibatch_count(ppo: PPOConfig, segments: int) -> int:
    """Minibatches an update's batch of `segments` segments splits into (`ppo.minibatch_segments`)."""
    size = ppo.minibatch_segments
    count = ppo.num_minibatches if size is None else segments // size
    if count < 1 or segments % (count if size is None else size):
        what = f"{count} minibatches (ppo.num_minibatches)" if size is None else f"minibatches of {size} segments"
        raise ValueError(f"A batch of {segments} segments does not split into {what}; "
                         f"change ppo.num_minibatches or ppo.minibatch_segments.")
    return count


def learner_nodes(net: ActorCritic, ppo: PPOConfig, optimizer: optax.GradientTransformation,
                  minibatch_unroll: int = 1) -> tuple:
    """The PPO update on `batch`: writes `params`, `opt_state`, `normalizer`, `learner_key`, `loss_metrics`.
    `minibatch_unroll` SGD steps run per iteration of the device loop over minibatches (`run.learner_unroll`)."""
    grad_fn = jax.grad(ppo_loss, has_aux=True)

    def update_normalizer(normalizer, batch):
        if not ppo.normalize_observations:
            return {"normalizer": normalizer}
        return {"normalizer": normalization.update(normalizer, batch.obs)}

    def split_learner_key(learner_key):
        learner_key, epoch_key = jax.random.split(learner_key)
        return {"learner_key": learner_key, "epoch_key": epoch_key}

    def shuffle(epoch_key, batch):
        epoch_key, perm_key, grad_key = jax.random.split(epoch_key, 3)
        segments = batch.obs.shape[0]
        perm = jax.random.permutation(perm_key, segments)
        count = minibatch_count(ppo, segments)
        minibatches = jax.tree.map(lambda x: x[perm].reshape((count, -1) + x.shape[1:]), batch)
        return {"epoch_key": epoch_key, "grad_key": grad_key, "minibatches": minibatches}

    def sgd_step(params, opt_state, grad_key, minibatch, normalizer):
        grad_key, loss_key = jax.random.split(grad_key)
        grads, metrics = grad_fn(params, normalizer, minibatch, loss_key, net, ppo)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return {"params": optax.apply_updates(params, updates), "opt_state": opt_state, "grad_key": grad_key,
                "step_metrics": metrics}

    return (
        Stage("update_normalizer", update_normalizer, ("normalizer", "batch"), ("normalizer",), "learner"),
        Stage("split_learner_key", split_learner_key, ("learner_key",), ("learner_key", "epoch_key"), "rng"),
        Loop("epoch", length=ppo.num_updates_per_batch, collect={"loss_metrics": "epoch_metrics"}, body=(
            Stage("shuffle", shuffle, ("epoch_key", "batch"), ("epoch_key", "grad_key", "minibatches"), "learner"),
            Loop("minibatch", over={"minibatch": "minibatches"}, collect={"epoch_metrics": "step_metrics"},
                 unroll=minibatch_unroll, body=(
                Stage("sgd_step", sgd_step, ("params", "opt_state", "grad_key", "minibatch", "normalizer"),
                      ("params", "opt_state", "grad_key", "step_metrics"), "learner"),
            )),
        )),
    )


def make_ppo_program(env, net: ActorCritic, config: TrainConfig,
                     optimizer: optax.GradientTransformation | None = None) -> Program:
    optimizer = optimizer or make_optimizer(config.ppo)

    def prepare_batch(unrolls):
        batch, stats = to_batch(unrolls)
        return {"batch": batch, "episode_stats": stats}

    def reduce_metrics(loss_metrics, episode_stats):
        means = jax.tree.map(jnp.mean, loss_metrics)
        return {"metrics": {**{f"train/{k}": v for k, v in means.items()},
                            **{f"train/{k}": v for k, v in episode_stats.items()}}}

    return Program("ppo", (
        *rollout_nodes(env, net, config),
        Stage("prepare_batch", prepare_batch, ("unrolls",), ("batch", "episode_stats"), "learner"),
        *learner_nodes(net, config.ppo, optimizer, config.run.learner_unroll),
        Stage("reduce_metrics", reduce_metrics, ("loss_metrics", "episode_stats"), ("metrics",), "logging"),
    ))


def run_state_to_program_state(state) -> dict[str, Any]:
    learner = state.learner
    return {"params": learner.params, "opt_state": learner.opt_state, "normalizer": learner.normalizer,
            "learner_key": learner.key, "env_state": state.env_state, "key": state.key}


def make_learner(net: ActorCritic, observation_size: int, config: PPOConfig, minibatch_unroll: int = 1) -> Learner:
    """PPO as a pure learner: `init(key) -> LearnerState`, `update(LearnerState, Batch) -> (LearnerState, metrics)`;
    `update` runs the learner stages of PPO's program as written."""
    optimizer = make_optimizer(config)
    program = Program("ppo_update", learner_nodes(net, config, optimizer, minibatch_unroll))

    def init(key: jax.Array) -> LearnerState:
        params_key, learner_key = jax.random.split(key)
        params = net.init(params_key)
        return LearnerState(params, optimizer.init(params), normalization.init(observation_size), learner_key)

    def update(state: LearnerState, batch: Batch) -> tuple[LearnerState, dict]:
        out = run_program(program, {"params": state.params, "opt_state": state.opt_state,
                                    "normalizer": state.normalizer, "learner_key": state.key, "batch": batch})
        new_state = LearnerState(out["params"], out["opt_state"], out["normalizer"], out["learner_key"])
        return new_state, jax.tree.map(jnp.mean, out["loss_metrics"])

    return Learner(init, update)
