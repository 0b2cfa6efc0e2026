"""GAE, the distribution, the normalizer and the PPO loss against independent references:
a plain Python loop, hand arithmetic, numpy, and brax's own implementation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrose import distribution, normalization
from jaxrose.config import NetworkConfig, PPOConfig
from jaxrose.networks import make_actor_critic
from jaxrose.ppo import Batch, compute_gae, ppo_loss


def gae_python_loop(truncation, termination, rewards, values, bootstrap, lam, gamma):
    """Textbook GAE written as a loop, with brax's truncation masking."""
    T, B = rewards.shape
    advantages = np.zeros((T, B))
    vs = np.zeros((T, B))
    for b in range(B):
        acc = 0.0
        for t in reversed(range(T)):
            next_value = values[t + 1, b] if t + 1 < T else bootstrap[b]
            mask = 1.0 - truncation[t, b]
            delta = (rewards[t, b] + gamma * (1 - termination[t, b]) * next_value - values[t, b]) * mask
            acc = delta + gamma * (1 - termination[t, b]) * mask * lam * acc
            vs[t, b] = acc + values[t, b]
        for t in range(T):
            next_vs = vs[t + 1, b] if t + 1 < T else bootstrap[b]
            advantages[t, b] = (rewards[t, b] + gamma * (1 - termination[t, b]) * next_vs - values[t, b]) * (
                1.0 - truncation[t, b])
    return vs, advantages


def random_trajectory(seed, T=7, B=5):
    rng = np.random.default_rng(seed)
    done = (rng.random((T, B)) < 0.25).astype(np.float32)
    truncation = done * (rng.random((T, B)) < 0.5)
    termination = done * (1 - truncation)
    return (truncation.astype(np.float32), termination.astype(np.float32),
            rng.normal(size=(T, B)).astype(np.float32), rng.normal(size=(T, B)).astype(np.float32),
            rng.normal(size=B).astype(np.float32))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_python_loop(seed):
    truncation, termination, rewards, values, bootstrap = random_trajectory(seed)
    vs, adv = compute_gae(truncation, termination, rewards, values, bootstrap, 0.95, 0.97)
    ref_vs, ref_adv = gae_python_loop(truncation, termination, rewards, values, bootstrap, 0.95, 0.97)
    np.testing.assert_allclose(vs, ref_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)


def vtrace_python_loop(truncation, termination, rewards, values, bootstrap, lam, gamma, ratio, rho_bar):
    """V-trace targets (Espeholt et al. 2018, eq. 1) as a loop over the textbook sum
    v_s = V(x_s) + sum_t gamma^(t-s) (prod_{s<=i<t} lam * c_i) rho_t delta_t, with rho_t = min(rho_bar, r_t),
    c_i = min(1, r_i), cut where an episode ends or is truncated (brax's masking)."""
    T, B = rewards.shape
    vs = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            total, coefficient = 0.0, 1.0
            for t in range(s, T):
                next_value = values[t + 1, b] if t + 1 < T else bootstrap[b]
                mask = 1.0 - truncation[t, b]
                delta = (rewards[t, b] + gamma * (1 - termination[t, b]) * next_value - values[t, b]) * mask
                total += coefficient * min(rho_bar, ratio[t, b]) * delta
                coefficient *= gamma * (1 - termination[t, b]) * mask * lam * min(1.0, ratio[t, b])
            vs[s, b] = values[s, b] + total
    return vs


