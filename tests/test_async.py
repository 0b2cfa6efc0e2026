"""Asynchronous mode with real actor processes: lag bound, lag 0 = synchronous, no stall, shutdown."""

import multiprocessing
import os
import signal
import time

import jax
import numpy as np
import pytest

from jaxrose.async_mode import AsyncTrainer
from jaxrose.config import ConfigError, replace
from jaxrose.sequential import SequentialExecutor
from jaxrose.workers import WorkerError


def test_lag_zero_with_one_actor_is_the_sequential_run(tiny_config):
    sequential = SequentialExecutor(tiny_config)
    state = sequential.init(jax.random.PRNGKey(tiny_config.run.seed))
    for _ in range(3):
        state, _ = sequential.step(state)
    trainer = AsyncTrainer(tiny_config, num_actors=1, max_lag=0)
    try:
        result = trainer.run(updates=3)
    finally:
        trainer.close()
    assert result.lags == [0, 0, 0]
    for a, b in zip(jax.tree.leaves(state.learner), jax.tree.leaves(result.learner), strict=True):
        np.testing.assert_array_equal(a, b)
    assert not multiprocessing.active_children()


@pytest.mark.parametrize("max_lag, run_ahead", [(0, 1), (1, 1)])
def test_lag_bound_is_never_exceeded(tiny_config, max_lag, run_ahead):
    config = replace(tiny_config, **{"env.num_groups": 4})
    trainer = AsyncTrainer(config, num_actors=4, max_lag=max_lag, run_ahead=run_ahead)
    try:
        result = trainer.run(updates=6)
    finally:
        trainer.close()
    assert result.run_ahead == min(run_ahead, max_lag)  # a rollout started ahead has a lag of at least 1
    assert max(result.lags) <= max_lag
    assert result.updates == 6
    if max_lag == 0:
        assert all(n == 6 for n in result.rollouts_per_actor.values())  # every update takes all groups


def test_run_ahead_hides_a_slow_learner_behind_the_rollouts(tiny_config):
    # One actor whose rollout takes 0.3 s and a learner whose update takes 0.25 s more (fault
    # injection). Waiting for its own update, the actor pays both per update; running one rollout
    # ahead with the parameters it has, it pays only its own, at a lag of 1.
    config = replace(tiny_config, **{"env.num_groups": 1})
    intervals, results = {}, {}
    for run_ahead in (0, 1):
        trainer = AsyncTrainer(config, num_actors=1, max_lag=1, run_ahead=run_ahead, actor_delays={0: 0.3},
                               learner_delay=0.25)
        times = []
        try:
            results[run_ahead] = trainer.run(updates=9, on_update=lambda *_: times.append(time.perf_counter()))
        finally:
            trainer.close()
        intervals[run_ahead] = (times[-1] - times[3]) / (len(times) - 4)  # after compiles
    assert results[0].lags == [0] * 9 and results[1].lags == [0] + [1] * 8
    assert intervals[0] > 0.5 and intervals[1] < 0.45 and intervals[1] < 0.75 * intervals[0], intervals
    # Every trajectory after the first of its batch size came back through the transport buffers.
    for run_ahead, result in results.items():
        assert result.hand_offs["pipe"] <= 1 + run_ahead and sum(result.hand_offs.values()) >= 9, result.hand_offs
        # The time accounting sees the injected delays: the actor's clock holds its 0.3 s for every
        # trajectory sent, the learner's busy time its 0.25 s for every update.
        assert len(result.actor_rollout_seconds[0]) == sum(result.hand_offs.values())
        assert min(result.actor_rollout_seconds[0]) >= 0.3
        assert len(result.learner_busy_seconds) == len(result.learner_wait_seconds) == 9
        assert min(result.learner_busy_seconds) >= 0.25
        # The actor's clock split: the injected delay lies after the hand-off, in neither part; a
        # rollout waiting for its own update is idle before it for about the learner's 0.25 s.
        timing = result.actor_timing[0]
        assert len(timing) == len(result.actor_rollout_seconds[0])
        for parts, total in zip(timing, result.actor_rollout_seconds[0]):
            assert parts["collect"] > 0 and parts["hand_off"] >= 0
            assert parts["collect"] + parts["hand_off"] + 0.3 <= total + 1e-6
        idle = float(np.median([t["idle_before"] for t in timing[3:]]))
        assert (idle >= 0.2) if run_ahead == 0 else (idle < 0.2), (run_ahead, idle)
    # Waiting for its own update, the actor starts each rollout only when the parameters arrive, so the
    # learner waits about a rollout per update; one rollout ahead, it waits for much less.
    waits = {r: float(np.median(results[r].learner_wait_seconds[3:])) for r in results}
    assert waits[0] > 0.2 and waits[1] < 0.5 * waits[0], waits
    assert not multiprocessing.active_children()


