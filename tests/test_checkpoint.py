"""Checkpoints: round trip of awkward trees, and clear errors for damaged ones."""

import os

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrose.checkpoint import Checkpointer, CheckpointError


def test_round_trip_keeps_zero_size_and_nested_leaves(tmp_path, tiny_config):
    # MJX's Data has zero-size arrays (e.g. `act` for the ant), which orbax refuses on its own.
    tree = {"a": jnp.arange(6.0).reshape(2, 3), "empty": jnp.zeros((4, 0)), "nested": {"k": jnp.uint32(7)}}
    checkpointer = Checkpointer(str(tmp_path), keep=2)
    checkpointer.save(3, tree, tiny_config)
    target = {"a": jnp.zeros((2, 3)), "empty": jnp.zeros((4, 0)), "nested": {"k": jnp.uint32(0)}}
    restored = checkpointer.restore(target, tiny_config)
    np.testing.assert_array_equal(restored["a"], tree["a"])
    assert restored["empty"].shape == (4, 0)
    assert int(restored["nested"]["k"]) == 7
    assert checkpointer.latest_step() == 3


def test_notes_come_back_with_their_step_and_a_step_without_has_none(tmp_path, tiny_config):
    checkpointer = Checkpointer(str(tmp_path), keep=3)
    checkpointer.save(1, {"x": jnp.ones(2)}, tiny_config)  # as an older jaxrose wrote them
    checkpointer.save(2, {"x": jnp.ones(2)}, tiny_config, {"evaluated_iterations": [2, 4]})
    assert checkpointer.notes(1) == {} and checkpointer.notes(2) == {"evaluated_iterations": [2, 4]}
    assert checkpointer.notes(7) == {}  # no such step: nothing to redo


def test_keeps_only_the_newest(tmp_path, tiny_config):
    checkpointer = Checkpointer(str(tmp_path), keep=2)
    for step in (1, 2, 3):
        checkpointer.save(step, {"x": jnp.full((2,), step)}, tiny_config)
    assert sorted(int(p) for p in os.listdir(tmp_path) if p.isdigit()) == [2, 3]


def test_truncated_checkpoint_gives_clear_error(tmp_path, tiny_config):
    checkpointer = Checkpointer(str(tmp_path), keep=2)
    checkpointer.save(1, {"x": jnp.arange(1000.0)}, tiny_config)
    # Damage every data file of the saved step.
    for root, _, files in os.walk(tmp_path / "1"):
        for name in files:
            path = os.path.join(root, name)
            if os.path.getsize(path) > 0 and not name.endswith(".json") and "_METADATA" not in name:
                with open(path, "r+b") as f:
                    f.truncate(max(1, os.path.getsize(path) // 3))
    with pytest.raises(CheckpointError, match="cannot be read"):
        Checkpointer(str(tmp_path)).restore({"x": jnp.zeros(1000)}, tiny_config)


def test_unwritable_folder_is_named(tmp_path, tiny_config):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(CheckpointError, match="run.out_dir"):
        Checkpointer(str(blocker / "checkpoints"))


def test_training_writes_checkpoints_in_the_background(tmp_path, tiny_config, monkeypatch):
    """Each save runs in the writer thread while the training thread goes on (a slowed save,
    injected, is the fault that shows it); every step is on disk when `train` returns."""
    import threading
    import time

    from jaxrose.config import replace
    from jaxrose.train import train

    calls, original = [], Checkpointer.save

    def slow_save(self, step, state, config, notes=None):  # fault injection: a slow disk
        calls.append((step, threading.current_thread().name, time.perf_counter()))
        time.sleep(0.3)
        original(self, step, state, config, notes)

    monkeypatch.setattr(Checkpointer, "save", slow_save)
    config = replace(tiny_config, **{"run.out_dir": str(tmp_path), "run.checkpoint_every": 1,
                                     "run.keep_checkpoints": 10})
    result = train(config)
    steps = [step for step, _, _ in calls]
    assert steps == list(range(1, config.num_iterations + 1))
    assert {name for _, name, _ in calls} == {"checkpoint-writer"}
    # Training did not wait for each write: its iterations started while saves were sleeping.
    overlapped = [t for t in result.iteration_start_times if any(c < t < c + 0.3 for _, _, c in calls)]
    assert overlapped, "no iteration ran during a checkpoint write"
    assert sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit()) == steps
