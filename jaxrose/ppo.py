"""PPO's data types, loss and GAE. The learner (`init` / `update`) is built from these in
`jaxrose.ppo_program`, as the learner stages of PPO's `Program`.

Semantics are brax's PPO (`brax.training.agents.ppo`): observation statistics are updated with the
whole batch before the epochs; each epoch shuffles the segments and splits them into minibatches;
GAE is recomputed inside the loss for every minibatch with the current value network; advantages
are normalised per minibatch; the policy loss is the clipped surrogate, the value loss 0.5·vf·MSE
to the GAE targets, the entropy bonus brax's one-sample estimate.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxrose import distribution, normalization
from jaxrose.config import PPOConfig
from jaxrose.networks import ActorCritic, Params


@struct.dataclass
class Batch:
    """Trajectory segments, leading axes [segments, unroll_length]."""

    obs: jax.Array
    raw_action: jax.Array
    log_prob: jax.Array
    reward: jax.Array
    discount: jax.Array  # 1 - done
    truncation: jax.Array
    last_obs: jax.Array  # [segments, obs]: the observation after the segment's last step
    final_obs: Optional[jax.Array] = None  # obs reached before an auto-reset; only to bootstrap truncation
    proximal_log_prob: Optional[jax.Array] = None
    """Log-probs under the learner's policy when the update starts, for batches collected with older
    parameters (asynchronous mode); None means the behaviour policy is the proximal one (lag 0)."""


@struct.dataclass
class LearnerState:
    params: Params
    opt_state: Any
    normalizer: normalization.RunningStats
    key: jax.Array


class Learner(NamedTuple):
    init: Callable[[jax.Array], LearnerState]
    update: Callable[[LearnerState, Batch], tuple[LearnerState, dict]]


def compute_gae(truncation, termination, rewards, values, bootstrap_value, lambda_: float, discount: float,
                rho=None, trace=None):
    """GAE over time-major [T, B] arrays, as brax computes it: returns (value targets, advantages).

    Truncated steps are masked out of the deltas and cut the recursion, so a time limit neither
    bootstraps through the reset nor counts as a failure. `rho` and `trace` ([T, B], default ones)
    make these V-trace's off-policy targets: each TD error is weighted by its truncated importance
    weight rho_t and the lambda-trace through step t is cut by c_t (Espeholt et al. 2018, eq. 1, with
    c_t = lambda * trace_t); with both at one they are GAE's exactly.
    """
    truncation_mask = 1.0 - truncation
    values_next = jnp.concatenate([values[1:], bootstrap_value[None]], axis=0)
    deltas = (rewards + discount * (1.0 - termination) * values_next - values) * truncation_mask
    if rho is not None:
        deltas = deltas * rho
    trace = jnp.ones_like(deltas) if trace is None else trace

    def backward(acc, xs):
        mask, delta, term, c = xs
        acc = delta + discount * (1.0 - term) * mask * lambda_ * c * acc
        return acc, acc

    _, vs_minus_v = jax.lax.scan(backward, jnp.zeros_like(bootstrap_value),
                                 (truncation_mask, deltas, termination, trace), reverse=True)
    vs = vs_minus_v + values
    vs_next = jnp.concatenate([vs[1:], bootstrap_value[None]], axis=0)
    advantages = (rewards + discount * (1.0 - termination) * vs_next - values) * truncation_mask
    return jax.lax.stop_gradient(vs), jax.lax.stop_gradient(advantages)


def ppo_loss(params: Params, normalizer, batch: Batch, key: jax.Array, net: ActorCritic, config: PPOConfig):
    """The PPO loss of one minibatch (leading axes [B, T]); returns (loss, metrics)."""
    logits = net.policy_logits(params, normalizer, batch.obs)
    values = net.value(params, normalizer, batch.obs)
    bootstrap_value = net.value(params, normalizer, batch.last_obs)

    rewards = batch.reward * config.reward_scaling
    truncation = batch.truncation
    termination = (1.0 - batch.discount) * (1.0 - truncation)
    if config.bootstrap_on_truncation:
        # Close a truncated episode with the value of the state it reached: the env continues.
        final_values = jax.lax.stop_gradient(net.value(params, normalizer, batch.final_obs))
        # where, not a product: a step that ended on a non-finite state has NaN final values (0 * NaN = NaN).
        rewards = rewards + config.discounting * jnp.where(truncation > 0, final_values, 0.0)
        termination = 1.0 - batch.discount
        truncation = jnp.zeros_like(truncation)

    rho = trace = None
    if config.off_policy_correction == "vtrace" and batch.proximal_log_prob is not None:
        ratio = jnp.exp(jnp.clip(batch.proximal_log_prob - batch.log_prob, -20.0, 20.0)).T
        rho, trace = jnp.minimum(ratio, config.max_off_policy_weight), jnp.minimum(ratio, 1.0)
    vs, advantages = compute_gae(truncation.T, termination.T, rewards.T, values.T, bootstrap_value,
                                 config.gae_lambda, config.discounting, rho, trace)
    vs, advantages = vs.T, advantages.T
    if config.normalize_advantage:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

    new_log_prob = distribution.log_prob(logits, batch.raw_action)
    policy_loss, off_policy_weight = _clipped_surrogate(new_log_prob, batch, advantages, config)
    value_loss = 0.5 * config.vf_loss_coefficient * jnp.mean(jnp.square(vs - values))
    entropy = jnp.mean(distribution.entropy(logits, key))
    entropy_loss = -config.entropy_cost * entropy
    total = policy_loss + value_loss + entropy_loss
    metrics = {
        "total_loss": total,
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy_loss": entropy_loss,
        "approx_kl": jnp.mean(batch.log_prob - new_log_prob),
        "clip_fraction": jnp.mean((jnp.abs(jnp.exp(new_log_prob - _anchor(batch, config)) - 1.0)
                                   > config.clipping_epsilon).astype(jnp.float32)),
        "off_policy_weight": jnp.mean(off_policy_weight),
    }
    return total, metrics


def _corrected(batch: Batch, config: PPOConfig) -> bool:
    """Whether the loss corrects for a stale behaviour policy (a proximal one exists and is used)."""
    return batch.proximal_log_prob is not None and config.off_policy_correction != "behaviour"


def _anchor(batch: Batch, config: PPOConfig) -> jax.Array:
    return batch.proximal_log_prob if _corrected(batch, config) else batch.log_prob


def _clipped_surrogate(new_log_prob, batch: Batch, advantages, config: PPOConfig):
    """PPO's clipped surrogate, decoupled for stale data (Hilton et al., "Batch size-invariance for
    policy optimization"): the trust region is taken around the proximal policy (the learner's own
    policy when the update starts), and the gap between it and the stale behaviour policy is
    corrected by an importance weight truncated at `ppo.max_off_policy_weight`, as V-trace does.
    Without a proximal policy (lag 0) both policies coincide, the weight is 1 and this is PPO's loss
    exactly; so it is with `ppo.off_policy_correction='behaviour'` (the ablation that ignores
    staleness). The log-ratio is clipped to +-20 before `exp`: with a scale near its floor (1e-3) one
    update can move a sample's log-prob by hundreds, the ratio overflows float32 and its gradient
    turns NaN (seen with many SGD steps per update, a batch grown with its minibatch size kept);
    such a sample lies far outside the trust region either way, and healthy updates never reach it."""
    anchor = _anchor(batch, config)
    weight = jnp.ones_like(anchor)
    if _corrected(batch, config):
        weight = jnp.minimum(jnp.exp(batch.proximal_log_prob - batch.log_prob), config.max_off_policy_weight)
        weight = jax.lax.stop_gradient(weight)
    ratio = jnp.exp(jnp.clip(new_log_prob - anchor, -20.0, 20.0))
    clipped = jnp.clip(ratio, 1.0 - config.clipping_epsilon, 1.0 + config.clipping_epsilon)
    return -jnp.mean(weight * jnp.minimum(ratio * advantages, clipped * advantages)), weight


def make_optimizer(config: PPOConfig) -> optax.GradientTransformation:
    adam = optax.adam(config.learning_rate)
    if config.max_grad_norm is None:
        return adam
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adam)
