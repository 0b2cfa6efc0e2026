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
    dtype: Any = jnp.float32  # computation; parameters are float32 whatever this is

    @nn.compact
    def __call__(self, x):
        for i, size in enumerate(self.layer_sizes):
            x = nn.Dense(size, name=f"hidden_{i}", kernel_init=jax.nn.initializers.lecun_uniform(),
                         dtype=self.dtype)(x)
            if i < len(self.layer_sizes) - 1:
                x = self.activation(x)
        return x.astype(jnp.float32)


class CausalTransformer(nn.Module):
    """A causal transformer over `history` observation tokens; the last token's output is the head.

    Pre-norm blocks (attention, then a 4× MLP), learned positions. It stands in for the large
    vision-language-action policies of embodied RL: its inference cost is set by depth × width ×
    history, independently of the task.
    """

    history: int
    depth: int
    width: int
    heads: int
    out_size: int
    dtype: Any = jnp.float32  # computation; parameters are float32 whatever this is

    @nn.compact
    def __call__(self, obs):
        tokens = obs.reshape(obs.shape[:-1] + (self.history, obs.shape[-1] // self.history))
        dtype = self.dtype
        x = nn.Dense(self.width, name="embed", dtype=dtype)(tokens)
        x = x + self.param("positions", nn.initializers.normal(0.02), (self.history, self.width)).astype(dtype)
        mask = nn.make_causal_mask(jnp.ones(tokens.shape[:-1], dtype=jnp.int32))
        for i in range(self.depth):
            y = nn.LayerNorm(name=f"ln_attn_{i}", dtype=dtype)(x)
            x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads, name=f"attn_{i}", dtype=dtype)(y, y, mask=mask)
            y = nn.LayerNorm(name=f"ln_mlp_{i}", dtype=dtype)(x)
            y = nn.Dense(4 * self.width, name=f"mlp_up_{i}", dtype=dtype)(y)
            x = x + nn.Dense(self.width, name=f"mlp_down_{i}", dtype=dtype)(nn.gelu(y))
        head = nn.Dense(self.out_size, name="head", dtype=dtype)(nn.LayerNorm(name="ln_out", dtype=dtype)(x[..., -1, :]))
        return head.astype(jnp.float32)  # the distribution and the loss work in float32


class Params(NamedTuple):
    policy: Any
    value: Any


class ActorCritic(NamedTuple):
    """Pure functions over (params, normalizer, obs); obs may carry any leading batch shape."""

    init: Callable[[jax.Array], Params]
    policy_logits: Callable[[Params, normalization.RunningStats, jax.Array], jax.Array]
    value: Callable[[Params, normalization.RunningStats, jax.Array], jax.Array]
    act: Callable  # (params, normalizer, obs, key, group_slice=None) -> (action, extras)
    act_deterministic: Callable  # (params, normalizer, obs) -> action


def make_actor_critic(observation_size: int, action_size: int, config: NetworkConfig,
                      normalize_observations: bool = True) -> ActorCritic:
    activation = ACTIVATIONS[config.activation]
    dtype = jnp.dtype(config.compute_dtype)
    if config.policy == "transformer":
        if observation_size % config.history:
            raise ValueError(f"The observation size {observation_size} is not {config.history} (network.history) "
                             f"whole observations; wrap the env with HistoryWrapper(env, network.history).")
        policy_net = CausalTransformer(config.history, config.transformer_depth, config.transformer_width,
                                       config.transformer_heads, 2 * action_size, dtype)
    else:
        policy_net = MLP(list(config.policy_hidden) + [2 * action_size], activation, dtype)
    value_net = MLP(list(config.value_hidden) + [1], activation, dtype)
    preprocess = normalization.normalize if normalize_observations else (lambda stats, obs: obs)

    def init(key):
        policy_key, value_key = jax.random.split(key)
        dummy = jnp.zeros((1, observation_size))
        return Params(policy_net.init(policy_key, dummy), value_net.init(value_key, dummy))

    def policy_logits(params, stats, obs):
        return policy_net.apply(params.policy, preprocess(stats, obs))

    def value(params, stats, obs):
        return jnp.squeeze(value_net.apply(params.value, preprocess(stats, obs)), axis=-1)

    def act(params, stats, obs, key, group_slice=None):
        logits = policy_logits(params, stats, obs)
        raw_action = distribution.sample_raw(logits, key, group_slice)
        extras = {"raw_action": raw_action, "log_prob": distribution.log_prob(logits, raw_action)}
        return distribution.postprocess(raw_action), extras

    def act_deterministic(params, stats, obs):
        return distribution.mode(policy_logits(params, stats, obs))

    return ActorCritic(init, policy_logits, value, act, act_deterministic)
