"""The tanh-squashed Gaussian of brax's PPO, as pure functions of the network's output.

The network emits [loc, raw_scale]; scale = softplus(raw_scale) + 0.001. Sampling happens before
the tanh (the "raw" action); log-probabilities include the tanh Jacobian, and the entropy is
brax's one-sample estimate of it.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

MIN_STD = 1e-3


def split_params(logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    loc, raw_scale = jnp.split(logits, 2, axis=-1)
    return loc, jax.nn.softplus(raw_scale) + MIN_STD


def _tanh_log_det_jacobian(raw: jax.Array) -> jax.Array:
    # log(1 - tanh(x)^2), written stably.
    return 2.0 * (jnp.log(2.0) - raw - jax.nn.softplus(-2.0 * raw))


def sample_raw(logits: jax.Array, key: jax.Array, group_slice: Optional[tuple[int, int, int]] = None) -> jax.Array:
    """A raw (pre-tanh) sample. `group_slice=(start, count, total)`: `logits` are groups
    `start .. start + count` of `total` (leading axis); the noise is that slice of the noise drawn
    for all groups, so a process that holds some groups samples exactly what one holding all would."""
    loc, scale = split_params(logits)
    if group_slice is None:
        return loc + scale * jax.random.normal(key, loc.shape)
    start, count, total = group_slice
    noise = jax.random.normal(key, (total,) + loc.shape[1:])
    return loc + scale * jax.lax.dynamic_slice_in_dim(noise, start, count, axis=0)


def mode(logits: jax.Array) -> jax.Array:
    return jnp.tanh(split_params(logits)[0])


def postprocess(raw_action: jax.Array) -> jax.Array:
    return jnp.tanh(raw_action)


def log_prob(logits: jax.Array, raw_action: jax.Array) -> jax.Array:
    loc, scale = split_params(logits)
    gaussian = -0.5 * jnp.square((raw_action - loc) / scale) - 0.5 * jnp.log(2.0 * jnp.pi) - jnp.log(scale)
    return jnp.sum(gaussian - _tanh_log_det_jacobian(raw_action), axis=-1)


def entropy(logits: jax.Array, key: jax.Array) -> jax.Array:
    loc, scale = split_params(logits)
    gaussian = 0.5 + 0.5 * jnp.log(2.0 * jnp.pi) + jnp.log(scale)
    sample = loc + scale * jax.random.normal(key, loc.shape)
    return jnp.sum(gaussian + _tanh_log_det_jacobian(sample), axis=-1)
