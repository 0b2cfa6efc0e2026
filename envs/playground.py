"""MuJoCo Playground tasks through the env contract: the DM Control suite on MJX (impl='jax').

Playground's `State` names the physics state `data` where brax (and `envs.core.State`) say
`pipeline_state`; `PlaygroundEnv` renames it on the way in and out and changes nothing else, so
rewards, observations and metrics are Playground's own. Its model is exposed as `sys`, the name
brax uses, so `envs.randomization` randomizes Playground and brax tasks alike.

Playground is imported only when a task is built (it takes seconds). It is an optional dependency
(`pip install 'jaxrose[playground]'`). Locomotion and manipulation tasks load their robots from
MuJoCo Menagerie, which Playground clones from GitHub on first use; `make_playground_env` turns a
failed download into an error that says where the clone must go.
"""

from __future__ import annotations

import functools
import re
import subprocess

import jax
import jax.numpy as jnp

from envs.core import Env, State

# Playground's dm_control_suite task names (mujoco_playground.dm_control_suite.ALL_ENVS), listed
# here so that `envs.names()` shows them without importing Playground.
DMC_TASKS = (
    "AcrobotSwingup", "AcrobotSwingupSparse", "BallInCup", "CartpoleBalance", "CartpoleBalanceSparse",
    "CartpoleSwingup", "CartpoleSwingupSparse", "CheetahRun", "FingerSpin", "FingerTurnEasy",
    "FingerTurnHard", "FishSwim", "HopperHop", "HopperStand", "HumanoidStand", "HumanoidWalk",
    "HumanoidRun", "PendulumSwingup", "PointMass", "ReacherEasy", "ReacherHard", "SwimmerSwimmer6",
    "WalkerRun", "WalkerStand", "WalkerWalk",
)


class PlaygroundAssetsError(RuntimeError):
    """A Playground task's robot models (MuJoCo Menagerie) are missing and could not be downloaded."""


def dmc_name(task: str) -> str:
    """Our registry name for a DM Control task: CartpoleBalance -> dmc_cartpole_balance."""
    return "dmc_" + re.sub(r"(?<!^)(?=[A-Z])", "_", task).lower()


class PlaygroundEnv(Env):
    """One Playground env (an `mjx_env.MjxEnv`) in brax's `State` convention."""

    def __init__(self, env):
        self.env = env
        self._observation_size = env.observation_size  # traces a reset: compute it once
        if not isinstance(self._observation_size, int):
            raise ValueError(f"{type(env).__name__} has dict observations ({self._observation_size}); jaxrose "
                             f"policies take one flat observation vector.")

    @property
    def sys(self):
        """The MJX model the task steps with (Playground keeps it in `_mjx_model`)."""
        return self.env._mjx_model

    @sys.setter
    def sys(self, model) -> None:
        self.env._mjx_model = model

    @property
    def observation_size(self) -> int:
        return self._observation_size

    @property
    def action_size(self) -> int:
        return self.env.action_size

    def reset(self, key: jax.Array) -> State:
        return _ours(self.env.reset(key))

    def step(self, state: State, action: jax.Array) -> State:
        from mujoco_playground import State as PlaygroundState

        # Copies: Playground tasks update `metrics` and `info` in place, jaxrose's wrappers never do.
        theirs = PlaygroundState(state.pipeline_state, state.obs, state.reward, state.done, dict(state.metrics),
                                 dict(state.info))
        return _ours(self.env.step(theirs, action))


def _ours(state) -> State:
    return State(pipeline_state=state.data, obs=state.obs, reward=jnp.asarray(state.reward, jnp.float32),
                 done=jnp.asarray(state.done, jnp.float32), metrics=state.metrics, info=state.info)


def make_playground_env(task: str, **config_overrides) -> PlaygroundEnv:
    """Any Playground task by its Playground name, on MJX's JAX implementation unless overridden."""
    try:
        from mujoco_playground import dm_control_suite, registry
        from mujoco_playground._src import mjx_env
    except ImportError as error:
        raise ImportError(f"Playground task {task!r} needs MuJoCo Playground: pip install 'jaxrose[playground]' "
                          f"(or playground==0.2.0). ({error})") from error
    try:
        env = registry.load(task, config_overrides={"impl": "jax", **config_overrides})
    except (subprocess.CalledProcessError, OSError) as error:
        if task in dm_control_suite.ALL_ENVS:  # ships its own models: not a Menagerie problem
            raise
        raise PlaygroundAssetsError(
            f"Playground task {task!r} loads its robot from MuJoCo Menagerie, which Playground downloads with "
            f"git on first use, and it could not be found or downloaded ({type(error).__name__}: {error}); this "
            f"machine may have no access to GitHub. On a machine with access, clone "
            f"https://github.com/google-deepmind/mujoco_menagerie at commit {mjx_env.MENAGERIE_COMMIT_SHA} and copy "
            f"it to {mjx_env.MENAGERIE_PATH}, then try again. DM Control tasks (dmc_*) need no download."
        ) from error
    return PlaygroundEnv(env)


def constructors():
    return {dmc_name(task): functools.partial(make_playground_env, task) for task in DMC_TASKS}
