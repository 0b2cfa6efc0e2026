"""Policy and value networks (Flax), used only through pure `apply` functions.

Layer layout, initialisation (LeCun uniform) and activation match brax's `make_ppo_networks`, so a
jaxrose and a brax run start from networks of the same family.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxrose import distribution, normalization
from jaxrose.config import NetworkConfig

ACTIVATIONS: dict[str, Callable] = {"swish": nn.swish, "relu": nn.relu, "tanh": nn.tanh, "elu": nn.elu}


class MLP(nn.Module):
    layer_sizes: Sequence[int]
    activation: Callable = nn.swish

    @nn.compact
    def __call__(self, x):
        for i, size in enumerate(self.layer_sizes):
            x = nn.Dense(size, name=f"hidden_{i}", kernel_init=jax.nn.initializers.lecun_uniform())(x)
            if i < len(self.layer_sizes) - 1:
                x = self.activation(x)
        return x


class Params(NamedTuple):
    policy: Any
    value: Any


class ActorCritic(NamedTuple):
    """Pure functions over (params, normalizer, obs); obs may carry any leading batch shape."""

    init: Callable[[jax.Array], Params]
    policy_logits: Callable[[Params, normalization.RunningStats, jax.Array], jax.Array]
    value: Callable[[Params, normalization.RunningStats, jax.Array], jax.Array]
    act: Callable  # (params, normalizer, obs, key) -> (action, extras)
    act_deterministic: Callable  # (params, normalizer, obs) -> action


def make_actor_critic(observation_size: int, action_size: int, config: NetworkConfig,
                      normalize_observations: bool = True) -> ActorCritic:
    activation = ACTIVATIONS[config.activation]
    policy_net = MLP(list(config.policy_hidden) + [2 * action_size], activation)
    value_net = MLP(list(config.value_hidden) + [1], activation)
    preprocess = normalization.normalize if normalize_observations else (lambda stats, obs: obs)

    def init(key):
        policy_key, value_key = jax.random.split(key)
        dummy = jnp.zeros((1, observation_size))
        return Params(policy_net.init(policy_key, dummy), value_net.init(value_key, dummy))

    def policy_logits(params, stats, obs):
        return policy_net.apply(params.policy, preprocess(stats, obs))

    def value(params, stats, obs):
        return jnp.squeeze(value_net.apply(params.value, preprocess(stats, obs)), axis=-1)

    def act(params, stats, obs, key):
        logits = policy_logits(params, stats, obs)
        raw_action = distribution.sample_raw(logits, key)
        extras = {"raw_action": raw_action, "log_prob": distribution.log_prob(logits, raw_action)}
        return distribution.postprocess(raw_action), extras

    def act_deterministic(params, stats, obs):
        return distribution.mode(policy_logits(params, stats, obs))

    return ActorCritic(init, policy_logits, value, act, act_deterministic)
