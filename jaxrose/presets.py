"""Named workloads: env, network, PPO and run settings in one place.

`ant-mlp` and `humanoid-mlp` are brax's published PPO settings for those tasks, `cheetah-run-mlp`
MuJoCo Playground's for DM Control's cheetah run; the arm-push presets run jaxrose's own
manipulation task (`envs.arm_push`); the small presets train on a CPU in about a minute.
"""

from __future__ import annotations

from jaxrose.config import ConfigError, EnvConfig, NetworkConfig, PPOConfig, RunConfig, TrainConfig

# brax's published PPO settings for its pusher task, shared by the arm_push presets.
_ARM_PUSH_PPO = PPOConfig(unroll_length=30, batch_size=512, num_minibatches=16, num_updates_per_batch=8,
                          learning_rate=3e-4, entropy_cost=1e-2, discounting=0.95, reward_scaling=5.0)

PRESETS: dict[str, TrainConfig] = {
    "point-mass": TrainConfig(
        env=EnvConfig(name="point_mass", num_envs=256, episode_length=200),
        network=NetworkConfig(policy_hidden=(32, 32), value_hidden=(64, 64)),
        ppo=PPOConfig(unroll_length=10, batch_size=64, num_minibatches=8, num_updates_per_batch=4,
                      learning_rate=1e-3, entropy_cost=1e-3, discounting=0.97),
        run=RunConfig(total_env_steps=600_000, num_evals=11, num_eval_envs=64, out_dir="runs/point-mass"),
    ),
    "pendulum": TrainConfig(
        env=EnvConfig(name="pendulum", num_envs=512, episode_length=200),
        network=NetworkConfig(policy_hidden=(64, 64), value_hidden=(64, 64)),
        ppo=PPOConfig(unroll_length=20, batch_size=128, num_minibatches=8, num_updates_per_batch=4,
                      learning_rate=1e-3, entropy_cost=1e-3, discounting=0.97, reward_scaling=0.1,
                      bootstrap_on_truncation=True),
        run=RunConfig(total_env_steps=3_000_000, num_evals=11, num_eval_envs=64, out_dir="runs/pendulum"),
    ),
    "ant-mlp": TrainConfig(
        env=EnvConfig(name="ant", num_envs=4096, episode_length=1000),
        network=NetworkConfig(),
        ppo=PPOConfig(unroll_length=5, batch_size=2048, num_minibatches=32, num_updates_per_batch=4,
                      learning_rate=3e-4, entropy_cost=1e-2, discounting=0.97, reward_scaling=10.0),
        run=RunConfig(total_env_steps=50_000_000, num_evals=11, num_eval_envs=128, seed=1,
                      deterministic_eval=False, out_dir="runs/ant-mlp"),
    ),
    "humanoid-mlp": TrainConfig(
        env=EnvConfig(name="humanoid", num_envs=2048, episode_length=1000),
        network=NetworkConfig(),
        ppo=PPOConfig(unroll_length=10, batch_size=1024, num_minibatches=32, num_updates_per_batch=8,
                      learning_rate=3e-4, entropy_cost=1e-3, discounting=0.97, reward_scaling=0.1),
        run=RunConfig(total_env_steps=50_000_000, num_evals=11, num_eval_envs=128, seed=1,
                      deterministic_eval=False, out_dir="runs/humanoid-mlp"),
    ),
    "point-mass-transformer": TrainConfig(
        env=EnvConfig(name="point_mass", num_envs=256, episode_length=200),
        network=NetworkConfig(policy="transformer", history=4, transformer_depth=2, transformer_width=32,
                              transformer_heads=2, value_hidden=(64, 64)),
        ppo=PPOConfig(unroll_length=10, batch_size=64, num_minibatches=8, num_updates_per_batch=4,
                      learning_rate=1e-3, entropy_cost=1e-3, discounting=0.97),
        run=RunConfig(total_env_steps=600_000, num_evals=11, num_eval_envs=64, out_dir="runs/point-mass-transformer"),
    ),
    # brax's published pusher settings, with an inference-heavy policy: a 4-layer, 256-wide causal
    # transformer over the last 8 observations.
    "pusher-transformer": TrainConfig(
        env=EnvConfig(name="pusher", num_envs=2048, episode_length=1000),
        network=NetworkConfig(policy="transformer", history=8, transformer_depth=4, transformer_width=256,
                              transformer_heads=8),
        ppo=PPOConfig(unroll_length=30, batch_size=512, num_minibatches=16, num_updates_per_batch=8,
                      learning_rate=3e-4, entropy_cost=1e-2, discounting=0.95, reward_scaling=5.0),
        run=RunConfig(total_env_steps=50_000_000, num_evals=11, num_eval_envs=128, seed=1,
                      deterministic_eval=False, out_dir="runs/pusher-transformer"),
    ),
    # MuJoCo Playground's published brax PPO settings for DM Control's CheetahRun
    # (mujoco_playground.config.dm_control_suite_params.brax_ppo_config), brax's default networks.
    "cheetah-run-mlp": TrainConfig(
        env=EnvConfig(name="dmc_cheetah_run", num_envs=2048, episode_length=1000),
        network=NetworkConfig(),
        ppo=PPOConfig(unroll_length=30, batch_size=1024, num_minibatches=32, num_updates_per_batch=16,
                      learning_rate=1e-3, entropy_cost=1e-2, discounting=0.995, reward_scaling=10.0),
        run=RunConfig(total_env_steps=60_000_000, num_evals=10, num_eval_envs=128, seed=1,
                      deterministic_eval=False, out_dir="runs/cheetah-run-mlp"),
    ),
    # jaxrose's arm_push reference task with brax's published pusher PPO settings (10 s episodes).
    "arm-push-mlp": TrainConfig(
        env=EnvConfig(name="arm_push", num_envs=2048, episode_length=200),
        network=NetworkConfig(),
        ppo=_ARM_PUSH_PPO,
        run=RunConfig(total_env_steps=20_000_000, num_evals=11, num_eval_envs=128, seed=1,
                      deterministic_eval=False, out_dir="runs/arm-push-mlp"),
    ),
    # The same with friction, masses and actuator gains drawn per env (envs.randomization).
    "arm-push-randomized-mlp": TrainConfig(
        env=EnvConfig(name="arm_push", num_envs=2048, episode_length=200,
                      randomize=("friction", "mass", "actuator_gain")),
        network=NetworkConfig(),
        ppo=_ARM_PUSH_PPO,
        run=RunConfig(total_env_steps=20_000_000, num_evals=11, num_eval_envs=128, seed=1,
                      deterministic_eval=False, out_dir="runs/arm-push-randomized-mlp"),
    ),
    # arm_push with pusher-transformer's policy: a 4-layer, 256-wide causal transformer over the
    # last 8 observations.
    "arm-push-transformer": TrainConfig(
        env=EnvConfig(name="arm_push", num_envs=2048, episode_length=200),
        network=NetworkConfig(policy="transformer", history=8, transformer_depth=4, transformer_width=256,
                              transformer_heads=8),
        ppo=_ARM_PUSH_PPO,
        run=RunConfig(total_env_steps=20_000_000, num_evals=11, num_eval_envs=128, seed=1,
                      deterministic_eval=False, out_dir="runs/arm-push-transformer"),
    ),
    # brax's ant settings with a wide MLP policy (3 × 2048): inference-heavy without attention.
    "ant-wide-mlp": TrainConfig(
        env=EnvConfig(name="ant", num_envs=4096, episode_length=1000),
        network=NetworkConfig(policy_hidden=(2048, 2048, 2048)),
        ppo=PPOConfig(unroll_length=5, batch_size=2048, num_minibatches=32, num_updates_per_batch=4,
                      learning_rate=3e-4, entropy_cost=1e-2, discounting=0.97, reward_scaling=10.0),
        run=RunConfig(total_env_steps=50_000_000, num_evals=11, num_eval_envs=128, seed=1,
                      deterministic_eval=False, out_dir="runs/ant-wide-mlp"),
    ),
}

DEFAULT_PRESET = "pendulum"


def get_preset(name: str) -> TrainConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"Unknown preset {name!r}. Known presets: {', '.join(sorted(PRESETS))}.") from None
