"""Running observation statistics (Welford), with brax's PPO update rule and clipping.

The count is a float32: counts here are sums of equal batch sizes, exact in float32 far beyond any
run length that matters for a 1/count update rate.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

STD_MIN, STD_MAX = 1e-6, 1e6


@struct.dataclass
class RunningStats:
    count: jax.Array
    mean: jax.Array
    summed_variance: jax.Array
    std: jax.Array


def init(size: int) -> RunningStats:
    return RunningStats(jnp.zeros(()), jnp.zeros(size), jnp.zeros(size), jnp.ones(size))


def update(stats: RunningStats, batch: jax.Array) -> RunningStats:
    """Folds a batch [..., size] into the statistics (Welford's parallel update, as brax)."""
    batch = batch.reshape(-1, batch.shape[-1])
    count = stats.count + batch.shape[0]
    diff_to_old_mean = batch - stats.mean
    mean = stats.mean + jnp.sum(diff_to_old_mean, axis=0) / count
    summed_variance = stats.summed_variance + jnp.sum(diff_to_old_mean * (batch - mean), axis=0)
    std = jnp.clip(jnp.sqrt(jnp.maximum(summed_variance, 0.0) / count), STD_MIN, STD_MAX)
    return RunningStats(count, mean, summed_variance, std)


def normalize(stats: RunningStats, obs: jax.Array) -> jax.Array:
    return (obs - stats.mean) / stats.std