def test_queue_depth_is_what_waits_for_the_learner_when_it_becomes_free(tiny_config):
    # The resource manager's backlog signal. One actor running one rollout ahead: with a slow actor
    # (fault injection, 0.3 s per rollout) the learner finds nothing waiting when it becomes free;
    # a slow learner (0.3 s per update) finds the trajectories rolled out meanwhile.
    config = replace(tiny_config, **{"env.num_groups": 1})
    depths = {}
    for slow, delays in (("actor", {"actor_delays": {0: 0.3}}), ("learner", {"learner_delay": 0.3})):
        trainer = AsyncTrainer(config, num_actors=1, max_lag=1, run_ahead=1, **delays)
        try:
            depths[slow] = trainer.run(updates=8).queue_depths[3:]  # after the compiles
        finally:
            trainer.close()
    assert depths["actor"] == [0] * 5, depths
    # The learner's own grant lets the fast actor finish one more before the learner looks: 1 or 2.
    assert sum(d >= 1 for d in depths["learner"]) >= 4 and max(depths["learner"]) <= 2, depths
    assert not multiprocessing.active_children()


def test_a_slow_group_does_not_stall_the_others(tiny_config):
    config = replace(tiny_config, **{"env.num_groups": 2})
    trainer = AsyncTrainer(config, num_actors=2, max_lag=4, actor_delays={1: 1.0})
    try:
        result = trainer.run(updates=6)
    finally:
        trainer.close()
    assert max(result.lags) <= 4
    assert result.rollouts_per_actor[0] >= 2 * result.rollouts_per_actor[1], result.rollouts_per_actor
    assert not multiprocessing.active_children()


def test_a_hung_actor_is_named_within_the_timeout(tiny_config):
    trainer = AsyncTrainer(tiny_config, num_actors=2, max_lag=1)
    os.kill(trainer.actors[1].process.pid, signal.SIGSTOP)  # a fault injected: actor1 stops answering
    try:
        start = time.monotonic()
        with pytest.raises(WorkerError, match=r"actor1 \(pid \d+\) sent nothing for 5 s \(run.actor_timeout\)"):
            trainer.run(updates=6, timeout=5.0)
        assert time.monotonic() - start < 30
    finally:
        os.kill(trainer.actors[1].process.pid, signal.SIGCONT)
        trainer.close()
    assert not multiprocessing.active_children()


def test_actor_count_must_divide_groups(tiny_config):
    with pytest.raises(ConfigError, match=r"env\.num_groups \(2\) must be a multiple of the number of actors \(3\)"):
        AsyncTrainer(tiny_config, num_actors=3, max_lag=1)


def test_train_in_async_mode_logs_lag_and_evaluates_on_schedule(tiny_config, tmp_path):
    import json

    from jaxrose import train

    config = replace(tiny_config, **{"env.num_groups": 2, "run.mode": "async", "run.actors": 2,
                                     "run.max_policy_lag": 1, "run.out_dir": str(tmp_path)})
    result = train(config)
    assert [e["iteration"] for e in result.evaluations] == [0, 2, 4]
    assert max(result.async_result.lags) <= 1
    assert result.async_result.env_steps >= config.num_iterations * config.env_steps_per_iteration
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any("train/policy_lag_max" in r for r in records) and any("perf/rollout_sps" in r for r in records)
    assert not multiprocessing.active_children()


def test_actor_states_are_fetched_only_for_checkpoints(tiny_config, tmp_path, monkeypatch):
    # A snapshot copies every actor's env state to the learner: worth it for a checkpoint, a stall
    # in a run that writes nothing (jaxrose bench).
    from jaxrose import train

    requested = []
    original = AsyncTrainer._snapshot_request
    monkeypatch.setattr(AsyncTrainer, "_snapshot_request",
                        lambda self, *args: requested.append(args[0]) or original(self, *args))
    config = replace(tiny_config, **{"env.num_groups": 2, "run.mode": "async", "run.actors": 2,
                                     "run.max_policy_lag": 1, "run.out_dir": str(tmp_path)})
    result = train(config, write_outputs=False)
    assert requested == [] and [e["iteration"] for e in result.evaluations] == [0, 2, 4]
    train(config)
    assert requested and (tmp_path / "checkpoints").is_dir()
    assert not multiprocessing.active_children()


def test_the_learner_compiles_nothing_after_its_first_updates(tiny_config):
    # Trajectories arrive through the pipe first and through transport buffers after, at lag 0 and
    # then lag 1: one program per learner stage must serve them all (on the H200 a second variant
    # compiled mid-run once stalled the learner 4.5 s).
    config = replace(tiny_config, **{"env.num_groups": 1})
    compiles, per_update = [], []

    def listener(event, seconds, **_):
        if event.endswith("backend_compile_duration"):
            compiles.append(event)

    trainer = AsyncTrainer(config, num_actors=1, max_lag=1, run_ahead=1)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        result = trainer.run(updates=8, on_update=lambda *_: per_update.append(len(compiles)))
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
        trainer.close()
    assert result.hand_offs["pipe"] >= 1 and result.hand_offs["slot"] >= 5 and 0 in result.lags and 1 in result.lags
    assert per_update[-1] == per_update[0], per_update  # nothing compiled after the first update
