"""What the training loop does when an iteration produces NaN or Inf (`run.on_nonfinite`).

stop: raise `NonFiniteError` naming the stage; that state is never checkpointed.
skip: throw the iteration's update away (the learner state from before it is kept), reset the
envs whose state is no longer finite, warn naming the stage, and go on; after
`run.max_consecutive_skips` skipped iterations in a row, stop as above. The RNG key and the
healthy envs move on: keeping them too would replay the same iteration bit for bit, and fail again.
Skipping costs one device copy of the learner state per iteration (the executor donates its input).
The asynchronous mode applies the same settings through `NonFinitePolicy` (see `jaxrose.async_mode`).
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrose.config import RunConfig
from jaxrose.sequential import RunState, SequentialExecutor


class NonFiniteError(RuntimeError):
    """Training produced NaN or Inf; the message names the stage, and no checkpoint holds the bad state."""


class NonFiniteWarning(RuntimeWarning):
    """An iteration's update was skipped because it produced NaN or Inf (`run.on_nonfinite='skip'`)."""


def bad_stages(metrics: dict[str, float]) -> list[str]:
    """Stages whose health flag is down, then losses that are not finite."""
    bad = [name.split("/", 1)[1] for name, value in metrics.items() if name.startswith("health/") and value != 1.0]
    return bad + [name for name, value in metrics.items()
                  if name.endswith("_loss") and not math.isfinite(value)]


def _copy(tree):
    # The executor donates its input state, so what a skip falls back to must be a copy.
    return jax.tree.map(jnp.copy, tree)


def reset_broken_envs(train_env, env_state, key: jax.Array):
    """Envs ([groups, envs_per_group] leading axes) whose state holds NaN or Inf restart from a fresh
    reset; the others are untouched. Returns the new env state and how many were reset."""
    fresh = train_env.reset(key)
    leaves = jax.tree.leaves(env_state)
    batch = leaves[0].shape[:2]
    ok = jnp.ones(batch, bool)
    for leaf in leaves:
        if jnp.issubdtype(leaf.dtype, jnp.inexact):
            ok &= jnp.all(jnp.isfinite(leaf), axis=tuple(range(2, leaf.ndim)))  # zero-size leaves too
    pick = lambda new, old: jnp.where(ok.reshape(batch + (1,) * (old.ndim - 2)), old, new)
    return jax.tree.map(pick, fresh, env_state), jnp.sum(~ok)


ADVICE = "Check the env's observations and rewards, or lower ppo.learning_rate / set ppo.max_grad_norm"


class NonFinitePolicy:
    """`run.on_nonfinite` applied to one finding at a time: stop, or let the caller skip it (at
    most `run.max_consecutive_skips` in a row of one kind). Shared by the synchronous loop (`unit`
    'iteration') and the asynchronous learner ('update', the unit its checkpoints are numbered in),
    which counts its updates and each actor's trajectories apart: one always-broken actor must stop
    the run even while the others' data keeps the updates healthy."""

    def __init__(self, run: RunConfig, last_checkpoint: Callable[[], Optional[int]] = lambda: None,
                 out_dir: Optional[str] = None, unit: str = "iteration"):
        self.skip = run.on_nonfinite == "skip"
        self.limit = run.max_consecutive_skips
        self.last_checkpoint, self.out_dir, self.unit = last_checkpoint, out_dir, unit
        self.skipped: list[int] = []
        self.consecutive: dict[str, int] = {}  # kind of skip ("iterations", "trajectories from actor1") -> in a row
        # Called before a stop names the last good checkpoint: the asynchronous learner finishes the
        # snapshots of good states it still awaits actors' answers for, so none is lost.
        self.before_stop: Optional[Callable[[], None]] = None

    def healthy(self, kind: str = "iterations") -> None:
        self.consecutive[kind] = 0

    def admit(self, where: int, finding: str, kind: str = "iterations") -> None:
        """Raises `NonFiniteError` for `finding` (a sentence naming the stages) unless it may be
        skipped; then counts it, and the caller drops the bad data and calls `warn`."""
        if not self.skip:
            self._finish_saves()
            raise NonFiniteError(f"{finding}. The run stopped before saving that state; {self._last_good()}. {ADVICE} "
                                 f"(run.on_nonfinite='skip' skips such updates instead).")
        in_a_row = self.consecutive.get(kind, 0)
        if in_a_row >= self.limit:
            self._finish_saves()
            raise NonFiniteError(
                f"{finding}, after {in_a_row} skipped {kind} in a row (run.max_consecutive_skips={self.limit}), "
                f"so the run stopped: skipping does not help here; {self._last_good()}. {ADVICE}.")
        self.consecutive[kind] = in_a_row + 1
        self.skipped.append(where)

    def warn(self, finding: str, consequence: str, then: str = "", kind: str = "iterations") -> None:
        warnings.warn(f"{finding}; {consequence} (run.on_nonfinite='skip'; {self.consecutive[kind]} in a row, of at "
                      f"most run.max_consecutive_skips={self.limit}){then}.", NonFiniteWarning, stacklevel=3)

    def _finish_saves(self) -> None:
        if self.before_stop is not None:
            try:
                self.before_stop()
            except Exception as error:  # the stop itself must still be raised, naming what is on disk
                warnings.warn(f"Finishing the pending checkpoints before stopping failed: {error}", stacklevel=3)

    def _last_good(self) -> str:
        step = self.last_checkpoint()
        where = f" in {self.out_dir}" if self.out_dir else ""
        if step is None:
            return f"no checkpoint was saved before it{where}"
        return f"the last good checkpoint is {self.unit} {step}{where}"


