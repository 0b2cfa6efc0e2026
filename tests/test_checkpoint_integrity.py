"""Checkpoint integrity: altered steps are refused and resuming falls back to the newest intact one;
a full disk during a save names the folder and keeps the previous checkpoint."""

import errno
import os
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from etils import epath

from jaxrose import manifest, train
from jaxrose.checkpoint import Checkpointer, CheckpointError, DamagedCheckpointError
from jaxrose.config import RunConfig, replace


def steps_in(folder) -> list[int]:
    return sorted(int(p) for p in os.listdir(folder) if p.isdigit())


def flip_one_bit(step_folder) -> str:
    """Alters (does not truncate) the step's largest array data file; returns its path. orbax alone
    restores such a file silently as different numbers."""
    data = [os.path.join(root, name) for root, _, names in os.walk(step_folder) for name in names
            if os.sep + "d" + os.sep in os.path.join(root, name)]
    path = max(data, key=os.path.getsize)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 0x01]))
    return path


def save_steps(folder, config, steps, keep=3) -> Checkpointer:
    checkpointer = Checkpointer(str(folder), keep=keep)
    for step in steps:
        checkpointer.save(step, {"x": jnp.arange(1000.0) * step}, config)
    return checkpointer


def test_altered_step_is_refused_naming_its_folder(tmp_path, tiny_config):
    save_steps(tmp_path, tiny_config, (1, 2))
    assert manifest.verify(str(tmp_path / "2")) is None
    flip_one_bit(tmp_path / "2")
    with pytest.raises(DamagedCheckpointError, match=rf"step 2 \({tmp_path / '2'}\) cannot be read .*differs from "
                                                     r"its saved checksum.*Step 1 before it is kept"):
        Checkpointer(str(tmp_path)).restore({"x": jnp.zeros(1000)}, tiny_config, step=2)


def test_resume_falls_back_to_the_newest_intact_step(tmp_path, tiny_config):
    # The default keeps 3 steps, so the step before a damaged newest one is still there.
    assert RunConfig().keep_checkpoints >= 2
    save_steps(tmp_path, tiny_config, (1, 2, 3, 4), keep=RunConfig().keep_checkpoints)
    assert steps_in(tmp_path) == [2, 3, 4]
    flip_one_bit(tmp_path / "4")
    checkpointer = Checkpointer(str(tmp_path))
    with pytest.warns(UserWarning, match=r"step 4 .* cannot be read .*Moved it to .*4\.damaged\. Resuming from step 3"):
        restored = checkpointer.restore({"x": jnp.zeros(1000)}, tiny_config)
    np.testing.assert_array_equal(restored["x"], np.arange(1000.0) * 3)
    assert steps_in(tmp_path) == [2, 3] and (tmp_path / "4.damaged").is_dir()
    checkpointer.save(4, {"x": jnp.arange(1000.0) * 4}, tiny_config)  # the step number is free again
    assert checkpointer.latest_step() == 4


def test_every_step_damaged_is_a_clear_error(tmp_path, tiny_config):
    save_steps(tmp_path, tiny_config, (1, 2))
    for step in (1, 2):
        flip_one_bit(tmp_path / str(step))
    with pytest.raises(CheckpointError, match=r"No intact step is left .*steps 2, 1 are all damaged"):
        Checkpointer(str(tmp_path)).restore({"x": jnp.zeros(1000)}, tiny_config)


def test_training_resumes_past_a_damaged_latest_step_bit_for_bit(tmp_path, tiny_config):
    """The damaged step is recomputed from the one before, to the same bits, and saved again."""
    config = replace(tiny_config, **{"run.out_dir": str(tmp_path), "run.checkpoint_every": 1})
    straight = train(config)
    assert steps_in(tmp_path / "checkpoints") == [2, 3, 4]
    flip_one_bit(tmp_path / "checkpoints" / "4")
    with pytest.warns(UserWarning, match="Resuming from step 3"):
        resumed = train(replace(config, **{"run.resume": str(tmp_path)}))
    for a, b in zip(jax.tree.leaves(straight.state), jax.tree.leaves(resumed.state), strict=True):
        np.testing.assert_array_equal(a, b)
    assert 4 in steps_in(tmp_path / "checkpoints") and (tmp_path / "checkpoints" / "4.damaged").is_dir()


def inject_enospc_into_orbax_metadata_write(monkeypatch):
    """Fault injection (test only): the disk fills up while orbax writes a step's metadata file."""
    path_class = type(epath.Path("/"))
    original = path_class.write_text

    def full_disk(self, *args, **kwargs):
        if self.name == "metadata":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(path_class, "write_text", full_disk)


def inject_enospc_into_manifest_write(monkeypatch):
    """Fault injection (test only): orbax's files fit, then the disk fills up while the checksum
    manifest is written."""
    def full_disk(path, mode="r", *args, **kwargs):
        if "w" in mode:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(manifest, "open", full_disk, raising=False)


@pytest.mark.parametrize("inject", [inject_enospc_into_orbax_metadata_write, inject_enospc_into_manifest_write])
def test_full_disk_during_save_names_out_dir_and_keeps_the_previous_step(tmp_path, tiny_config, monkeypatch, inject):
    checkpointer = save_steps(tmp_path, tiny_config, (1,))
    inject(monkeypatch)
    with pytest.raises(CheckpointError, match=r"Could not save checkpoint step 2 in .*: No space left on device\. "
                                              r"The previous checkpoint \(step 1\) is intact.*run\.out_dir"):
        checkpointer.save(2, {"x": jnp.arange(1000.0) * 2}, tiny_config)
    monkeypatch.undo()  # space freed
    assert sorted(os.listdir(tmp_path)) == ["1"]  # no partial step left taking space
    assert checkpointer.latest_step() == 1
    restored = Checkpointer(str(tmp_path)).restore({"x": jnp.zeros(1000)}, tiny_config)
    np.testing.assert_array_equal(restored["x"], np.arange(1000.0))
    checkpointer.save(2, {"x": jnp.arange(1000.0) * 2}, tiny_config)
    assert checkpointer.latest_step() == 2


def test_really_full_disk(tmp_path, tiny_config):
    """The same on a real 256 KiB tmpfs, through tensorstore's own write path (needs mount rights)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)],
                                 capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        mounted = False
    if not mounted:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        checkpointer = save_steps(disk, tiny_config, (1,))
        with pytest.raises(CheckpointError, match=r"No space left on device\. The previous checkpoint \(step 1\)"):
            checkpointer.save(2, {"x": jnp.asarray(np.random.default_rng(0).random(300_000, np.float32))},
                              tiny_config)
        assert sorted(os.listdir(disk)) == ["1"]
        restored = Checkpointer(str(disk)).restore({"x": jnp.zeros(1000)}, tiny_config)
        np.testing.assert_array_equal(restored["x"], np.arange(1000.0))
        checkpointer.close()
    finally:
        subprocess.run(["umount", str(disk)], check=False)
