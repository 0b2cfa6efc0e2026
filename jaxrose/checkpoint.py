"""Checkpoints of the full run state (params, optimizer, normalizer, env state, RNG, counter) with orbax.

orbax writes each step into a temporary folder and renames it when complete, so a crash mid-save
leaves the previous checkpoint intact. orbax does not notice altered data (a flipped bit restores
as a wrong number, even NaN), so each step also gets a checksum manifest once orbax is done
(`jaxrose.manifest`), verified before restoring. Resuming takes the newest intact step: a damaged
newer one is moved aside with a warning. A save that fails (full disk, no permission) removes its
partial files and raises `CheckpointError` naming the folder; the previous step stays.

Over several processes (`jaxrose.distributed`) every process calls `save` and writes its shards of
the sharded arrays (orbax coordinates them); process 0 writes the manifest. A restore reshards to
the target's shardings, so a step saved on N devices restores on any other count.
"""

from __future__ import annotations

import dataclasses
import errno
import glob
import json
import os
import shutil
import time
import warnings
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp

from jaxrose import distributed, manifest

FORMAT_VERSION = 1
ORBAX_TMP_SUFFIX = ".orbax-checkpoint-tmp"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or belongs to a different configuration."""


class DamagedCheckpointError(CheckpointError):
    """A saved step cannot be read or differs from its checksums (truncated, altered)."""

    def __init__(self, message: str, step: int, folder: str, problem: str):
        super().__init__(message)
        self.step, self.folder, self.problem = step, folder, problem


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

    def save(self, step: int, state: Any, config, notes: Optional[dict] = None) -> None:
        """`notes`: JSON facts about the step that are not state (read back with `notes`)."""
        meta = {"format_version": FORMAT_VERSION, "config": dataclasses.asdict(config), "layout": _layout(config),
                **({"notes": notes} if notes else {})}
        try:
            self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(_flatten(state)),
                                                             meta=ocp.args.JsonSave(meta)), force=True)
            self._manager.wait_until_finished()
        except Exception as error:
            self._remove_partial(step)
            raise self._save_error(step, error) from error
        # Over several processes each writes its own shards; process 0 lists them once all are done.
        distributed.barrier(f"jaxrose_checkpoint_saved_{step}")
        try:
            if distributed.is_main_process():
                manifest.write(self.step_dir(step))
        except Exception as error:
            # A step without its manifest could not be checked later: drop it, keep the previous one.
            shutil.rmtree(self.step_dir(step), ignore_errors=True)
            self._manager.reload()
            raise self._save_error(step, error) from error
        finally:
            distributed.barrier(f"jaxrose_checkpoint_listed_{step}")

    def _remove_partial(self, step: int) -> None:
        """Removes the temporary folder a failed save leaves (on a full disk that space is needed
        back). tensorstore may still finish a write into it just after the error, so this goes on
        until the folder has stayed away for a few polls."""
        pattern = os.path.join(self.directory, f"{step}{ORBAX_TMP_SUFFIX}*")
        quiet, deadline = 0, time.monotonic() + 5.0
        while quiet < 3 and time.monotonic() < deadline:
            partial = glob.glob(pattern)
            for folder in partial:
                shutil.rmtree(folder, ignore_errors=True)
            quiet = 0 if partial else quiet + 1
            time.sleep(0.05)

    def _save_error(self, step: int, error: Exception) -> Exception:
        reason = _os_reason(error)
        if reason is None:
            return error  # not the file system's doing: a bug to see as is
        latest = self.latest_step()
        kept = (f"The previous checkpoint (step {latest}) is intact." if latest is not None
                else "No earlier checkpoint exists in it.")
        return CheckpointError(f"Could not save checkpoint step {step} in {self.directory}: {reason}. {kept} "
                               f"Free space there or set run.out_dir to a folder on a disk with room, then "
                               f"continue with --run.resume.")

    def step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def reload(self) -> None:
        """Re-reads the folder (after another Checkpointer moved a damaged step aside)."""
        self._manager.reload()

    def restore(self, target: Any, config, step: int | None = None) -> Any:
        """Restores `step`, or else the newest intact step: newer damaged ones are moved aside to
        `<step>.damaged`, with a warning, so the resumed run can save those step numbers again."""
        if step is not None:
            return self._restore(target, config, step)
        steps = sorted(self._manager.all_steps(), reverse=True)
        if not steps:
            raise CheckpointError(f"No checkpoint found in {self.directory}. Check run.resume.")
        damaged: list[DamagedCheckpointError] = []
        for candidate in steps:
            try:
                restored = self._restore(target, config, candidate)
            except DamagedCheckpointError as error:
                damaged.append(error)
                continue
            for error in damaged:
                warnings.warn(f"Checkpoint step {error.step} ({error.folder}) cannot be read ({error.problem}); it "
                              f"may be truncated or altered. {self._set_aside(error.folder)} Resuming from step "
                              f"{candidate}, the newest intact one.", stacklevel=2)
            return restored
        if len(damaged) == 1:
            raise damaged[0]
        raise CheckpointError(f"{damaged[0]} No intact step is left in {self.directory} (steps "
                              f"{', '.join(str(e.step) for e in damaged)} are all damaged): start a new run.out_dir.")

    def _restore(self, target: Any, config, step: int) -> Any:
        folder = self.step_dir(step)
        problem = manifest.verify(folder)
        if problem is None:
            self._check_layout(step, config)
            try:
                restored = self._manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(_flatten(target)), meta=ocp.args.JsonRestore()))
            except Exception as error:  # orbax raises many types for unreadable data
                problem = f"{type(error).__name__}: {error}"
        if problem is not None:
            earlier = [s for s in self._manager.all_steps() if s < step]
            advice = (f"Step {max(earlier)} before it is kept: resume without naming a step to use the newest "
                      f"intact one." if earlier else f"No earlier step is kept in {self.directory}: start a new "
                      f"run.out_dir.")
            raise DamagedCheckpointError(f"Checkpoint step {step} ({folder}) cannot be read ({problem}). It may be "
                                         f"truncated or altered. {advice}", step, folder, problem)
        meta = restored["meta"]
        if meta.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(f"Checkpoint in {self.directory} has format version "
                                  f"{meta.get('format_version')}, this jaxrose reads {FORMAT_VERSION}.")
        _check_settings(meta, config, self.directory)
        return _unflatten(target, restored["state"])

    def notes(self, step: int) -> dict:
        """The notes saved with `step` (none for a step saved without, or by an older jaxrose)."""
        meta = self._saved_meta(step)
        return (meta or {}).get("notes") or {}

    def _saved_meta(self, step: int) -> Optional[dict]:
        """The step's metadata alone; None where it cannot be read (the full restore reports that as damage)."""
        try:
            return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        except Exception:
            return None

    def _check_layout(self, step: int, config) -> None:
        """The state's tree depends on the mode (and the actor count), its shapes on the settings: say
        which differ before orbax fails on a shape, which would read as a damaged step."""
        saved = self._saved_meta(step)
        if saved is None:
            return
        layout = saved.get("layout", {"mode": "sync"})
        if layout != _layout(config):
            raise CheckpointError(f"Checkpoint step {step} in {self.directory} holds a {layout} run's state, not "
                                  f"a {_layout(config)} one; resume with the same run.mode and run.actors.")
        if isinstance(saved.get("config"), dict):
            _check_settings(saved, config, self.directory)

    def _set_aside(self, folder: str) -> str:
        """Renames a damaged step's folder (kept for inspection); says where it went."""
        target, n = f"{folder}.damaged", 1
        while os.path.exists(target):
            n += 1
            target = f"{folder}.damaged{n}"
        try:
            os.rename(folder, target)
        except OSError as error:
            return f"It could not be moved aside ({error}); move it away before saving that step again."
        self._manager.reload()
        return f"Moved it to {target}."

    def close(self) -> None:
        self._manager.close()


