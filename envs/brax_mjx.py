"""brax's locomotion and manipulation tasks on the MJX backend, through the same contract.

brax's `State` has the same fields as `envs.core.State`, so its envs need no adapter; only the
import is deferred, because brax and MuJoCo take seconds to import.
"""

from __future__ import annotations

import functools

from envs.core import Env

BRAX_TASKS = ("ant", "humanoid", "halfcheetah", "hopper", "walker2d", "pusher", "reacher")


def make_brax_env(task: str, backend: str = "mjx", **kwargs) -> Env:
    from brax import envs as brax_envs

    env = brax_envs.get_environment(task, backend=backend, **kwargs)
    env.__class__ = _with_abstract_observation_size(type(env))
    return env


@functools.lru_cache(maxsize=None)
def _with_abstract_observation_size(cls: type) -> type:
    """`cls` whose `observation_size` traces a reset abstractly, once per env, as MuJoCo Playground's
    envs do. brax's own runs the reset eagerly, op by op, compiling each of its ~1000 operations:
    37 s for ant on a CPU (against 0.9 s traced), paid again in every process that builds the env."""

    def observation_size(self):
        if "_observation_size" not in self.__dict__:
            import jax

            obs = jax.eval_shape(self.unwrapped.reset, jax.random.PRNGKey(0)).obs
            self.__dict__["_observation_size"] = (jax.tree.map(lambda x: x.shape, obs) if isinstance(obs, dict)
                                                  else obs.shape[-1])
        return self.__dict__["_observation_size"]

    return type(cls.__name__, (cls,), {"observation_size": property(observation_size)})


def constructors():
    return {task: functools.partial(make_brax_env, task) for task in BRAX_TASKS}
