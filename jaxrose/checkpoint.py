"""Checkpoints of the full run state (params, optimizer, normalizer, env state, RNG, counter) with orbax.

orbax writes each step into a temporary folder and renames it when complete, so a crash mid-save
leaves the previous checkpoint intact; `restore` checks the saved config against the run's, and a
checkpoint that cannot be read raises `CheckpointError` naming the folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or belongs to a different configuration."""


class Checkpointer:
    def __init__(self, directory: str, keep: int = 3):
        self.directory = os.path.abspath(directory)
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as error:
            raise CheckpointError(f"Cannot create the checkpoint folder {self.directory}: {error}. "
                                  f"Set run.out_dir to a writable folder.") from error
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state: Any, config) -> None:
        meta = {"format_version": FORMAT_VERSION, "config": dataclasses.asdict(config)}
        self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(_flatten(state)),
                                                         meta=ocp.args.JsonSave(meta)), force=True)
        self._manager.wait_until_finished()

    def restore(self, target: Any, config, step: int | None = None) -> Any:
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"No checkpoint found in {self.directory}. Check run.resume.")
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(_flatten(target)), meta=ocp.args.JsonRestore()))
        except Exception as error:  # orbax raises many types for unreadable data
            raise CheckpointError(f"Checkpoint step {step} in {self.directory} cannot be read "
                                  f"({type(error).__name__}: {error}). It may be truncated or altered; "
                                  f"delete that step's folder to resume from the one before.") from error
        meta = restored["meta"]
        if meta.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(f"Checkpoint in {self.directory} has format version "
                                  f"{meta.get('format_version')}, this jaxrose reads {FORMAT_VERSION}.")
        saved, current = meta["config"], json.loads(json.dumps(dataclasses.asdict(config)))
        for section in ("env", "network", "ppo"):
            if saved.get(section) != current[section]:
                raise CheckpointError(f"Checkpoint in {self.directory} was written with different {section} "
                                      f"settings ({saved.get(section)} vs {current[section]}); resume with "
                                      f"the same settings or start a new run.out_dir.")
        return _unflatten(target, restored["state"])

    def close(self) -> None:
        self._manager.close()


def _flatten(tree: Any) -> dict[str, Any]:
    """The tree as {path: array}, without zero-size arrays, which orbax refuses to save (MJX's
    `Data` has some, e.g. `act` for a model without actuator state)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(path): leaf for path, leaf in flat if getattr(leaf, "size", 1) > 0}


def _unflatten(target: Any, flat: dict[str, Any]) -> Any:
    leaves, treedef = jax.tree_util.tree_flatten_with_path(target)
    restored = [flat[jax.tree_util.keystr(path)] if getattr(leaf, "size", 1) > 0 else leaf for path, leaf in leaves]
    return jax.tree_util.tree_unflatten(treedef, restored)
