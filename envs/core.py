"""The environment contract: brax's `State` convention as pure functions.

An env is an object with `reset(key) -> State` and `step(State, action) -> State`, plus
`observation_size` and `action_size`. brax and MuJoCo Playground envs already satisfy it, so they
plug in unchanged; the wrappers in `envs.wrappers` rely only on these fields.
"""

from __future__ import annotations

import abc
from typing import Any

import jax
from flax import struct


@struct.dataclass
class State:
    """One environment's (or a batch of environments') state, as in brax."""

    pipeline_state: Any
    obs: jax.Array
    reward: jax.Array
    done: jax.Array
    metrics: dict[str, jax.Array] = struct.field(default_factory=dict)
    info: dict[str, Any] = struct.field(default_factory=dict)


class Env(abc.ABC):
    """A single, unbatched environment. Batching and episodes are wrappers' business."""

    @abc.abstractmethod
    def reset(self, key: jax.Array) -> State: ...

    @abc.abstractmethod
    def step(self, state: State, action: jax.Array) -> State: ...

    @property
    @abc.abstractmethod
    def observation_size(self) -> int: ...

    @property
    @abc.abstractmethod
    def action_size(self) -> int: ...

    @property
    def unwrapped(self) -> "Env":
        return self
