"""Asynchronous training (EBRL-style): env groups roll out in actor processes, each on its own, and
the learner updates from whichever group's trajectory is ready, with a bounded policy lag.

Actors are spawned workers (MPS clients on a GPU); each owns `num_groups / num_actors` env groups
and runs the rollout stages of PPO's program on them. After every trajectory an actor receives the
learner's newest parameters; nothing waits for the other groups. The lag of a trajectory is the
number of updates between the parameters that collected it and the update that consumes it; it
never exceeds `max_lag`: when one more update would push an actor still rolling out past the bound,
the learner first waits for that actor (and for all such actors together, in one update). With
`max_lag=0` every update therefore consumes all groups at once: synchronous PPO, and with one actor
the same computation as the sequential executor. Stale batches are corrected by the decoupled loss
(`jaxrose.ppo`), which is PPO's own loss at lag 0.
"""

from __future__ import annotations

import dataclasses
import time
from multiprocessing.connection import wait
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrose import distribution
from jaxrose.config import ConfigError, TrainConfig
from jaxrose.workers import Worker


@dataclasses.dataclass
class AsyncResult:
    learner: object
    updates: int
    lags: list[int]
    rollouts_per_actor: dict[int, int]
    queue_depths: list[int]
    wall_seconds: float
    env_steps: int
    train_returns: list[float]

    @property
    def rollout_sps(self) -> float:
        return self.env_steps / self.wall_seconds

    @property
    def updates_per_second(self) -> float:
        return self.updates / self.wall_seconds


def _actor(conn, config: TrainConfig, index: int, num_actors: int, delay_seconds: float) -> None:
    """Actor process: its env groups, the rollout stages, parameters in, trajectories out."""
    from envs.wrappers import wrap_for_training
    from jaxrose.networks import make_actor_critic
    from jaxrose.ppo_program import rollout_nodes
    from jaxrose.program import Program, run_program
    from jaxrose.sequential import make_env

    env = make_env(config)
    groups = config.env.num_groups // num_actors
    full_env = wrap_for_training(env, config.env.episode_length, config.env.num_groups, config.env.envs_per_group)
    own_env = wrap_for_training(env, config.env.episode_length, groups, config.env.envs_per_group)
    net = make_actor_critic(env.observation_size, env.action_size, config.network, config.ppo.normalize_observations)
    program = Program("rollout", rollout_nodes(own_env, net, config))
    # The sequential executor's key layout: every env reset from one key, then this actor's groups.
    _, env_key, loop_key = jax.random.split(jax.random.PRNGKey(config.run.seed), 3)
    env_state = jax.tree.map(lambda x: x[index * groups:(index + 1) * groups], jax.jit(full_env.reset)(env_key))
    key = loop_key if num_actors == 1 else jax.random.fold_in(loop_key, index)

    @jax.jit
    def collect(params, normalizer, env_state, key):
        out = run_program(program, {"params": params, "normalizer": normalizer, "env_state": env_state, "key": key})
        return out["env_state"], out["key"], out["unrolls"]

    conn.send(("ready", {"platform": jax.devices()[0].platform, "groups": groups}))
    while True:
        message = conn.recv()
        if message[0] == "stop":
            return
        _, version, params, normalizer = message
        env_state, key, unrolls = collect(params, normalizer, env_state, key)
        unrolls = jax.device_get(unrolls)
        if delay_seconds:
            time.sleep(delay_seconds)  # fault injection for tests: a deliberately slow group
        conn.send(("trajectory", index, version, unrolls))


def _concatenate(unrolls: list[dict]) -> dict:
    """Several actors' unrolls as one, groups in actor order ([U, T, G, E, ...]; last_obs [U, G, E, ...])."""
    return {k: np.concatenate([u[k] for u in unrolls], axis=1 if k == "last_obs" else 2) for k in unrolls[0]}


