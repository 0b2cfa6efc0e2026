"""Named workloads: every preset runs a registered env, and the published settings are the publisher's."""

import pytest

import envs
from jaxrose.presets import PRESETS


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_names_a_registered_env(name):
    assert PRESETS[name].env.name in envs.names()


def test_cheetah_run_is_playgrounds_published_ppo_config():
    from mujoco_playground.config import dm_control_suite_params

    published = dm_control_suite_params.brax_ppo_config("CheetahRun")
    config = PRESETS["cheetah-run-mlp"]
    assert config.env.name == "dmc_cheetah_run"
    ours = {
        "num_timesteps": config.run.total_env_steps, "num_evals": config.run.num_evals,
        "reward_scaling": config.ppo.reward_scaling, "episode_length": config.env.episode_length,
        "normalize_observations": config.ppo.normalize_observations, "action_repeat": 1,
        "unroll_length": config.ppo.unroll_length, "num_minibatches": config.ppo.num_minibatches,
        "num_updates_per_batch": config.ppo.num_updates_per_batch, "discounting": config.ppo.discounting,
        "learning_rate": config.ppo.learning_rate, "entropy_cost": config.ppo.entropy_cost,
        "num_envs": config.env.num_envs, "batch_size": config.ppo.batch_size,
    }
    assert ours == {key: published[key] for key in ours}
    # Settings Playground leaves to brax's PPO defaults, and brax's default networks.
    assert (config.ppo.gae_lambda, config.ppo.clipping_epsilon, config.ppo.max_grad_norm) == (0.95, 0.3, None)
    assert (config.network.policy_hidden, config.network.value_hidden) == ((32,) * 4, (256,) * 5)


def test_arm_push_presets_share_settings_and_differ_as_named():
    mlp, randomized, transformer = (PRESETS[f"arm-push-{kind}"] for kind in ("mlp", "randomized-mlp", "transformer"))
    assert mlp.ppo == randomized.ppo == transformer.ppo
    assert randomized.env.randomize == ("friction", "mass", "actuator_gain") and mlp.env.randomize == ()
    assert transformer.network == PRESETS["pusher-transformer"].network
