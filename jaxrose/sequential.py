"""The sequential executor: the reference schedule every optimized one is checked against.

It runs the PPO `Program` (`jaxrose.ppo_program`) exactly as written: one jitted function per
iteration (rollout → observation statistics → epochs × minibatches), no host sync inside. Exposed
as `init` / `step` / `run`; `step` means one brax PPO "training step".
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

import envs
from envs.randomization import randomize
from envs.wrappers import HistoryWrapper, wrap_for_training
from jaxrose import distributed
from jaxrose.config import ConfigError, TrainConfig
from jaxrose.networks import make_actor_critic
from jaxrose.ppo import LearnerState, make_optimizer
from jaxrose.ppo_program import make_learner, make_ppo_program, rollout_nodes, run_state_to_program_state, to_batch
from jaxrose.program import Program, run_program


@struct.dataclass
class RunState:
    """Everything a run carries between iterations; a checkpoint stores exactly this."""

    learner: LearnerState
    env_state: envs.State
    key: jax.Array
    iteration: jax.Array


def _all_finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def health(out: dict) -> dict:
    """1.0 where a stage's output is finite: the training loop stops on the first 0 and names the stage."""
    batch = out["batch"]
    return {"health/env_step_observations": _all_finite(batch.obs).astype(jnp.float32),
            "health/env_step_rewards": _all_finite(batch.reward).astype(jnp.float32),
            "health/sgd_step_params": _all_finite(out["params"]).astype(jnp.float32)}


def next_run_state(values: dict, state: RunState) -> RunState:
    """The RunState after one iteration, from the program's values at its end."""
    learner = LearnerState(values["params"], values["opt_state"], values["normalizer"], values["learner_key"])
    return RunState(learner, values["env_state"], values["key"], state.iteration + 1)


def make_env(config: TrainConfig) -> envs.Env:
    """The run's single env: the registered task, randomized per env if asked, with the policy's
    observation history if it has one."""
    env = envs.make(config.env.name)
    try:
        env = randomize(env, config.env.randomize)
    except ValueError as error:
        raise ConfigError(f"env.randomize: {error}") from None
    return HistoryWrapper(env, config.network.history) if config.network.history > 1 else env


class SequentialExecutor:
    def __init__(self, config: TrainConfig, env: envs.Env | None = None, program: Program | None = None):
        distributed.initialize(config.run)  # before this process's first computation fixes its devices
        self.config = config
        self.env = env if env is not None else make_env(config)
        self.custom_env = env  # None: the config's; another process (the evaluator) builds its own then
        self.observation_size = int(self.env.observation_size)
        self.action_size = int(self.env.action_size)
        self.train_env = wrap_for_training(self.env, config.env.episode_length, config.env.num_groups,
                                           config.env.envs_per_group)
        self.net = make_actor_critic(self.observation_size, self.action_size, config.network,
                                     config.ppo.normalize_observations)
        self.learner = make_learner(self.net, self.observation_size, config.ppo, config.run.learner_unroll)
        self.program = program or make_ppo_program(self.train_env, self.net, config, make_optimizer(config.ppo))
        self._compiled = None
        if config.run.devices == 1 and jax.process_count() == 1:
            self._init = jax.jit(self._init_impl)
            self._step = jax.jit(self._iteration, donate_argnums=0)
            return
        # Data parallel over devices (of every process): env groups sharded along the group axis, the
        # learner replicated; XLA inserts the collectives (gradient and statistics reductions).
        state_sharding = self.state_sharding()
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        self._init = jax.jit(self._init_impl, out_shardings=state_sharding)
        self._step = jax.jit(self._iteration, donate_argnums=0, in_shardings=(state_sharding,),
                             out_shardings=(state_sharding, replicated))

    def state_sharding(self):
        """Shardings of a RunState: env state split by group over `run.devices` devices of each process."""
        devices = self.config.run.devices
        if jax.local_device_count() < devices:
            raise ConfigError(f"run.devices is {devices} but this process sees {jax.local_device_count()} "
                              f"local device(s); lower run.devices.")
        self.config.check_devices(jax.process_count())
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        # Process-major order: process p holds a contiguous block of groups, so 2 processes x 2 devices
        # lay the groups out exactly as 1 process x 4 devices.
        per_process = [sorted((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id)[:devices]
                       for p in range(jax.process_count())]
        self.mesh = Mesh(np.array([d for block in per_process for d in block]), ("groups",))
        by_group, replicated = NamedSharding(self.mesh, PartitionSpec("groups")), NamedSharding(self.mesh, PartitionSpec())
        shapes = jax.eval_shape(self._init_impl, jax.random.PRNGKey(0))
        return shapes.replace(
            learner=jax.tree.map(lambda _: replicated, shapes.learner),
            env_state=jax.tree.map(lambda x: by_group if x.ndim >= 1 else replicated, shapes.env_state),
            key=replicated, iteration=replicated)

    @property
    def env_steps_per_iteration(self) -> int:
        return self.config.env_steps_per_iteration

    def _init_impl(self, key: jax.Array) -> RunState:
        learner_key, env_key, loop_key = jax.random.split(key, 3)
        return RunState(self.learner.init(learner_key), self.train_env.reset(env_key), loop_key,
                        jnp.zeros((), jnp.int32))

    def _iteration(self, state: RunState) -> tuple[RunState, dict]:
        out = run_program(self.program, run_state_to_program_state(state))
        return next_run_state(out, state), {**out["metrics"], **health(out)}

    def collect(self, params, normalizer, env_state, key):
        """One iteration's rollout alone: (env_state, batch, episode stats), e.g. to time the learner."""
        rollout = Program("rollout", rollout_nodes(self.train_env, self.net, self.config))
        out = run_program(rollout, {"params": params, "normalizer": normalizer, "env_state": env_state, "key": key})
        batch, stats = to_batch(out["unrolls"])
        return out["env_state"], batch, stats

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