class AsyncTrainer:
    def __init__(self, config: TrainConfig, num_actors: int, max_lag: int,
                 actor_delays: Optional[dict[int, float]] = None, worker_env: Optional[dict] = None):
        if num_actors < 1 or config.env.num_groups % num_actors:
            raise ConfigError(f"env.num_groups ({config.env.num_groups}) must be a multiple of the number of actors "
                              f"({num_actors}): each actor owns whole env groups.")
        if max_lag < 0:
            raise ConfigError(f"The largest policy lag must be >= 0, got {max_lag}.")
        segments = config.unrolls_per_iteration * (config.env.num_envs // num_actors)
        if max_lag > 0 and segments % config.ppo.num_minibatches:
            raise ConfigError(f"One actor's batch holds {segments} segments, not a multiple of ppo.num_minibatches "
                              f"({config.ppo.num_minibatches}); change the minibatch count or the actor count.")
        from jaxrose.sequential import SequentialExecutor

        self.config, self.num_actors, self.max_lag = config, num_actors, max_lag
        self.executor = SequentialExecutor(config)  # the learner, network and key layout
        self._update = jax.jit(self.executor.learner.update)
        self.actors = [Worker(f"actor{i}", _actor, (config, i, num_actors, (actor_delays or {}).get(i, 0.0)),
                              worker_env) for i in range(num_actors)]
        try:
            for actor in self.actors:
                actor.start()
        except BaseException:
            self.close()
            raise

    def _batch(self, unrolls: dict, learner, lag: int):
        from jaxrose.ppo_program import to_batch

        batch, stats = to_batch(jax.tree.map(jnp.asarray, unrolls))
        if lag > 0:
            logits = self.executor.net.policy_logits(learner.params, learner.normalizer, batch.obs)
            batch = batch.replace(proximal_log_prob=distribution.log_prob(logits, batch.raw_action))
        return batch, stats

    def run(self, updates: Optional[int] = None, env_steps: Optional[int] = None, timeout: float = 300.0,
            on_update=None) -> AsyncResult:
        """Runs until `updates` learner updates or `env_steps` consumed env steps, whichever is given.
        `on_update(update, env_steps, learner, info)` is called after each update (logging, evaluation);
        `info` holds the update's lags, queue depth and training returns."""
        if (updates is None) == (env_steps is None):
            raise ValueError("Give exactly one of `updates` and `env_steps`.")
        state = self.executor.init(jax.random.PRNGKey(self.config.run.seed))
        learner, version = state.learner, 0
        params_sent = {}
        for i, actor in enumerate(self.actors):
            actor.send(("params", version, *jax.device_get((learner.params, learner.normalizer))))
            params_sent[i] = version
        lags, depths, returns = [], [], []
        rollouts = {i: 0 for i in range(self.num_actors)}
        ready: dict[int, tuple[int, dict]] = {}
        start, done, consumed = time.perf_counter(), 0, 0
        steps_per_group_rollout = self.config.env_steps_per_iteration // self.config.env.num_groups
        groups_per_actor = self.config.env.num_groups // self.num_actors
        while (done < updates) if updates is not None else (consumed < env_steps):
            urgent = [i for i in range(self.num_actors) if version + 1 - params_sent[i] > self.max_lag]
            needed = urgent or None
            self._gather(ready, needed, timeout)
            take = urgent if urgent else [min(ready, key=lambda i: ready[i][0])]
            depths.append(len(ready))
            batch_lags = [version - ready[i][0] for i in take]
            trajectory = _concatenate([ready.pop(i)[1] for i in take])
            lags.extend(batch_lags)
            batch, stats = self._batch(trajectory, learner, max(batch_lags))
            learner, _ = self._update(learner, batch)
            version += 1
            done += 1
            consumed += len(take) * groups_per_actor * steps_per_group_rollout
            if float(stats["episodes"]) > 0:
                returns.append(float(stats["episode_return"]))
            host_params = jax.device_get((learner.params, learner.normalizer))
            for i in take:
                rollouts[i] += 1
                self.actors[i].send(("params", version, *host_params))
                params_sent[i] = version
            if on_update is not None:
                on_update(done, consumed, learner, {"lags": batch_lags, "queue_depth": depths[-1],
                                                 "episode_return": float(stats["episode_return"]),
                                                 "episodes": float(stats["episodes"])})
        wall = time.perf_counter() - start
        return AsyncResult(learner, done, lags, rollouts, depths, wall, consumed, returns)

    def _gather(self, ready: dict, needed: Optional[list[int]], timeout: float) -> None:
        """Receives trajectories: at least one if `needed` is None, else one from each needed actor."""
        deadline = time.monotonic() + timeout
        while (needed is None and not ready) or (needed and any(i not in ready for i in needed)):
            waiting = [a for i, a in enumerate(self.actors) if i not in ready]
            connections = [a._conn for a in waiting]
            if not wait(connections, timeout=0.5):
                for actor in waiting:
                    if not actor.process.is_alive():
                        raise actor.death_error("while rolling out")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"No trajectory arrived within {timeout:.0f} s.")
                continue
            for i, actor in enumerate(self.actors):
                if i not in ready and actor.poll():
                    _, index, version, unrolls = actor.receive(timeout)
                    ready[index] = (version, unrolls)

    def close(self) -> None:
        for actor in self.actors:
            actor.stop()