@pytest.mark.parametrize("seed", [0, 1])
def test_vtrace_targets_match_python_loop(seed):
    truncation, termination, rewards, values, bootstrap = random_trajectory(seed)
    ratio = np.exp(np.random.default_rng(seed + 10).normal(scale=0.7, size=rewards.shape)).astype(np.float32)
    rho_bar = 1.5
    vs, adv = compute_gae(truncation, termination, rewards, values, bootstrap, 0.9, 0.97,
                          rho=np.minimum(ratio, rho_bar), trace=np.minimum(ratio, 1.0))
    ref_vs = vtrace_python_loop(truncation, termination, rewards, values, bootstrap, 0.9, 0.97, ratio, rho_bar)
    np.testing.assert_allclose(vs, ref_vs, rtol=1e-5, atol=1e-5)
    next_vs = np.concatenate([ref_vs[1:], bootstrap[None]])
    ref_adv = (rewards + 0.97 * (1 - termination) * next_vs - values) * (1 - truncation)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
    ones = np.ones_like(ratio)  # at ratio one V-trace is GAE
    for a, b in zip(compute_gae(truncation, termination, rewards, values, bootstrap, 0.9, 0.97, ones, ones),
                    gae_python_loop(truncation, termination, rewards, values, bootstrap, 0.9, 0.97)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_gae_matches_brax():
    from brax.training.agents.ppo.losses import compute_gae as brax_gae

    args = random_trajectory(7, T=11, B=9)
    ours = compute_gae(*args, lambda_=0.9, discount=0.99)
    theirs = brax_gae(*args, lambda_=0.9, discount=0.99)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_gae_hand_computation():
    # One env, two steps, no done, lambda=1, gamma=0.5: rewards (1, 2), values (0, 0), bootstrap 4.
    # vs_1 = 2 + 0.5*4 = 4; vs_0 = 1 + 0.5*4 = 3; advantages equal vs since values are 0.
    z = jnp.zeros((2, 1))
    vs, adv = compute_gae(z, z, jnp.array([[1.0], [2.0]]), z, jnp.array([4.0]), 1.0, 0.5)
    np.testing.assert_allclose(vs[:, 0], [3.0, 4.0])
    np.testing.assert_allclose(adv[:, 0], [3.0, 4.0])


def test_distribution_matches_brax():
    from brax.training.distribution import NormalTanhDistribution

    brax_dist = NormalTanhDistribution(event_size=3)
    logits = jax.random.normal(jax.random.PRNGKey(0), (10, 6))
    raw = jax.random.normal(jax.random.PRNGKey(1), (10, 3))
    key = jax.random.PRNGKey(2)
    np.testing.assert_allclose(distribution.log_prob(logits, raw), brax_dist.log_prob(logits, raw), rtol=1e-5)
    np.testing.assert_allclose(distribution.entropy(logits, key), brax_dist.entropy(logits, key), rtol=1e-5)
    np.testing.assert_allclose(distribution.sample_raw(logits, key),
                               brax_dist.sample_no_postprocessing(logits, key), rtol=1e-6)
    np.testing.assert_allclose(distribution.mode(logits), brax_dist.mode(logits), rtol=1e-6)


def test_log_prob_hand_computation():
    # loc 0, raw scale s with softplus(s) + 1e-3 = 1 and raw action 0: log N(0; 0, 1) = -0.5 log(2 pi),
    # and the tanh Jacobian at 0 is log(1 - tanh(0)^2) = 0.
    raw_scale = np.log(np.expm1(1.0 - 1e-3))
    logits = jnp.array([0.0, raw_scale])
    np.testing.assert_allclose(distribution.log_prob(logits, jnp.array([0.0])), -0.5 * np.log(2 * np.pi),
                               rtol=1e-6)


def test_normalizer_matches_numpy_and_brax():
    from brax.training.acme import running_statistics as brax_rs
    from brax.training.acme import specs

    rng = np.random.default_rng(0)
    batches = [rng.normal(loc=3.0, scale=2.0, size=(4, 8, 5)).astype(np.float32) for _ in range(3)]
    stats = normalization.init(5)
    brax_stats = brax_rs.init_state(specs.Array((5,), jnp.float32))
    for batch in batches:
        stats = normalization.update(stats, jnp.asarray(batch))
        brax_stats = brax_rs.update(brax_stats, jnp.asarray(batch))
    everything = np.concatenate([b.reshape(-1, 5) for b in batches])
    np.testing.assert_allclose(stats.mean, everything.mean(0), rtol=1e-5)
    np.testing.assert_allclose(stats.std, everything.std(0), rtol=1e-4)
    np.testing.assert_allclose(stats.std, brax_stats.std, rtol=1e-5)
    obs = jnp.asarray(batches[0][0])
    np.testing.assert_allclose(normalization.normalize(stats, obs), brax_rs.normalize(obs, brax_stats), rtol=1e-5)


def test_ppo_loss_terms_by_hand():
    """With a batch whose behaviour log-probs equal the current ones (ratio 1), the policy loss is
    -mean(normalized advantages) = 0, and the value loss is 0.5 * vf * mean((vs - v)^2) from our GAE."""
    net = make_actor_critic(3, 2, NetworkConfig(policy_hidden=(8,), value_hidden=(8,)), normalize_observations=False)
    params = net.init(jax.random.PRNGKey(0))
    stats = normalization.init(3)
    B, T = 4, 5
    key = jax.random.PRNGKey(1)
    obs = jax.random.normal(key, (B, T, 3))
    logits = net.policy_logits(params, stats, obs)
    raw = distribution.sample_raw(logits, jax.random.PRNGKey(2))
    batch = Batch(obs=obs, raw_action=raw, log_prob=distribution.log_prob(logits, raw),
                  reward=jax.random.normal(jax.random.PRNGKey(3), (B, T)), discount=jnp.ones((B, T)),
                  truncation=jnp.zeros((B, T)), last_obs=jax.random.normal(jax.random.PRNGKey(4), (B, 3)))
    config = PPOConfig(entropy_cost=0.1, vf_loss_coefficient=0.5, discounting=0.9, gae_lambda=0.8)
    loss, m = ppo_loss(params, stats, batch, jax.random.PRNGKey(5), net, config)

    values = np.asarray(net.value(params, stats, obs))
    bootstrap = np.asarray(net.value(params, stats, batch.last_obs))
    zeros = np.zeros((T, B))
    vs, _ = gae_python_loop(zeros, zeros, np.asarray(batch.reward).T, values.T, bootstrap, 0.8, 0.9)
    expected_value_loss = 0.5 * 0.5 * np.mean((vs.T - values) ** 2)
    expected_entropy_loss = -0.1 * np.mean(distribution.entropy(logits, jax.random.PRNGKey(5)))
    np.testing.assert_allclose(m["policy_loss"], 0.0, atol=1e-6)
    np.testing.assert_allclose(m["value_loss"], expected_value_loss, rtol=1e-5)
    np.testing.assert_allclose(m["entropy_loss"], expected_entropy_loss, rtol=1e-5)
    np.testing.assert_allclose(loss, m["policy_loss"] + m["value_loss"] + m["entropy_loss"], rtol=1e-6)
    np.testing.assert_allclose(m["clip_fraction"], 0.0)


def test_policy_loss_clips_by_hand():
    """Advantage sign and ratio clipping: with behaviour log-probs shifted by log(2), ratio = 2 for every
    sample; clipped at 1.3 for positive advantages and kept at 2 for negative ones (min of the two)."""
    net = make_actor_critic(2, 1, NetworkConfig(policy_hidden=(4,), value_hidden=(4,)), normalize_observations=False)
    params = net.init(jax.random.PRNGKey(0))
    stats = normalization.init(2)
    obs = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 2))
    logits = net.policy_logits(params, stats, obs)
    raw = distribution.sample_raw(logits, jax.random.PRNGKey(2))
    batch = Batch(obs=obs, raw_action=raw, log_prob=distribution.log_prob(logits, raw) - np.log(2.0),
                  reward=jax.random.normal(jax.random.PRNGKey(3), (2, 3)), discount=jnp.ones((2, 3)),
                  truncation=jnp.zeros((2, 3)), last_obs=obs[:, -1])
    config = PPOConfig(clipping_epsilon=0.3, gae_lambda=0.9, discounting=0.9)
    _, m = ppo_loss(params, stats, batch, jax.random.PRNGKey(5), net, config)
    values = np.asarray(net.value(params, stats, obs))
    bootstrap = np.asarray(net.value(params, stats, batch.last_obs))
    zeros = np.zeros((3, 2))
    _, adv = gae_python_loop(zeros, zeros, np.asarray(batch.reward).T, values.T, bootstrap, 0.9, 0.9)
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    expected = -np.mean(np.minimum(2.0 * adv, 1.3 * adv))
    np.testing.assert_allclose(m["policy_loss"], expected, rtol=1e-4)
    np.testing.assert_allclose(m["clip_fraction"], 1.0)


