"""Checkpoints of the asynchronous mode: a `Snapshot` written by a background thread.

The trainer hands over host copies (the learner's and each actor's state), so the actors and the
learner go on while orbax writes; only one save is in flight, and its error surfaces at the next
save or at `close`. The tree holds the learner, each actor's env state and RNG key, and the
counters (updates, consumed env steps); the step number is the update count.
"""

from __future__ import annotations

import threading
import warnings
from typing import Optional

import jax
import numpy as np

from jaxrose.async_mode import Snapshot
from jaxrose.checkpoint import Checkpointer


def to_tree(snapshot: Snapshot) -> dict:
    return {"learner": snapshot.learner,
            "actors": [{"env_state": env_state, "key": key} for env_state, key in snapshot.actors],
            "updates": np.asarray(snapshot.updates, np.int64), "env_steps": np.asarray(snapshot.env_steps, np.int64)}


def from_tree(tree: dict) -> Snapshot:
    return Snapshot(tree["learner"], [(a["env_state"], a["key"]) for a in tree["actors"]],
                    int(tree["updates"]), int(tree["env_steps"]))


def restore(checkpointer: Checkpointer, template: Snapshot, config) -> Snapshot:
    """The newest intact step, with `template`'s tree (see `Checkpointer.restore`). Each actor's env
    state comes back with the group count it was saved with (the resource manager may have changed
    it): orbax restores host arrays at their saved shapes."""
    snapshot = from_tree(checkpointer.restore(to_tree(template), config))
    snapshot.evaluated = tuple(checkpointer.notes(snapshot.updates).get("evaluated_iterations", ()))
    snapshot.actors = [(_fit_empty_leaves(env_state), key) for env_state, key in snapshot.actors]
    return snapshot


def _fit_empty_leaves(env_state):
    """Zero-size leaves are not saved (`checkpoint._flatten`) but taken from the template: give
    them the restored group count (the leading axis of the saved leaves)."""
    saved = [x.shape[0] for x in jax.tree.leaves(env_state) if x.size]
    if not saved:
        return env_state
    return jax.tree.map(lambda x: x if x.size else np.zeros((saved[0],) + x.shape[1:], x.dtype), env_state)


SLOW_SAVE_SECONDS = 60.0  # a save taking longer than this is reported while training waits for it


class BackgroundSaver:
    def __init__(self, checkpointer: Checkpointer, config):
        self.checkpointer, self.config = checkpointer, config
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self.saved: list[int] = []

    def __call__(self, snapshot: Snapshot) -> None:
        self.submit(snapshot.updates, to_tree(snapshot),
                    {"evaluated_iterations": list(snapshot.evaluated)} if snapshot.evaluated else None)

    def submit(self, step: int, tree, notes: Optional[dict] = None) -> None:
        """Writes `tree` (host arrays: the caller may reuse its device buffers) as `step` in a
        thread, after the previous save has finished; training goes on meanwhile. A step the folder
        holds already is the same state (a run resumed in place that made no update since): skipped."""
        self.wait()
        if step == self.checkpointer.latest_step():
            return
        self._thread = threading.Thread(target=self._save, args=(step, tree, notes), name="checkpoint-writer",
                                        daemon=True)
        self._thread.start()

    def _save(self, step: int, tree, notes: Optional[dict]) -> None:
        try:
            self.checkpointer.save(step, tree, self.config, notes)
            self.saved.append(step)
        except BaseException as error:  # raised in the training thread by `wait`
            self._error = error

    def wait(self) -> None:
        """Waits for the save in flight; raises its error, if it failed."""
        if self._thread is not None:
            self._thread.join(SLOW_SAVE_SECONDS)
            if self._thread.is_alive():  # a slow or stuck disk: say why training waits, then wait
                warnings.warn(f"A checkpoint is still being written to {self.checkpointer.directory} after "
                              f"{SLOW_SAVE_SECONDS:.0f} s; training waits for it. Check that disk (full, slow, or a "
                              f"hung network mount).", stacklevel=2)
                self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