def _check_settings(meta: dict, config, directory: str) -> None:
    saved, current = meta["config"], json.loads(json.dumps(dataclasses.asdict(config)))
    for section in ("env", "network", "ppo"):
        if saved.get(section) != current[section]:
            changed = sorted(k for k in set(saved.get(section) or {}) | set(current[section])
                             if (saved.get(section) or {}).get(k) != current[section].get(k))
            detail = ", ".join(f"{section}.{k}: {(saved.get(section) or {}).get(k)!r} saved, "
                               f"{current[section].get(k)!r} now" for k in changed)
            raise CheckpointError(f"Checkpoint in {directory} was written with different {section} settings "
                                  f"({detail}); resume with the same settings or start a new run.out_dir.")


def _layout(config) -> dict:
    """What shapes a checkpoint's tree: the asynchronous mode stores one env state per actor."""
    if config.run.mode == "async":
        return {"mode": "async", "actors": config.run.actors}
    return {"mode": "sync"}


def _flatten(tree: Any) -> dict[str, Any]:
    """The tree as {path: array}, without zero-size arrays, which orbax refuses to save (MJX's
    `Data` has some, e.g. `act` for a model without actuator state)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(path): leaf for path, leaf in flat if getattr(leaf, "size", 1) > 0}


def _unflatten(target: Any, flat: dict[str, Any]) -> Any:
    leaves, treedef = jax.tree_util.tree_flatten_with_path(target)
    restored = [flat[jax.tree_util.keystr(path)] if getattr(leaf, "size", 1) > 0 else leaf for path, leaf in leaves]
    return jax.tree_util.tree_unflatten(treedef, restored)


def _os_reason(error: BaseException) -> Optional[str]:
    """What the file system said, if it caused `error` (orbax and tensorstore wrap OS errors)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno is not None:
            return os.strerror(error.errno)
        text = str(error)
        for code in (errno.ENOSPC, errno.EACCES, errno.EROFS, errno.EDQUOT):
            if os.strerror(code) in text:
                return os.strerror(code)
        error = error.__cause__ or error.__context__
    return None
