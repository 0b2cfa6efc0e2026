"""What the training loop does when an iteration produces NaN or Inf (`run.on_nonfinite`).

stop: raise `NonFiniteError` naming the stage; that state is never checkpointed.
skip: throw the iteration's update away (the learner state from before it is kept), reset the
envs whose state is no longer finite, warn naming the stage, and go on; after
`run.max_consecutive_skips` skipped iterations in a row, stop as above. The RNG key and the
healthy envs move on: keeping them too would replay the same iteration bit for bit, and fail again.
Skipping costs one device copy of the learner state per iteration (the executor donates its input).
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, Optional

import jax
import jax.numpy as jnp

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


class NonFiniteGuard:
    """Checks each iteration's health metrics; see the module docstring for what each setting does."""

    def __init__(self, executor: SequentialExecutor, run: RunConfig, last_checkpoint: Callable[[], Optional[int]],
                 out_dir: str):
        self.executor = executor
        self.skip = run.on_nonfinite == "skip"
        self.limit = run.max_consecutive_skips
        self.last_checkpoint, self.out_dir = last_checkpoint, out_dir
        self.skipped: list[int] = []
        self.consecutive = 0
        self._previous = None
        if self.skip:
            self._copy = jax.jit(_copy)
            shardings = executor.state_sharding().env_state if executor.config.run.devices > 1 else None
            self._reset = jax.jit(lambda env_state, key: reset_broken_envs(executor.train_env, env_state, key),
                                  out_shardings=(shardings, None) if shardings is not None else None)

    def before_step(self, state: RunState) -> None:
        if self.skip:
            self._previous = self._copy(state.learner)

    def check(self, iteration: int, state: RunState, metrics: dict[str, float]) -> RunState:
        """The state to go on with: `state` itself, or after a skip the previous learner state."""
        bad = bad_stages(metrics)
        if not bad:
            self.consecutive = 0
            return state
        stages = ", ".join(bad)
        if not self.skip:
            raise NonFiniteError(
                f"Iteration {iteration} produced NaN or Inf in: {stages}. The run stopped before saving that state; "
                f"the last good checkpoint is iteration {self.last_checkpoint()} in {self.out_dir}. Check the env's "
                f"observations and rewards, or lower ppo.learning_rate / set ppo.max_grad_norm "
                f"(run.on_nonfinite='skip' skips such updates instead).")
        if self.consecutive >= self.limit:
            raise NonFiniteError(
                f"Iteration {iteration} produced NaN or Inf in: {stages}, after {self.consecutive} skipped iterations "
                f"in a row (run.max_consecutive_skips={self.limit}), so the run stopped; skipping does not help here. "
                f"The last good checkpoint is iteration {self.last_checkpoint()} in {self.out_dir}. Check the env's "
                f"observations and rewards, or lower ppo.learning_rate / set ppo.max_grad_norm.")
        self.consecutive += 1
        self.skipped.append(iteration)
        if hasattr(self.executor, "materialize"):  # group processes hold the live env state
            state = self.executor.materialize(state)
        key, reset_key = jax.random.split(state.key)
        env_state, reset = self._reset(state.env_state, reset_key)
        if hasattr(self.executor, "reload"):  # they go on from the reset envs and the new key
            self.executor.reload()
        warnings.warn(f"Iteration {iteration} produced NaN or Inf in: {stages}; its update was skipped "
                      f"(run.on_nonfinite='skip'; {self.consecutive} in a row, of at most "
                      f"run.max_consecutive_skips={self.limit}) and {int(reset)} env(s) with a non-finite state "
                      f"were reset.", NonFiniteWarning, stacklevel=2)
        return state.replace(learner=self._previous, env_state=env_state, key=key)

    def metrics(self) -> dict[str, float]:
        return {"train/skipped_updates": float(len(self.skipped))} if self.skip else {}
