"""Asynchronous-mode checkpoints: a snapshot written and restored continues the run exactly at lag 0."""

import json
import multiprocessing
import shutil

import jax
import numpy as np
import pytest

from jaxrose import async_checkpoint
from jaxrose.async_mode import AsyncTrainer
from jaxrose.checkpoint import Checkpointer, CheckpointError
from jaxrose.config import replace


def _assert_same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_lag_zero_run_resumed_from_a_checkpoint_equals_the_uninterrupted_run(tiny_config, tmp_path):
    config = replace(tiny_config, **{"run.mode": "async", "run.actors": 2, "run.max_policy_lag": 0})
    trainer = AsyncTrainer(config, num_actors=2, max_lag=0)
    try:
        initial = trainer.template()
        full = trainer.run(updates=4, start=initial)
        snapshots = []
        first = trainer.run(updates=2, start=initial, snapshot_due=lambda u, s: u == 1, on_snapshot=snapshots.append)
        assert [s.updates for s in snapshots] == [1, 2] and first.updates == 2
        checkpointer = Checkpointer(str(tmp_path / "checkpoints"))
        saver = async_checkpoint.BackgroundSaver(checkpointer, config)
        for snapshot in snapshots:
            saver(snapshot)
        saver.wait()
        restored = async_checkpoint.restore(checkpointer, initial, config)
        assert (restored.updates, restored.env_steps) == (2, 2 * config.env_steps_per_iteration)
        resumed = trainer.run(updates=4, start=restored)
    finally:
        trainer.close()
    assert resumed.updates == 2 and resumed.lags == [0] * 4
    _assert_same(full.learner, resumed.learner)
    with pytest.raises(CheckpointError, match="resume with the same run.mode and run.actors"):
        async_checkpoint.restore(checkpointer, initial, replace(config, **{"run.mode": "sync"}))
    assert not multiprocessing.active_children()


def test_train_async_resumes_with_run_resume(tiny_config, tmp_path):
    from jaxrose import train

    config = replace(tiny_config, **{"run.mode": "async", "run.actors": 2, "run.max_policy_lag": 0,
                                     "run.out_dir": str(tmp_path / "a"), "run.num_evals": 3,
                                     "run.checkpoint_every": 2})
    full = train(config)
    assert [e["iteration"] for e in full.evaluations] == [0, 2, 4]  # updates 2 and 4 are iterations 2 and 4
    folder = tmp_path / "a" / "checkpoints"
    assert sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) == [2, 4]
    # As if the run had been killed after the checkpoint in the middle, with the evaluation of its learner in
    # flight: no later checkpoint, no logged evaluation of step 1024.
    shutil.rmtree(folder / "4")
    metrics = tmp_path / "a" / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    lost = [json.loads(line) for line in lines if '"eval/episode_return"' in line and '"step": 1024' in line]
    assert len(lost) == 1
    metrics.write_text("".join(line for line in lines if json.loads(line) != lost[0]))
    resumed = train(replace(config, **{"run.resume": str(tmp_path / "a"), "run.out_dir": str(tmp_path / "b")}))
    assert resumed.async_result.updates == 2 and resumed.async_result.lags == [0] * 4
    _assert_same(full.state.learner, resumed.state.learner)
    # The checkpoint's learner and the step's key: the evaluation the killed run would have logged, redone once.
    assert [e["iteration"] for e in resumed.evaluations] == [2, 4]
    assert resumed.evaluations[0]["eval/episode_return"] == lost[0]["eval/episode_return"]
    assert sorted(int(p.name) for p in (tmp_path / "b" / "checkpoints").iterdir() if p.name.isdigit()) == [4]
    # Resumed in place once finished (README: --run.resume runs/pm --run.out-dir runs/pm): nothing to do,
    # and its final snapshot is the step it restored (orbax refused to save it again before).
    again = train(replace(config, **{"run.resume": str(tmp_path / "b"), "run.out_dir": str(tmp_path / "b")}))
    assert again.async_result.updates == 0 and again.evaluations == []  # step 4's evaluation was logged
    _assert_same(full.state.learner, again.state.learner)
    assert not multiprocessing.active_children()


def test_a_resized_actors_batch_size_survives_a_checkpoint(tiny_config, tmp_path):
    config = replace(tiny_config, **{"run.mode": "async", "run.actors": 2, "run.max_policy_lag": 0})
    trainer = AsyncTrainer(config, num_actors=2, max_lag=0)
    try:
        initial = trainer.template()  # 1 group per actor: the shapes the restore is given
        trainer.resize_actor(0, 2, update=0)
        snapshots = []
        first = trainer.run(updates=2, on_snapshot=snapshots.append)
        checkpointer = Checkpointer(str(tmp_path / "checkpoints"))
        saver = async_checkpoint.BackgroundSaver(checkpointer, config)
        saver(snapshots[-1])
        saver.wait()
        restored = async_checkpoint.restore(checkpointer, initial, config)
        assert [jax.tree.leaves(env_state)[0].shape[:2] for env_state, _ in restored.actors] == [(2, 16), (1, 16)]
        _assert_same(snapshots[-1].actors, restored.actors)
        resumed = trainer.run(updates=4, start=restored)
    finally:
        trainer.close()
    assert first.trajectory_groups == [(0, 2), (1, 1)] * 2  # lag 0: each update takes both, in actor order
    assert resumed.trajectory_groups == [(0, 2), (1, 1)] * 2 and resumed.groups_per_actor == [2, 1]
    assert resumed.env_steps == 2 * 3 * config.env_steps_per_iteration // config.env.num_groups
    assert not multiprocessing.active_children()


def test_zero_size_leaves_take_the_restored_group_count():
    # orbax does not save zero-size leaves (MJX's `act` without actuator state); they come from the
    # template, which may hold another group count than the restored state.
    restored = {"qpos": np.ones((2, 16, 3)), "act": np.zeros((1, 16, 0))}
    fitted = async_checkpoint._fit_empty_leaves(restored)
    assert fitted["act"].shape == (2, 16, 0) and fitted["qpos"] is restored["qpos"]


class SlowDiskCheckpointer:
    """Fault injection: a checkpointer on a disk that takes 0.5 s per save (no files written)."""

    directory = "/slow/disk/checkpoints"

    def __init__(self):
        self.saved = []

    def latest_step(self):
        return self.saved[-1] if self.saved else None

    def save(self, step, tree, config, notes=None):
        import time

        time.sleep(0.5)
        self.saved.append(step)


def test_a_slow_save_is_reported_while_training_waits_for_it(monkeypatch, tiny_config):
    monkeypatch.setattr(async_checkpoint, "SLOW_SAVE_SECONDS", 0.1)
    saver = async_checkpoint.BackgroundSaver(SlowDiskCheckpointer(), tiny_config)
    saver.submit(1, {"x": np.zeros(3)})
    with pytest.warns(UserWarning, match=r"still being written to /slow/disk/checkpoints after 0 s"):
        saver.wait()
    assert saver.saved == [1] and saver.checkpointer.saved == [1]  # it waited for the save to finish
    saver.submit(1, {"x": np.zeros(3)})  # the step the folder holds already: skipped, nothing to wait for
    saver.wait()
    assert saver.checkpointer.saved == [1]