def _loss_batch(shift_behaviour: float):
    net = make_actor_critic(3, 2, NetworkConfig(policy_hidden=(8,), value_hidden=(8,)), normalize_observations=False)
    params, stats = net.init(jax.random.PRNGKey(0)), normalization.init(3)
    obs = jax.random.normal(jax.random.PRNGKey(1), (4, 5, 3))
    logits = net.policy_logits(params, stats, obs)
    raw = distribution.sample_raw(logits, jax.random.PRNGKey(2))
    current = distribution.log_prob(logits, raw)
    batch = Batch(obs=obs, raw_action=raw, log_prob=current - shift_behaviour,
                  reward=jax.random.normal(jax.random.PRNGKey(3), (4, 5)), discount=jnp.ones((4, 5)),
                  truncation=jnp.zeros((4, 5)), last_obs=obs[:, -1])
    return net, params, stats, batch, current


def test_decoupled_loss_with_lag_zero_is_ppo():
    """A proximal policy equal to the behaviour policy (lag 0) gives exactly PPO's loss and gradient."""
    net, params, stats, batch, _ = _loss_batch(0.3)
    config = PPOConfig(max_off_policy_weight=2.0)
    plain = jax.value_and_grad(ppo_loss, has_aux=True)(params, stats, batch, jax.random.PRNGKey(5), net, config)
    lagged = batch.replace(proximal_log_prob=batch.log_prob)
    decoupled = jax.value_and_grad(ppo_loss, has_aux=True)(params, stats, lagged, jax.random.PRNGKey(5), net, config)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(decoupled)):
        np.testing.assert_array_equal(a, b)


