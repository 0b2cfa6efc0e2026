"""The resource manager: its policy on hand-worked scenarios, and the mechanism on a real async run."""

import json
import multiprocessing
import os

import pytest

from jaxrose.config import ConfigError, ResourceConfig, replace
from jaxrose.resources import Allocation, Measurements, PolicyState, decide, initial_allocation

CONFIG = ResourceConfig(manager="on", sm_levels=(25, 50, 75, 100), patience=2, cooldown=2)
NAN = float("nan")


def _m(seconds, wait, depth):
    return Measurements(tuple(seconds), wait, depth, updates_per_second=10.0, lag_mean=0.5, lag_max=1)


def _run(measurements, allocation, config=CONFIG):
    """Feeds the policy one interval after another; returns the last allocation and every interval's decisions."""
    state, history = PolicyState(), []
    for m in measurements:
        allocation, state, decisions = decide(m, allocation, state, config)
        history.append(decisions)
    return allocation, history


def test_initial_allocation_fits_the_pool_and_deals_cores():
    allocation = initial_allocation(CONFIG, 2, [0, 1, 2, 3, 4])
    assert allocation.sm_quotas == (50, 50)  # 2 x 75 would exceed the 100% pool
    assert allocation.learner_cores == (0,) and allocation.actor_cores == ((1, 3), (2, 4))
    assert initial_allocation(CONFIG, 3, [0, 1]).actor_cores == ((1,), (1,), (1,))  # fewer cores than actors: shared


def test_a_slow_actor_starving_the_learner_gets_sms_and_a_core_after_the_patience():
    # actor1's rollouts take 4x actor0's and the learner waits 60% of the time for it.
    allocation = Allocation((50, 50), ((2,), (3,)), (0, 1))
    slow = _m([0.1, 0.4], wait=0.6, depth=0.2)
    new, history = _run([slow, slow], allocation)
    assert history[0] == []  # one interval is not enough (patience 2)
    changes = {(d["process"], d["kind"]): (d["before"], d["after"]) for d in history[1]}
    # Raising actor1 to 75% would overflow the 100% pool: actor0 (the fastest) gives a level first.
    assert changes == {("actor0", "sm_quota"): (50, 25), ("actor1", "sm_quota"): (50, 75),
                       ("actor1", "cores"): ([3], [1, 3])}
    assert new == Allocation((25, 75), ((2,), (1, 3)), (0,))
    assert all(d["measurements"]["learner_wait_fraction"] == 0.6 for d in history[1])
    assert "straggler" in history[1][1]["reason"]


def test_a_growing_queue_gives_sms_and_a_core_to_the_learner():
    allocation = Allocation((50, 50), ((2, 3), (4,)), (0,))
    backlog = _m([0.1, 0.2], wait=0.02, depth=1.5)  # the learner barely waits, 1.5 of 2 actors' batches queue
    new, history = _run([backlog, backlog], allocation)
    assert [(d["process"], d["kind"], d["after"]) for d in history[1]] == [
        ("actor0", "sm_quota", 25), ("learner", "cores", [0, 3])]
    assert new == Allocation((25, 50), ((2,), (4,)), (0, 3))


def test_no_flapping_alternating_signals_dead_band_and_cooldown():
    allocation = Allocation((50, 50), ((1,), (1,)), (0,))
    starving, backlog = _m([0.1, 0.4], 0.6, 0.0), _m([0.2, 0.1], 0.0, 2.0)
    # Signals that flip every interval never last the patience.
    _, history = _run([starving, backlog] * 5, allocation)
    assert all(d == [] for d in history)
    # Between half the starving threshold and the threshold neither signal holds, however deep the queue.
    _, history = _run([_m([0.1, 0.1], 0.2, 2.0)] * 6, allocation)
    assert all(d == [] for d in history)
    # A persistent signal acts once, then waits out the cooldown before acting again, even on the opposite signal.
    new, history = _run([starving] * 2 + [backlog] * 3, allocation)
    assert [len(d) for d in history] == [0, 2, 0, 0, 0]
    _, history = _run([starving] * 2 + [backlog] * 4, allocation)
    assert [len(d) for d in history][:5] == [0, 2, 0, 0, 0] and history[5] != []


def test_settings_are_validated():
    with pytest.raises(ConfigError, match="run.resources.sm_levels must be increasing"):
        ResourceConfig(sm_levels=(50, 25))
    with pytest.raises(ConfigError, match="run.resources.slow_ratio must be > 1"):
        ResourceConfig(slow_ratio=1.0)
    with pytest.raises(ConfigError, match="needs run.mode='async'"):
        from jaxrose.config import RunConfig

        RunConfig(resources=ResourceConfig(manager="on"))


def test_manager_on_a_real_run_restarts_the_slow_actor_and_pins_cores(tiny_config, tmp_path):
    from jaxrose.async_mode import AsyncTrainer
    from jaxrose.resources import ResourceManager, quota_env

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPU cores to pin the learner and the actors apart")
    resources = ResourceConfig(manager="on", interval=1.0, sm_levels=(40, 60), patience=1, cooldown=10)
    config = replace(tiny_config, **{"run.mode": "async", "run.actors": 2, "run.resources": resources})
    cores = sorted(os.sched_getaffinity(0))
    log = tmp_path / "resources.jsonl"
    manager = ResourceManager(resources, 2, quota_env(use_mps=True, compile_cache=None), str(log))
    trainer = AsyncTrainer(config, num_actors=2, max_lag=2, actor_delays={1: 0.5})
    pids = [a.process.pid for a in trainer.actors]
    seen = []

    def on_update(update, steps, learner, info):
        seen.append((os.sched_getaffinity(0), [os.sched_getaffinity(a.process.pid) for a in trainer.actors],
                     [a.process.pid for a in trainer.actors]))

    try:
        result = trainer.run(updates=12, on_update=on_update, manager=manager)
    finally:
        trainer.close()
        manager.close()
    assert result.updates == 12 and max(result.lags) <= 2
    assert os.sched_getaffinity(0) == set(cores)  # given back
    learner_cores, actor_cores, _ = seen[0]
    assert learner_cores == {cores[0]} and actor_cores == [set(cores[1:])] * 2
    decisions = result.resource_decisions
    raised = [d for d in decisions if d["kind"] == "sm_quota"]
    assert raised and raised[0]["process"] == "actor1" and (raised[0]["before"], raised[0]["after"]) == (40, 60)
    assert raised[0]["measurements"]["learner_wait_fraction"] >= resources.starve_fraction
    restart = next(d for d in decisions if d["kind"] == "restart")
    # No MPS on a CPU: the actor really restarts, and the log says the quota is not in effect.
    assert restart["process"] == "actor1" and restart["quota_in_effect"] is False
    assert "not in effect" in restart["reason"] and restart["pid"] != pids[1]
    after = [s for s in seen if s[2][1] == restart["pid"]]
    assert after and after[-1][1][1] == set(cores[1:])  # the new process is pinned too
    assert [json.loads(line) for line in log.read_text().splitlines()] == decisions
    assert not multiprocessing.active_children()