class NonFiniteGuard:
    """Checks each iteration's health metrics; see the module docstring for what each setting does."""

    def __init__(self, executor: SequentialExecutor, run: RunConfig, last_checkpoint: Callable[[], Optional[int]],
                 out_dir: str):
        self.executor = executor
        self.policy = NonFinitePolicy(run, last_checkpoint, out_dir)
        self.skip = self.policy.skip
        self._previous = None
        if self.skip:
            self._copy = jax.jit(_copy)
            shardings = executor.state_sharding().env_state if executor.config.run.devices > 1 else None
            self._reset = jax.jit(lambda env_state, key: reset_broken_envs(executor.train_env, env_state, key),
                                  out_shardings=(shardings, None) if shardings is not None else None)

    @property
    def skipped(self) -> list[int]:
        return self.policy.skipped

    def before_step(self, state: RunState) -> None:
        if self.skip:
            self._previous = self._copy(state.learner)

    def check(self, iteration: int, state: RunState, metrics: dict[str, float]) -> RunState:
        """The state to go on with: `state` itself, or after a skip the previous learner state."""
        bad = bad_stages(metrics)
        if not bad:
            self.policy.healthy()
            return state
        finding = f"Iteration {iteration} produced NaN or Inf in: {', '.join(bad)}"
        self.policy.admit(iteration, finding)
        if hasattr(self.executor, "materialize"):  # group processes hold the live env state
            state = self.executor.materialize(state)
        key, reset_key = jax.random.split(state.key)
        env_state, reset = self._reset(state.env_state, reset_key)
        if hasattr(self.executor, "reload"):  # they go on from the reset envs and the new key
            self.executor.reload()
        self.policy.warn(finding, "its update was skipped",
                         f" and {int(reset)} env(s) with a non-finite state were reset")
        return state.replace(learner=self._previous, env_state=env_state, key=key)

    def metrics(self) -> dict[str, float]:
        return {"train/skipped_updates": float(len(self.skipped))} if self.skip else {}


def params_health(params) -> dict[str, jax.Array]:
    """The health flag of an update's parameters (1.0: all finite), as the synchronous step reports it."""
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(params)]))
    return {"health/sgd_step_params": finite.astype(jnp.float32)}


def trajectory_stages(unrolls: dict) -> list[str]:
    """The stages whose output in a trajectory (`[U, T, G, E, ...]`, on the host or the device) holds NaN or Inf."""
    observations = [unrolls[k] for k in ("obs", "last_obs", "final_obs") if k in unrolls]
    observations_ok, rewards_ok = jax.device_get(_finite_flags(observations, unrolls["reward"]))
    return ([] if observations_ok else ["env_step_observations"]) + ([] if rewards_ok else ["env_step_rewards"])


@jax.jit
def _finite_flags(observations, reward):
    """Reduced where the data is: a trajectory on the GPU is not copied to the host to be checked."""
    return (jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in observations])),
            jnp.all(jnp.isfinite(reward)))