def test_decoupled_loss_weights_stale_samples_by_hand():
    """Behaviour log-probs log(2) below the proximal ones (the current policy): the trust region is
    around the proximal policy (ratio 1, nothing clipped) and each sample is weighted by
    min(pi_prox / mu, c) = min(2, 1.5) = 1.5, so the policy loss is -1.5 * mean(normalized advantages) = 0
    for the mean, and exactly 1.5 times PPO's surrogate in its gradient."""
    net, params, stats, batch, current = _loss_batch(np.log(2.0))
    config = PPOConfig(max_off_policy_weight=1.5)
    lagged = batch.replace(proximal_log_prob=current)
    _, metrics = ppo_loss(params, stats, lagged, jax.random.PRNGKey(5), net, config)
    np.testing.assert_allclose(metrics["off_policy_weight"], 1.5, rtol=1e-6)
    np.testing.assert_allclose(metrics["clip_fraction"], 0.0)
    on_policy = batch.replace(log_prob=current)
    policy_grad = lambda b: jax.grad(lambda p: ppo_loss(p, stats, b, jax.random.PRNGKey(5), net,
                                                         PPOConfig(entropy_cost=0.0, vf_loss_coefficient=0.0,
                                                                   max_off_policy_weight=1.5))[0])(params)
    for a, b in zip(jax.tree.leaves(policy_grad(lagged).policy), jax.tree.leaves(policy_grad(on_policy).policy)):
        np.testing.assert_allclose(a, 1.5 * b, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("correction", ["decoupled", "vtrace", "behaviour"])
def test_every_off_policy_correction_is_ppo_at_lag_zero(correction):
    """A proximal policy equal to the behaviour policy (lag 0): each correction gives PPO's loss and
    gradient (V-trace's weights are all one)."""
    net, params, stats, batch, _ = _loss_batch(0.3)
    plain = jax.value_and_grad(ppo_loss, has_aux=True)(params, stats, batch, jax.random.PRNGKey(5), net, PPOConfig())
    lagged = batch.replace(proximal_log_prob=batch.log_prob)
    config = PPOConfig(off_policy_correction=correction, max_off_policy_weight=2.0)
    corrected = jax.value_and_grad(ppo_loss, has_aux=True)(params, stats, lagged, jax.random.PRNGKey(5), net, config)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(corrected)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_behaviour_correction_ignores_the_proximal_policy():
    """`behaviour` takes a stale batch as on-policy: the same loss as the batch without proximal
    log-probs, where `decoupled` differs (its trust region is around the proximal policy)."""
    net, params, stats, batch, current = _loss_batch(np.log(2.0))
    lagged = batch.replace(proximal_log_prob=current)
    loss = lambda b, c: ppo_loss(params, stats, b, jax.random.PRNGKey(5), net, PPOConfig(off_policy_correction=c))
    behaviour, _ = loss(lagged, "behaviour")
    assert float(behaviour) == float(loss(batch, "decoupled")[0])
    assert float(behaviour) != float(loss(lagged, "decoupled")[0])


def test_vtrace_correction_uses_vtrace_value_targets():
    """With `vtrace`, the value loss is to V-trace's targets (from the proximal/behaviour ratio),
    computed here by the Python loop; `decoupled` keeps GAE's."""
    net, params, stats, batch, current = _loss_batch(0.0)
    ratio_noise = jax.random.normal(jax.random.PRNGKey(9), current.shape) * 0.5
    lagged = batch.replace(log_prob=current - ratio_noise, proximal_log_prob=current)
    ppo = PPOConfig(off_policy_correction="vtrace", max_off_policy_weight=1.3, gae_lambda=0.9, discounting=0.9)
    _, metrics = ppo_loss(params, stats, lagged, jax.random.PRNGKey(5), net, ppo)
    values = np.asarray(net.value(params, stats, batch.obs)).T
    bootstrap = np.asarray(net.value(params, stats, batch.last_obs))
    zeros = np.zeros_like(values)
    ratio = np.exp(np.asarray(ratio_noise)).T
    vs = vtrace_python_loop(zeros, zeros, np.asarray(batch.reward).T, values, bootstrap, 0.9, 0.9, ratio, 1.3)
    np.testing.assert_allclose(metrics["value_loss"], 0.5 * 0.5 * np.mean(np.square(vs - values)), rtol=1e-4)
    _, decoupled = ppo_loss(params, stats, lagged, jax.random.PRNGKey(5), net,
                            PPOConfig(max_off_policy_weight=1.3, gae_lambda=0.9, discounting=0.9))
    assert abs(float(decoupled["value_loss"]) - float(metrics["value_loss"])) > 1e-6


def test_surrogate_stays_finite_when_one_update_moves_a_log_prob_far():
    """A sample whose log-prob moved by 100 within one update (a scale near its floor) overflows
    exp in float32; the clipped log-ratio keeps the loss and its gradient finite, and for ordinary
    ratios the surrogate is PPO's, computed by hand."""
    from jaxrose.ppo import _clipped_surrogate

    ppo = PPOConfig(clipping_epsilon=0.2)
    anchor = jnp.zeros((4,))
    batch = Batch(obs=None, raw_action=None, log_prob=anchor, reward=None, discount=None, truncation=None,
                  last_obs=None)
    advantages = jnp.array([-1.0, 1.0, -1.0, 1.0])

    def loss(new_log_prob):
        return _clipped_surrogate(new_log_prob, batch, advantages, ppo)[0]

    far = jnp.array([100.0, 100.0, -100.0, 0.1])
    value, grad = jax.value_and_grad(loss)(far)
    assert np.isfinite(float(value)) and np.all(np.isfinite(np.asarray(grad)))
    near = jnp.array([0.1, 0.1, -0.1, 0.1])
    r = np.exp(np.array([0.1, 0.1, -0.1, 0.1]))
    by_hand = -np.mean(np.minimum(r * advantages, np.clip(r, 0.8, 1.2) * advantages))
    np.testing.assert_allclose(float(loss(near)), by_hand, rtol=1e-6)


def test_truncation_bootstrap_by_hand_and_blind_to_other_steps_final_obs():
    """bootstrap_on_truncation adds gamma * V(final_obs) to the reward of truncated steps only, then
    treats every done as a termination: checked against the Python GAE loop. A step that ended any other
    way has no meaningful final_obs (NaN after a diverged physics state): the loss must not read it."""
    net, params, stats, batch, _ = _loss_batch(0.0)
    B, T = batch.reward.shape
    truncation = jnp.zeros((B, T)).at[1, 2].set(1.0)
    discount = jnp.ones((B, T)).at[1, 2].set(0.0).at[2, 3].set(0.0)  # [2, 3] terminates
    final_obs = jax.random.normal(jax.random.PRNGKey(9), (B, T, 3)).at[2, 3].set(jnp.nan)
    batch = batch.replace(truncation=truncation, discount=discount, final_obs=final_obs)
    config = PPOConfig(bootstrap_on_truncation=True, discounting=0.9, gae_lambda=0.8)
    loss, m = ppo_loss(params, stats, batch, jax.random.PRNGKey(5), net, config)
    assert np.isfinite(float(loss))

    values = np.asarray(net.value(params, stats, batch.obs))
    bootstrap = np.asarray(net.value(params, stats, batch.last_obs))
    rewards = np.asarray(batch.reward).copy()
    rewards[1, 2] += 0.9 * float(net.value(params, stats, final_obs[1, 2]))
    termination = 1.0 - np.asarray(discount)
    vs, _ = gae_python_loop(np.zeros((T, B)), termination.T, rewards.T, values.T, bootstrap, 0.8, 0.9)
    np.testing.assert_allclose(m["value_loss"], 0.5 * 0.5 * np.mean((vs.T - values) ** 2), rtol=1e-5)
