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

    return brax_envs.get_environment(task, backend=backend, **kwargs)


def constructors():
    return {task: functools.partial(make_brax_env, task) for task in BRAX_TASKS}
