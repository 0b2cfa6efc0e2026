"""Evaluation metrics checked by hand on a counting env whose outcome is known in advance."""

import jax
import jax.numpy as jnp
import numpy as np

from envs.core import Env, State
from jaxrose.config import NetworkConfig
from jaxrose.evaluation import make_evaluate
from jaxrose.networks import make_actor_critic


class CountingEnv(Env):
    """obs = [threshold, steps]; reward 1 per step; `success` while steps >= threshold, where each
    env draws its threshold in {1, ..., 6} at reset; it terminates once steps reach 4."""

    observation_size = 2
    action_size = 1

    def reset(self, key):
        threshold = jax.random.randint(key, (), 1, 7).astype(jnp.float32)
        obs = jnp.array([threshold, 0.0])
        return State(None, obs, jnp.zeros(()), jnp.zeros(()), {"success": jnp.zeros(())}, {})

    def step(self, state, action):
        steps = state.obs[1] + 1.0
        success = (steps >= state.obs[0]).astype(jnp.float32)
        done = (steps >= 4.0).astype(jnp.float32)
        return state.replace(obs=state.obs.at[1].set(steps), reward=jnp.ones(()), done=done,
                             metrics={"success": success})


def test_success_rate_is_the_share_of_episodes_ending_in_success():
    env, num_envs, episode_length = CountingEnv(), 64, 10
    net = make_actor_critic(2, 1, NetworkConfig(policy_hidden=(4,), value_hidden=(4,)), False)
    params = net.init(jax.random.PRNGKey(0))
    key = jax.random.PRNGKey(7)
    metrics = jax.device_get(make_evaluate(env, net, num_envs, episode_length, True)(params, None, key))
    # By hand: every episode lasts 4 steps (terminates), so its return and length are 4, and it ends
    # in success exactly when its threshold is <= 4. The thresholds are those the reset draws.
    reset_key = jax.random.split(key)[0]
    thresholds = np.array([float(jax.random.randint(k, (), 1, 7)) for k in jax.random.split(reset_key, num_envs)])
    assert metrics["episode_return"] == 4.0 and metrics["episode_length"] == 4.0
    np.testing.assert_allclose(metrics["success_rate"], np.mean(thresholds <= 4), rtol=1e-6)
    assert 0 < metrics["success_rate"] < 1


def test_tasks_without_success_report_none():
    from envs.pendulum import Pendulum

    net = make_actor_critic(3, 1, NetworkConfig(policy_hidden=(4,), value_hidden=(4,)), False)
    evaluate = make_evaluate(Pendulum(), net, 4, 5, True)
    metrics = evaluate(net.init(jax.random.PRNGKey(0)), None, jax.random.PRNGKey(1))
    assert set(metrics) == {"episode_return", "episode_return_std", "episode_length"}


def test_learning_curve_adds_a_success_panel(tmp_path):
    import json

    import matplotlib.image

    from jaxrose.plotting import plot_learning_curve

    records = [{"step": s, "eval/episode_return": r, "eval/success_rate": p}
               for s, r, p in [(0, 1.0, 0.0), (100, 2.0, 0.25), (200, 3.0, 0.75)]]
    (tmp_path / "with.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    (tmp_path / "without.jsonl").write_text("\n".join(json.dumps({k: v for k, v in r.items() if "success" not in k})
                                                      for r in records))
    wide = matplotlib.image.imread(plot_learning_curve(str(tmp_path / "with.jsonl"), str(tmp_path / "with.png")))
    narrow = matplotlib.image.imread(plot_learning_curve(str(tmp_path / "without.jsonl"), str(tmp_path / "w.png")))
    assert wide.shape[1] > 1.5 * narrow.shape[1]  # the success panel is there only when the metric is
