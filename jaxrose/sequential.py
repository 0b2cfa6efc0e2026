"""The sequential executor: the reference schedule every optimized one is checked against.

One training iteration is one jitted function (rollout → observation statistics → epochs ×
minibatches), with no host sync inside. It is exposed as `init` / `step` / `run`; `step` has the
same meaning as one brax PPO "training step".
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
from flax import struct

import envs
from envs.wrappers import wrap_for_training
from jaxrose.config import TrainConfig
from jaxrose.networks import make_actor_critic
from jaxrose.ppo import LearnerState, make_learner
from jaxrose.rollout import make_collect


@struct.dataclass
class RunState:
    """Everything a run carries between iterations; a checkpoint stores exactly this."""

    learner: LearnerState
    env_state: envs.State
    key: jax.Array
    iteration: jax.Array


class SequentialExecutor:
    def __init__(self, config: TrainConfig, env: envs.Env | None = None):
        self.config = config
        self.env = env if env is not None else envs.make(config.env.name)
        self.observation_size = int(self.env.observation_size)
        self.action_size = int(self.env.action_size)
        self.train_env = wrap_for_training(self.env, config.env.episode_length, config.env.num_groups,
                                           config.env.envs_per_group)
        self.net = make_actor_critic(self.observation_size, self.action_size, config.network,
                                     config.ppo.normalize_observations)
        self.learner = make_learner(self.net, self.observation_size, config.ppo)
        self.collect = make_collect(self.train_env, self.net, config.ppo.unroll_length,
                                    config.unrolls_per_iteration, config.ppo.bootstrap_on_truncation)
        self._init = jax.jit(self._init_impl)
        self._step = jax.jit(self._iteration, donate_argnums=0)
        self._compiled = None

    @property
    def env_steps_per_iteration(self) -> int:
        return self.config.env_steps_per_iteration

    def _init_impl(self, key: jax.Array) -> RunState:
        learner_key, env_key, loop_key = jax.random.split(key, 3)
        return RunState(self.learner.init(learner_key), self.train_env.reset(env_key), loop_key,
                        jnp.zeros((), jnp.int32))

    def _iteration(self, state: RunState) -> tuple[RunState, dict]:
        key, collect_key = jax.random.split(state.key)
        learner = state.learner
        env_state, batch, episode_stats = self.collect(learner.params, learner.normalizer, state.env_state,
                                                       collect_key)
        learner, loss_metrics = self.learner.update(learner, batch)
        metrics = {**{f"train/{k}": v for k, v in loss_metrics.items()},
                   **{f"train/{k}": v for k, v in episode_stats.items()}}
        return RunState(learner, env_state, key, state.iteration + 1), metrics

    def init(self, key: jax.Array) -> RunState:
        return self._init(key)

    def compile(self, state: RunState) -> float:
        """Compiles the iteration ahead of time for this state's shapes; returns seconds spent."""
        start = time.perf_counter()
        self._compiled = self._step.lower(state).compile()
        return time.perf_counter() - start

    def step(self, state: RunState) -> tuple[RunState, dict]:
        """One iteration. The input state's buffers are donated: use only the returned state."""
        return (self._compiled or self._step)(state)

    def run(self, state: RunState, num_iterations: int) -> tuple[RunState, list[dict]]:
        history = []
        for _ in range(num_iterations):
            state, metrics = self.step(state)
            history.append(metrics)
        return state, jax.device_get(history)
