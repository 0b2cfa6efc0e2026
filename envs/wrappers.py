"""Episode bookkeeping, auto-reset and the `[groups, envs_per_group]` layout, as wrappers.

Semantics follow brax's training wrappers (`brax.envs.wrappers.training`) so results compare run
for run: an episode ends at `done` (termination) or after `episode_length` steps (truncation,
flagged in `info['truncation']`); auto-reset restores the env's *first* state, as brax does, which
avoids a full reset (expensive in MJX) on every step. Unlike brax, the wrappers never mutate
`info` in place, and the observation reached just before an auto-reset is kept in
`info['final_obs']` so a learner can bootstrap from it on truncation.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp

from envs.core import Env, State

# DomainRandomization swaps an attribute of a shared env object while reset or step traces; two
# threads tracing at once (train.py compiles the evaluation beside the iteration) would see each
# other's traced values. One lock for every instance, as several may wrap the same env; reentrant,
# as they may be stacked.
_SWAP_LOCK = threading.RLock()


class Wrapper(Env):
    def __init__(self, env: Env):
        self.env = env

    @property
    def observation_size(self) -> int:
        return self.env.observation_size

    @property
    def action_size(self) -> int:
        return self.env.action_size

    @property
    def unwrapped(self) -> Env:
        return self.env.unwrapped

    def reset(self, key: jax.Array) -> State:
        return self.env.reset(key)

    def step(self, state: State, action: jax.Array) -> State:
        return self.env.step(state, action)


class EpisodeWrapper(Wrapper):
    """Counts steps, truncates at `episode_length`, and sums episode metrics."""

    def __init__(self, env: Env, episode_length: int):
        super().__init__(env)
        if episode_length < 1:
            raise ValueError(f"episode_length must be >= 1, got {episode_length}.")
        self.episode_length = episode_length

    def reset(self, key: jax.Array) -> State:
        state = self.env.reset(key)
        zero = jnp.zeros_like(state.reward)
        episode_metrics = {"sum_reward": zero, "length": zero, **{k: zero for k in state.metrics}}
        info = {**state.info, "steps": zero, "truncation": zero, "episode_done": zero,
                "episode_metrics": episode_metrics}
        return state.replace(info=info)

    def step(self, state: State, action: jax.Array) -> State:
        prev_done = state.info["episode_done"]
        state = self.env.step(state, action)
        steps = state.info["steps"] + 1
        truncated = steps >= self.episode_length
        done = jnp.where(truncated, jnp.ones_like(state.done), state.done)
        # Truncation only where the env did not terminate on its own in the same step.
        truncation = jnp.where(truncated, 1.0 - state.done, jnp.zeros_like(state.done))
        keep = 1.0 - prev_done
        old = state.info["episode_metrics"]
        episode_metrics = {
            "sum_reward": old["sum_reward"] * keep + state.reward,
            "length": old["length"] * keep + 1.0,
            **{k: old[k] * keep + v for k, v in state.metrics.items() if k in old},
        }
        info = {**state.info, "steps": steps, "truncation": truncation, "episode_done": done,
                "episode_metrics": episode_metrics}
        return state.replace(done=done, info=info)


class AutoResetWrapper(Wrapper):
    """Restores the first state of an env whose episode is done (brax semantics)."""

    def reset(self, key: jax.Array) -> State:
        state = self.env.reset(key)
        info = {**state.info, "first_pipeline_state": state.pipeline_state, "first_obs": state.obs,
                "final_obs": state.obs}
        return state.replace(info=info)

    def step(self, state: State, action: jax.Array) -> State:
        info = dict(state.info)
        if "steps" in info:
            info["steps"] = jnp.where(state.done, jnp.zeros_like(info["steps"]), info["steps"])
        state = state.replace(done=jnp.zeros_like(state.done), info=info)
        state = self.env.step(state, action)
        done = state.done.astype(bool)
        pick = lambda first, current: jnp.where(done, first, current)
        pipeline_state = jax.tree.map(pick, state.info["first_pipeline_state"], state.pipeline_state)
        obs = jax.tree.map(pick, state.info["first_obs"], state.obs)
        info = {**state.info, "final_obs": state.obs}
        return state.replace(pipeline_state=pipeline_state, obs=obs, info=info)


class HistoryWrapper(Wrapper):
    """The observation becomes the last `length` observations, oldest first, flattened.

    The history lives in the env state itself (`obs`), so it travels with each env group, is reset
    by auto-reset (which restores the first, history-filled observation) and is checkpointed. The
    wrapped env must not read `state.obs` in `step` (brax's and jaxrose's envs don't).
    """

    def __init__(self, env: Env, length: int):
        super().__init__(env)
        if length < 1:
            raise ValueError(f"History length must be >= 1, got {length}.")
        self.length = length

    @property
    def observation_size(self) -> int:
        return self.length * self.env.observation_size

    def reset(self, key: jax.Array) -> State:
        state = self.env.reset(key)
        return state.replace(obs=jnp.tile(state.obs, self.length))

    def step(self, state: State, action: jax.Array) -> State:
        history = state.obs
        state = self.env.step(state, action)
        size = self.env.observation_size
        return state.replace(obs=jnp.concatenate([history[size:], state.obs]))


class DomainRandomization(Wrapper):
    """Per-env physical parameters: each env draws its own value of one attribute of the unwrapped
    env (brax: `sys`, the MJX model; jaxrose's tiny envs: e.g. `max_torque`) from its reset key.

    `sample(base_value, key) -> value` returns a pytree shaped like the base value or, given
    `apply(base_value, value) -> attribute value`, any pytree (e.g. a few scale factors rather
    than a whole MJX model per env). The value lives in `info['randomized']`, so it is vmapped
    across env groups, kept across auto-resets and checkpointed; during `reset` and `step` it
    replaces the attribute, as brax's `DomainRandomizationVmapWrapper` does with `sys`.
    """

    def __init__(self, env: Env, attribute: str, sample, apply=None):
        super().__init__(env)
        if not hasattr(env.unwrapped, attribute):
            raise ValueError(f"Cannot randomize {attribute!r}: {type(env.unwrapped).__name__} has no such attribute.")
        inner = env
        while isinstance(inner, Wrapper):  # one value per env lives in info['randomized']: two would clash
            if isinstance(inner, DomainRandomization):
                raise ValueError(f"Cannot randomize {attribute!r} around an env that already randomizes "
                                 f"{inner.attribute!r}: the two would share info['randomized']. Randomize both in "
                                 f"one wrapper (envs.randomization.randomize takes several parameters at once).")
            inner = inner.env
        self.attribute = attribute
        self.sample = sample
        self.apply = apply

    def _with(self, value, fn, *args):
        target = self.env.unwrapped
        with _SWAP_LOCK:
            base = getattr(target, self.attribute)
            setattr(target, self.attribute, value if self.apply is None else self.apply(base, value))
            try:
                return fn(*args)
            finally:
                setattr(target, self.attribute, base)

    def reset(self, key: jax.Array) -> State:
        sample_key, reset_key = jax.random.split(key)
        value = self.sample(getattr(self.env.unwrapped, self.attribute), sample_key)
        state = self._with(value, self.env.reset, reset_key)
        return state.replace(info={**state.info, "randomized": value})

    def step(self, state: State, action: jax.Array) -> State:
        value = state.info["randomized"]
        return self._with(value, self.env.step, state, action)


class GroupWrapper(Wrapper):
    """Lays envs out as `[groups, envs_per_group, ...]` and vmaps reset/step over both axes.

    `reset` takes one key and derives one key per env from a single flat split, so the same env
    count gives the same initial states whatever the grouping.
    """

    def __init__(self, env: Env, num_groups: int, envs_per_group: int):
        super().__init__(env)
        if num_groups < 1 or envs_per_group < 1:
            raise ValueError(f"num_groups and envs_per_group must be >= 1, got {num_groups}, {envs_per_group}.")
        self.num_groups = num_groups
        self.envs_per_group = envs_per_group
        self._reset = jax.vmap(jax.vmap(env.reset))
        self._step = jax.vmap(jax.vmap(env.step))

    @property
    def batch_shape(self) -> tuple[int, int]:
        return (self.num_groups, self.envs_per_group)

    def reset(self, key: jax.Array) -> State:
        keys = jax.random.split(key, self.num_groups * self.envs_per_group)
        return strongly_typed(self._reset(keys.reshape(self.batch_shape + keys.shape[1:])))

    def step(self, state: State, action: jax.Array) -> State:
        return strongly_typed(self._step(state, action))


def strongly_typed(tree):
    """`tree` with no weakly typed leaf. Envs write Python scalars into their state (brax's ant:
    `done = 0.0`), which come out weakly typed from `step` but not from `reset`; a jitted rollout
    fed its own output would then see new input types and compile a second time (12 s for ant on
    the H200)."""
    return jax.tree.map(lambda x: x.astype(x.dtype) if getattr(x, "weak_type", False) else x, tree)


def wrap_for_training(env: Env, episode_length: int, num_groups: int, envs_per_group: int) -> GroupWrapper:
    """The standard training stack: episodes, auto-reset, then the group layout."""
    return GroupWrapper(AutoResetWrapper(EpisodeWrapper(env, episode_length)), num_groups, envs_per_group)
