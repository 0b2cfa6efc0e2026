"""Programs for tests that spawned workers rebuild: top-level functions, so they pickle by name."""

import dataclasses

import jax.numpy as jnp

from jaxrose.program import Stage

REWARD_CLIP = 0.5


def clip_rewards(unrolls):
    return {"unrolls": {**unrolls, "reward": jnp.clip(unrolls["reward"], -REWARD_CLIP, REWARD_CLIP)}}


def ppo_with_clipped_rewards(executor, group_local: bool = True):
    """PPO with one more batch-preparation stage after the rollout: per-transition reward clipping,
    which never combines env groups (declared `group_local`)."""
    program = executor.program
    body = list(program.body)
    at = [node.name for node in body].index("unroll") + 1
    body.insert(at, Stage("clip_rewards", clip_rewards, ("unrolls",), ("unrolls",), "learner", group_local=group_local))
    return dataclasses.replace(program, body=tuple(body))


def ppo_with_clipped_rewards_undeclared(executor):
    return ppo_with_clipped_rewards(executor, group_local=False)


def count_metrics(metrics):
    return {"metric_count": jnp.asarray(len(metrics), jnp.float32)}


def ppo_with_metrics_counted(executor):
    """PPO with a last stage that reads the reduced metrics (a logging step after reduce_metrics)."""
    program = executor.program
    stage = Stage("count_metrics", count_metrics, ("metrics",), ("metric_count",), "logging")
    return dataclasses.replace(program, body=(*program.body, stage))


def scale_rewards_by_batch_std(unrolls):
    """Divides rewards by their standard deviation over the whole batch: it combines env groups."""
    scale = jnp.std(unrolls["reward"]) + 1e-6
    return {"unrolls": {**unrolls, "reward": unrolls["reward"] / scale}, "reward_scale": scale}


def note_scale(reward_scale):
    return {"reward_scale_noted": reward_scale}


def ppo_with_a_wrongly_group_local_stage(executor):
    """A stage declared `group_local` that reduces over all env groups (a user's mistake), and a later
    stage reading its scalar output."""
    program = executor.program
    body = list(program.body)
    at = [node.name for node in body].index("unroll") + 1
    body.insert(at, Stage("scale_rewards", scale_rewards_by_batch_std, ("unrolls",), ("unrolls", "reward_scale"),
                          "learner", group_local=True))
    body.insert(at + 1, Stage("note_scale", note_scale, ("reward_scale",), ("reward_scale_noted",), "logging"))
    return dataclasses.replace(program, body=tuple(body))
