"""The resource manager: its policy on hand-worked scenarios, and the mechanism on a real async run."""

import dataclasses
import json
import multiprocessing
import os

import pytest

from jaxrose.config import ConfigError, ResourceConfig, replace
from jaxrose.resources import Allocation, Measurements, PolicyState, decide, initial_allocation

CONFIG = ResourceConfig(manager="on", sm_levels=(25, 50, 75, 100), patience=2, cooldown=2)
NAN = float("nan")


def _m(seconds, wait, depth, learned=8.0):
    """One interval; `learned`: env groups the learner learned per second."""
    return Measurements(tuple(seconds), wait, depth, updates_per_second=10.0, lag_mean=0.5, lag_max=1,
                        groups_per_second=learned)


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


def _thread_cores(pid):
    """The cores every thread of `pid` may run on (one set if they all agree)."""
    masks = set()
    for thread in os.listdir(f"/proc/{pid}/task"):
        try:
            masks.add(frozenset(os.sched_getaffinity(int(thread))))
        except ProcessLookupError:  # the thread ended since the listing
            pass
    return set(next(iter(masks))) if len(masks) == 1 else masks


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux's per-thread affinity and 2 CPU cores")
def test_pinning_a_process_pins_all_its_threads():
    import subprocess
    import sys

    from jaxrose.resources import pin_process

    child = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                              "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
                              "print('up', flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"  # its second thread is running
        core = min(os.sched_getaffinity(0))
        pin_process(child.pid, [core])
        threads = os.listdir(f"/proc/{child.pid}/task")
        assert len(threads) >= 2 and _thread_cores(child.pid) == {core}
    finally:
        child.kill()
        child.wait()


def test_manager_on_a_real_run_restarts_the_slow_actor_and_pins_cores(tiny_config, tmp_path):
    from jaxrose.async_mode import AsyncTrainer
    from jaxrose.resources import ResourceManager, quota_env

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPU cores to pin the learner and the actors apart")
    resources = ResourceConfig(manager="on", interval=1.0, sm_levels=(40, 60), patience=1, cooldown=10,
                               warm_restarts=False)
    config = replace(tiny_config, **{"run.mode": "async", "run.actors": 2, "run.resources": resources})
    cores = sorted(os.sched_getaffinity(0))
    log = tmp_path / "resources.jsonl"
    manager = ResourceManager(resources, 2, quota_env(use_mps=True, compile_cache=None), str(log))
    trainer = AsyncTrainer(config, num_actors=2, max_lag=2, actor_delays={1: 0.5})
    pids = [a.process.pid for a in trainer.actors]
    seen = []

    def on_update(update, steps, learner, info):  # every thread's cores, not only the main thread's
        seen.append((_thread_cores(os.getpid()), [_thread_cores(a.process.pid) for a in trainer.actors],
                     [a.process.pid for a in trainer.actors]))

    try:
        result = trainer.run(updates=12, on_update=on_update, manager=manager)
    finally:
        trainer.close()
        manager.close()
    assert result.updates == 12 and max(result.lags) <= 2
    assert _thread_cores(os.getpid()) == set(cores)  # given back, to every thread
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


# Per-actor batch sizes (env groups per actor), on hand-worked scenarios. Two actors at 2 groups,
# levels 1, 2, 4; a grown batch must raise its actor's throughput (groups per second) 1.2 times.
BATCH = ResourceConfig(manager="on", sm_levels=(25, 50, 75, 100), patience=2, cooldown=2,
                       group_levels=(1, 2, 4), grow_gain=1.2)
EVEN_STARVING = _m([0.20, 0.18], wait=0.6, depth=0.1)  # 0.20 < 1.5 x 0.18: no straggler, the actors are just few


def _groups(decisions):
    return [(d["process"], d["before"], d["after"]) for d in decisions if d["kind"] == "groups"]


def test_starving_without_a_straggler_grows_the_most_efficient_smallest_batch_and_keeps_it_if_it_pays():
    allocation = Allocation((50, 50), ((2,), (3,)), (0,), groups=(2, 2))
    # After actor1 grew the learner learns 11.2 groups/s against 8.0 before, 1.4x >= 1.2x: kept.
    paid = _m([0.20, 0.25], wait=0.6, depth=0.1, learned=11.2)
    state, history = PolicyState(), []
    for m in [EVEN_STARVING] * 4 + [paid, EVEN_STARVING]:  # grow, cooldown x2, verdict, grow
        allocation, state, decisions = decide(m, allocation, state, BATCH)
        history.append(decisions)
    # Patience 2: the second starving interval acts. Both at 2 groups; actor1 does a group in
    # 0.09 s, actor0 in 0.10 s, so actor1 grows. One lever at a time: no quota or core moves.
    assert history[0] == [] and _groups(history[1]) == [("actor1", 2, 4)] and len(history[1]) == 1
    assert "no actor lags" in history[1][0]["reason"]
    assert history[1][0]["measurements"]["learner_wait_fraction"] == 0.6
    assert history[2] == history[3] == []  # cooldown
    # The trial passes (no decision); the starving streak starts again, so nothing else yet either.
    assert history[4] == [] and history[5] != []
    # Then actor0, the smaller batch now, grows; actor1 is at the top level.
    assert _groups(history[5]) == [("actor0", 2, 4)]
    assert allocation.groups == (4, 4) and allocation.sm_quotas == (50, 50)


def test_a_batch_grows_only_to_a_size_whose_programs_are_compiled():
    """While actor1's 4-group programs still compile, the starving learner grows actor0 (its 4-group
    programs are ready) although actor1 is the more efficient; with none ready, no batch changes."""
    allocation = Allocation((50, 50), ((2,), (3,)), (0,), groups=(2, 2))
    only_actor0 = dataclasses.replace(EVEN_STARVING, compiled_levels=((1, 2, 4), (1, 2)))
    _, history = _run([only_actor0] * 2, allocation, BATCH)
    assert _groups(history[1]) == [("actor0", 2, 4)]
    none_ready = dataclasses.replace(EVEN_STARVING, compiled_levels=((2,), (2,)))
    _, history = _run([none_ready] * 2, allocation, BATCH)
    assert _groups(history[1]) == []


def test_a_growth_that_does_not_pay_is_undone_and_becomes_the_actors_ceiling():
    allocation = Allocation((50, 50), ((2,), (3,)), (0,), groups=(2, 2))
    # actor1 at 4 groups: the learner learns 8.8 groups/s against 8.0 before, 1.1x < 1.2x: the device had no room.
    no_gain = _m([0.20, 0.36], wait=0.6, depth=0.1, learned=8.8)
    unmeasured = _m([0.20, NAN], wait=0.6, depth=0.1, learned=8.8)
    state, history = PolicyState(), []
    # grow, cooldown x2, no verdict yet, undo, cooldown x2, patience, grow
    for m in [EVEN_STARVING] * 4 + [unmeasured, no_gain] + [EVEN_STARVING] * 4:
        allocation, state, decisions = decide(m, allocation, state, BATCH)
        history.append(decisions)
    assert _groups(history[1]) == [("actor1", 2, 4)]
    assert history[4] == []  # no rollout at the new size finished: the verdict waits
    assert _groups(history[5]) == [("actor1", 4, 2)] and history[5][0]["signal"] == "no_gain"
    assert "no room" in history[5][0]["reason"] and "8 env groups/s before" in history[5][0]["reason"]
    assert dict(state.ceilings) == {1: 2}
    assert history[6] == history[7] == history[8] == []  # cooldown, then the patience again
    # actor1 is capped at 2, so actor0 grows, although actor1 is the more efficient one.
    assert _groups(history[9]) == [("actor0", 2, 4)]
    assert allocation.groups == (4, 2)


def test_batch_sizes_stay_within_the_levels_and_leave_stragglers_to_the_quotas():
    # At the top level no batch can grow: the starving actors get SMs and cores, as without batch sizes.
    top = Allocation((50, 50), ((2,), (3,)), (0, 1), groups=(4, 4))
    new, history = _run([EVEN_STARVING] * 2, top, BATCH)
    assert _groups(history[1]) == [] and any(d["kind"] == "sm_quota" for d in history[1])
    assert new.groups == (4, 4)
    # A straggler starving the learner is the quotas' business even where its batch could grow.
    straggling = Allocation((50, 50), ((2,), (3,)), (0, 1), groups=(1, 1))
    new, history = _run([_m([0.1, 0.4], wait=0.6, depth=0.2)] * 2, straggling, BATCH)
    assert _groups(history[1]) == [] and new.sm_quotas == (25, 75) and new.groups == (1, 1)
    # Without group levels nothing about batches changes at all.
    new, history = _run([EVEN_STARVING] * 2, Allocation((50, 50), ((2,), (3,)), (0, 1), groups=(2, 2)), CONFIG)
    assert _groups(history[1]) == [] and new.groups == (2, 2)


def test_a_backlog_shrinks_the_largest_batch_down_to_the_lowest_level_then_moves_sms():
    allocation = Allocation((50, 50), ((2, 3), (4,)), (0,), groups=(2, 4))
    backlog = _m([0.1, 0.2], wait=0.02, depth=1.5)
    new, history = _run([backlog] * 2, allocation, BATCH)
    assert _groups(history[1]) == [("actor1", 4, 2)] and len(history[1]) == 1
    assert "shrinks" in history[1][0]["reason"]
    assert new == Allocation((50, 50), ((2, 3), (4,)), (0,), groups=(2, 2))
    # All at the lowest level: the fastest actor gives SMs and a core to the learner, as before.
    new, history = _run([backlog] * 2, dataclasses.replace(allocation, groups=(1, 1)), BATCH)
    assert _groups(history[1]) == [] and new.sm_quotas == (25, 50) and new.learner_cores == (0, 3)


def test_batch_settings_are_validated(tiny_config):
    from jaxrose.async_mode import AsyncTrainer

    with pytest.raises(ConfigError, match=r"run.resources.group_levels must be increasing env group counts"):
        ResourceConfig(group_levels=(2, 1))
    with pytest.raises(ConfigError, match="run.resources.grow_gain must be >= 1"):
        ResourceConfig(grow_gain=0.5)
    on = ResourceConfig(manager="on", group_levels=(2, 4))
    config = replace(tiny_config, **{"run.mode": "async", "run.resources": on})
    with pytest.raises(ConfigError, match=r"group_levels \(2, 4\) must include the actors' starting batch, "
                                          r"env.num_groups / actors = 1"):
        AsyncTrainer(config, num_actors=2, max_lag=1)
    # 32 groups of one env, 2 unrolls each: a 1-group batch is 2 segments, not 4 minibatches' worth
    # (minibatch count kept), nor one starting minibatch (16 groups / 4 = 8 segments, the size kept).
    levels = ResourceConfig(manager="on", group_levels=(1, 16), grow_keeps="minibatch_count")
    config = replace(config, **{"env.num_groups": 32, "run.resources": levels})
    with pytest.raises(ConfigError, match=r"A batch of 1 group\(s\) per actor \(run.resources.group_levels\) holds 2 "
                                          r"segments, not a multiple of ppo.num_minibatches \(4\)"):
        AsyncTrainer(config, num_actors=2, max_lag=1)
    config = replace(config, **{"run.resources.grow_keeps": "minibatch_size"})
    with pytest.raises(ConfigError, match=r"A batch of 1 group\(s\) per actor \(run.resources.group_levels\) holds 2 "
                                          r"segments, not a multiple of the starting minibatch \(8 segments"):
        AsyncTrainer(config, num_actors=2, max_lag=1)


def _random_batch(config, segments: int, seed: int = 0):
    import jax
    import jax.numpy as jnp
    import envs
    from jaxrose.ppo import Batch

    env = envs.make(config.env.name)
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    t, obs_size, act_size = config.ppo.unroll_length, env.observation_size, env.action_size
    return Batch(obs=jax.random.normal(keys[0], (segments, t, obs_size)),
                 raw_action=jax.random.normal(keys[1], (segments, t, act_size)),
                 log_prob=-jnp.ones((segments, t)), reward=jax.random.normal(keys[2], (segments, t)),
                 discount=jnp.ones((segments, t)), truncation=jnp.zeros((segments, t)),
                 last_obs=jax.random.normal(keys[3], (segments, obs_size)))


def test_a_grown_batch_keeps_the_minibatch_size_and_takes_more_sgd_steps(tiny_config):
    """With run.resources.grow_keeps='minibatch_size' the learner splits a batch twice the starting
    size into twice the minibatches of the starting size: the same update as a learner configured
    with twice ppo.num_minibatches; with 'minibatch_count' it is the update with the count kept."""
    import jax
    import numpy as np
    from jaxrose.async_mode import learner_config
    from jaxrose.sequential import SequentialExecutor

    resources = ResourceConfig(manager="on", group_levels=(1, 2), grow_keeps="minibatch_size")
    config = replace(tiny_config, **{"run.mode": "async", "run.actors": 2, "run.resources": resources})
    kept = learner_config(config, num_actors=2, max_lag=1)
    # One actor starts with 1 group of 16 envs x 2 unrolls = 32 segments; 4 minibatches of 8.
    assert kept.ppo.minibatch_segments == 8 and config.ppo.minibatch_segments is None
    counted = replace(config, **{"run.resources.grow_keeps": "minibatch_count"})
    assert learner_config(counted, 2, 1) == counted

    from jaxrose.ppo_program import make_learner

    # One network and one starting state for every config: they differ only in how the batch is minibatched.
    base = SequentialExecutor(config)
    start = jax.device_get(base.init(jax.random.PRNGKey(1)).learner)

    def update(cfg, segments):
        learner = make_learner(base.net, base.observation_size, cfg.ppo, cfg.run.learner_unroll)
        return jax.device_get(learner.update(start, _random_batch(cfg, segments))[0].params)

    def same(a, b):
        return all(np.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

    grown = update(kept, 64)
    assert same(grown, update(replace(config, **{"ppo.num_minibatches": 8}), 64))
    assert not same(grown, update(config, 64))  # the count kept: 4 minibatches of 16, half the SGD steps
    assert same(update(kept, 32), update(config, 32))  # at the starting size nothing changes


def test_manager_grows_an_actors_batch_in_a_real_run_and_its_trajectories_follow(tiny_config, tmp_path):
    from jaxrose.async_mode import AsyncTrainer
    from jaxrose.resources import ResourceManager, quota_env

    # Both actors equally slow (0.3 s a rollout): the learner starves with no straggler, so batches
    # grow from 1 group (16 envs) to 2. One SM level: no quota can move.
    resources = ResourceConfig(manager="on", interval=1.0, sm_levels=(50,), patience=1, cooldown=1,
                               group_levels=(1, 2), grow_keeps="minibatch_size")  # whole trajectories per update
    config = replace(tiny_config, **{"run.mode": "async", "run.actors": 2, "run.resources": resources})
    log = tmp_path / "resources.jsonl"
    manager = ResourceManager(resources, 2, quota_env(use_mps=True, compile_cache=None), str(log))
    trainer = AsyncTrainer(config, num_actors=2, max_lag=1, actor_delays={0: 0.3, 1: 0.3})
    seen = []
    try:
        result = trainer.run(updates=30, manager=manager,
                             on_update=lambda u, s, learner, info: seen.append(info["groups_per_actor"]))
    finally:
        trainer.close()
        manager.close()
    decisions = result.resource_decisions
    grown = [d for d in decisions if d["kind"] == "groups"]
    assert grown and (grown[0]["before"], grown[0]["after"]) == (1, 2), decisions
    assert grown[0]["measurements"]["learner_wait_fraction"] >= resources.starve_fraction
    # Decided on an interval begun after every process compiled its other sizes ahead, which they all did.
    from jaxrose.async_actor import precompile_order
    assert grown[0]["measurements"]["settled"] is True and not trainer.compiling_ahead()
    assert all(len(result.precompiled[f"actor{i}"]) == len(precompile_order((1, 2), 1)) for i in range(2))
    actor = int(grown[0]["process"][5:])
    resize = next(d for d in decisions if d["kind"] == "resize" and d["process"] == f"actor{actor}")
    assert (resize["before"], resize["after"]) == (1, 2)
    # The actor's trajectories, read from their arrays: 1 group until the change, then they follow
    # every resize sent (the manager may undo a growth that did not pay), in order, and only those.
    sizes = [g for i, g in result.trajectory_groups if i == actor]
    assert sizes[0] == 1 and 2 in sizes, sizes
    resizes = [(d["before"], d["after"]) for d in decisions if d["kind"] == "resize" and d["process"] == f"actor{actor}"]
    changes = [(a, b) for a, b in zip(sizes, sizes[1:]) if a != b]
    assert changes == resizes[:len(changes)] and len(resizes) - len(changes) <= 1, (sizes, resizes)
    assert result.groups_per_actor[actor] == resizes[-1][1] and seen[-1][actor] == resizes[-1][1]
    # The lag bound holds across the change, and env steps count the groups each trajectory had.
    assert max(result.lags) <= 1
    steps_per_group = config.env_steps_per_iteration // config.env.num_groups
    assert result.env_steps == steps_per_group * sum(g for _, g in result.trajectory_groups)
    # Every learner batch is whole groups (32 segments each), at most every outstanding rollout at the
    # largest level: (1 + run-ahead) rollouts of 2 actors of 2 groups.
    assert all(s % 32 == 0 and s <= 32 * (1 + trainer.run_ahead) * 2 * 2 for s in result.learner_batch_segments)
    assert [json.loads(line) for line in log.read_text().splitlines()] == decisions
    assert not multiprocessing.active_children()


def test_update_size_splits_a_trajectory_into_consecutive_updates_of_the_starting_batch(tiny_config):
    """grow_keeps='update_size': a 2-group piece list is the trajectory's groups in order; the lag
    bound must cover the last piece's data; in a real run every update learns one group (the
    starting batch), a grown actor's trajectory yields 2 updates, and the bound holds."""
    import jax
    import numpy as np
    from jaxrose.async_mode import AsyncTrainer, _pieces
    from jaxrose.resources import ResourceManager, quota_env

    unrolls = {"reward": np.arange(2 * 3 * 4 * 2).reshape(2, 3, 4, 2), "last_obs": np.arange(2 * 4 * 2 * 5).reshape(2, 4, 2, 5)}
    pieces = _pieces(unrolls, 2)
    assert [p["reward"].shape[2] for p in pieces] == [2, 2] and _pieces(unrolls, None) == [unrolls]
    for k, axis in (("reward", 2), ("last_obs", 1)):
        np.testing.assert_array_equal(np.concatenate([p[k] for p in pieces], axis=axis), unrolls[k])

    resources = ResourceConfig(manager="on", interval=1.0, sm_levels=(50,), patience=1, cooldown=1,
                               group_levels=(1, 2), grow_keeps="update_size")
    config = replace(tiny_config, **{"run.mode": "async", "run.actors": 2, "run.resources": resources})
    with pytest.raises(ConfigError, match=r"learns a 2-group trajectory as 2 updates; with 2 actor\(s\) the last one's "
                                          r"data is up to \(run.actor_run_ahead \+ 1\) x actors x 2 - 1 = 7 updates old: "
                                          r"set run.max_policy_lag"):
        AsyncTrainer(config, num_actors=2, max_lag=6)
    manager = ResourceManager(resources, 2, quota_env(use_mps=True, compile_cache=None), None)
    trainer = AsyncTrainer(config, num_actors=2, max_lag=7, actor_delays={0: 0.3, 1: 0.3})
    seen = []
    try:
        result = trainer.run(updates=60, manager=manager, on_update=lambda u, s, learner, info: seen.append((u, s)))
    finally:
        trainer.close()
        manager.close()
    grown = [g for _, g in result.trajectory_groups if g == 2]
    assert grown, result.resource_decisions
    assert result.learner_batch_segments == [32]  # every update on one group (16 envs x 2 unrolls)
    assert max(result.lags) <= 7  # the bound holds; a piece that would pass it is dropped, and recorded
    assert all(d["lag"] > 7 for d in result.lag_dropped)
    # Each update is reported, in order, with the env steps consumed up to it: one group's per update.
    steps_per_group = config.env_steps_per_iteration // config.env.num_groups
    assert [u for u, _ in seen] == list(range(1, len(seen) + 1))
    dropped = [d["update"] for d in result.lag_dropped]  # a dropped piece's steps count with the next update
    assert all(s == steps_per_group * (u + sum(d <= u for d in dropped)) for u, s in seen), (seen, dropped)
    assert result.updates == len(seen)
    assert result.env_steps == steps_per_group * sum(g for _, g in result.trajectory_groups)  # dropped pieces too
    assert not multiprocessing.active_children()


def test_actors_start_at_the_stated_batch_and_updates_keep_the_starting_size(tiny_config):
    """run.resources.start_groups: every actor's first rollout steps that many groups (no growth
    first), each trajectory is learned as updates of the starting batch (one group), and a start
    outside the levels, or without the manager, is refused before any process starts."""
    from jaxrose.async_mode import AsyncTrainer

    resources = ResourceConfig(manager="on", interval=30.0, sm_levels=(50,), group_levels=(1, 2),
                               grow_keeps="update_size", start_groups=2)
    config = replace(tiny_config, **{"run.mode": "async", "run.actors": 2, "run.resources": resources})
    for bad, match in ((replace(config, **{"run.resources.start_groups": 4}), r"start_groups=4 must be one of run."
                        r"resources.group_levels \(1, 2\)"),
                       (replace(config, **{"run.resources.manager": "off"}), r"start_groups=2 must be one of")):
        with pytest.raises(ConfigError, match=match):
            AsyncTrainer(bad, num_actors=2, max_lag=7)
    with pytest.raises(ConfigError, match=r"run.resources.start_groups must be >= 0"):
        ResourceConfig(start_groups=-1)
    trainer = AsyncTrainer(config, num_actors=2, max_lag=7)
    try:
        assert trainer.groups == [2, 2]
        result = trainer.run(updates=8)
    finally:
        trainer.close()
    assert result.trajectory_groups and all(g == 2 for _, g in result.trajectory_groups), result.trajectory_groups
    assert {i for i, _ in result.trajectory_groups} == {0, 1}
    assert result.learner_batch_segments == [32]  # one group (16 envs x 2 unrolls) per update, as from 1 group
    assert result.updates == 8 and max(result.lags) <= 7
    # Each learner step learned its 2-group trajectories as 2 updates each: the step's update counts say so.
    steps = result.learner_step_updates
    assert len(steps) == len(result.learner_busy_seconds) and steps[-1] == result.updates
    assert all(b - a > 0 and (b - a) % 2 == 0 for a, b in zip([0] + steps[:-1], steps)), steps
    steps_per_group = config.env_steps_per_iteration // config.env.num_groups
    assert result.env_steps == steps_per_group * 2 * len(result.trajectory_groups)
    assert not multiprocessing.active_children()


def test_a_warm_restart_holds_the_learner_for_the_switch_alone(tiny_config):
    """run.resources.warm_restarts: the slow actor's new process starts and compiles its rollout while
    the old one keeps rolling out, so the learner waits only for the switch; a cold restart holds it
    for the new process's start-up. Both end with the new process rolling out and the lag bound held."""
    from jaxrose.async_mode import AsyncTrainer
    from jaxrose.resources import ResourceManager, quota_env

    held, results = {}, {}
    for warm in (False, True):
        resources = ResourceConfig(manager="on", interval=1.0, sm_levels=(40, 60), patience=1, cooldown=100,
                                   warm_restarts=warm)
        config = replace(tiny_config, **{"run.mode": "async", "run.actors": 2, "run.resources": resources})
        manager = ResourceManager(resources, 2, quota_env(use_mps=True, compile_cache=None), None)
        trainer = AsyncTrainer(config, num_actors=2, max_lag=2, actor_delays={1: 0.3})
        old_pid, after = trainer.actors[1].process.pid, []

        def should_stop():  # a few updates with the new process, then stop
            if any(d["kind"] == "restart" for d in manager.decisions):
                after.append(trainer.actors[1].process.pid)
            return len(after) > 6

        try:
            results[warm] = trainer.run(updates=400, manager=manager, should_stop=should_stop)
        finally:
            trainer.close()
            manager.close()
        restart = next(d for d in results[warm].resource_decisions if d["kind"] == "restart")
        assert restart["process"] == "actor1" and restart["pid"] not in (None, old_pid), restart
        assert set(after) == {restart["pid"]}  # the new process is the actor from then on
        assert max(results[warm].lags) <= 2
        held[warm] = restart["restart_seconds"]
        if warm:  # the start-up happened beside the old process, which went on rolling out
            assert restart["standby_seconds"] > 2 * restart["restart_seconds"], restart
            assert "warm: started and compiled beside the old process" in restart["reason"]
        else:
            assert restart["standby_seconds"] is None
    assert held[True] < 0.5 * held[False], held
    assert not multiprocessing.active_children()


# run.resources.lag_target: with grow_keeps='update_size' a bigger batch is older data.
STALE = dataclasses.replace(BATCH, lag_target=3.0)


def test_predicted_lag_is_the_mean_of_the_pieces_lags_for_one_actor():
    """One actor one rollout ahead: a g-group trajectory learned as g/u updates (u groups each) was
    collected while the learner took the previous trajectory's g/u updates, so its pieces lag g/u ...
    2g/u - 1. The prediction from one size's mean to another's matches that mean, counted by hand."""
    from jaxrose.resources import predicted_lag

    def mean_lag(groups, per_update):
        pieces = groups // per_update
        lags = [pieces + k for k in range(pieces)]
        return sum(lags) / len(lags)

    for u, sizes in ((1, (1, 2, 4, 8)), (2, (2, 4, 8))):
        for g in sizes:
            for size in sizes:
                assert predicted_lag(mean_lag(g, u), g, size) == pytest.approx(mean_lag(size, u))
    assert mean_lag(1, 1) == 1 and mean_lag(2, 1) == 2.5 and mean_lag(4, 1) == 5.5  # ant's, session 32
    # A trajectory learned as one update whatever its size: the lag does not follow the batch, so a
    # target there would shrink batches for nothing; it is refused, naming the fix.
    with pytest.raises(ConfigError, match=r"lag_target .* only grow_keeps='update_size' does .* set "
                                          r"run.resources.grow_keeps update_size or drop run.resources.lag_target"):
        dataclasses.replace(STALE, grow_keeps="minibatch_size")


def test_a_growth_whose_predicted_lag_passes_the_target_is_not_made():
    """One actor at 2 groups, mean lag 2.5, the learner starving: 4 groups would lag 5.5. Without a
    target (or with 6) the batch grows; with 3 it does not, and the quota is the lever instead."""
    allocation = Allocation((50,), ((2,),), (0,), groups=(2,))
    starving = dataclasses.replace(_m([0.2], wait=0.6, depth=0.0), lag_mean=2.5, lag_max=3)
    for config, grows in ((BATCH, True), (dataclasses.replace(BATCH, lag_target=6.0), True), (STALE, False)):
        new, history = _run([starving] * 2, allocation, config)
        assert history[0] == []
        if grows:
            assert _groups(history[1]) == [("actor0", 2, 4)] and new.sm_quotas == (50,)
        else:
            assert _groups(history[1]) == [] and new.groups == (2,)
            assert [(d["kind"], d["before"], d["after"]) for d in history[1]] == [("sm_quota", 50, 75)]


def test_a_lag_above_the_target_shrinks_the_largest_batch_and_it_does_not_grow_back():
    """Started at 4 groups, mean lag 5.5 > 3 with the learner starving: the stale signal comes first
    and shrinks the batch to 2 (after the patience); at 2 groups the lag, 2.5, meets the target and
    the starving learner gets SMs instead of the batch growing back. At the lowest level a lag above
    the target is no batch signal: the actor count sets it."""
    allocation = Allocation((50,), ((2,),), (0,), groups=(4,))
    at_four = dataclasses.replace(_m([0.4], wait=0.6, depth=0.0), lag_mean=5.5, lag_max=7)
    at_two = dataclasses.replace(_m([0.25], wait=0.6, depth=0.0), lag_mean=2.5, lag_max=3)
    state, history = PolicyState(), []
    for m in [at_four] * 2 + [at_two] * 4:  # patience, shrink, cooldown x2, patience, quota
        allocation, state, decisions = decide(m, allocation, state, STALE)
        history.append(decisions)
    assert history[0] == [] and _groups(history[1]) == [("actor0", 4, 2)] and len(history[1]) == 1
    assert history[1][0]["signal"] == "stale" and "run.resources.lag_target=3" in history[1][0]["reason"]
    assert history[1][0]["measurements"]["lag_mean"] == 5.5
    assert history[2] == history[3] == history[4] == []
    assert [(d["kind"], d["after"]) for d in history[5]] == [("sm_quota", 75)]
    assert allocation.groups == (2,)
    lowest = dataclasses.replace(_m([0.2], wait=0.6, depth=0.0), lag_mean=1.0, lag_max=1)
    new, history = _run([lowest] * 2, Allocation((50,), ((2,),), (0,), groups=(1,)),
                        dataclasses.replace(BATCH, lag_target=0.5))
    assert history[1] and history[1][0]["signal"] == "starving" and new.groups == (1,)
    with pytest.raises(ConfigError, match=r"run.resources.lag_target must be >= 0 updates"):
        ResourceConfig(lag_target=-1.0)


def test_lag_target_shrinks_a_stale_actor_in_a_real_run(tiny_config):
    """A real run: one actor started at 4 groups (2 per update, so its trajectories lag 2 and 3) with
    a target of 1.5: the manager shrinks it to 2 groups on the measured lag, the actor's trajectories
    follow, it never grows back, and the updates after the change lag at most 1."""
    from jaxrose.async_mode import AsyncTrainer
    from jaxrose.resources import ResourceManager, quota_env

    resources = ResourceConfig(manager="on", interval=1.0, sm_levels=(50,), patience=1, cooldown=1,
                               group_levels=(2, 4), grow_keeps="update_size", start_groups=4, lag_target=1.5)
    config = replace(tiny_config, **{"run.mode": "async", "run.actors": 1, "run.resources": resources})
    manager = ResourceManager(resources, 1, quota_env(use_mps=True, compile_cache=None), None)
    trainer = AsyncTrainer(config, num_actors=1, max_lag=3, actor_delays={0: 0.2})
    lags = []
    try:
        result = trainer.run(updates=40, manager=manager, on_update=lambda u, s, learner, info: lags.append(info["lags"]))
    finally:
        trainer.close()
        manager.close()
    changes = [d for d in result.resource_decisions if d["kind"] == "groups"]
    assert changes and (changes[0]["before"], changes[0]["after"]) == (4, 2), result.resource_decisions
    assert changes[0]["signal"] == "stale" and changes[0]["measurements"]["lag_mean"] > 1.5
    assert all(d["after"] < d["before"] for d in changes)  # never grown back
    sizes = [g for _, g in result.trajectory_groups]
    first_small = sizes.index(2)
    assert set(sizes[:first_small]) == {4} and set(sizes[first_small:]) == {2}, sizes
    assert result.learner_batch_segments == [2 * 32]  # every update on the starting 2 groups (16 envs x 2 unrolls each)
    assert max(max(step) for step in lags[-10:]) <= 1, lags
    # Every update is on the starting 2 groups, so the learner compiles no other size ahead, and the
    # shrink waited for the actor's programs alone (it waited for learner programs never used before).
    assert "learner" not in result.precompiled and result.precompiled["actor0"], result.precompiled
    assert not multiprocessing.active_children()


def test_intervals_begun_while_compiling_ahead_count_only_as_a_stale_lag():
    """Session 36's transient (H100, seed 2): while the actor compiled its other sizes ahead it idled,
    so the learner 'starved' (87% waiting at mean lag 0.5) and the batch grew 2 -> 4 where the
    steady lag, 2.5, predicts 5.5 against a target of 3. Unsettled intervals: no starving or backlog
    signal, no patience, no cooldown spent; the first settled ones measure the steady lag and the quota moves
    instead. The same intervals settled (the old behaviour) grow the batch, which the target exists
    to prevent."""
    allocation = Allocation((50,), ((2,),), (0,), groups=(2,))
    transient = dataclasses.replace(_m([0.38], wait=0.87, depth=0.0, learned=0.78), lag_mean=0.5, lag_max=1,
                                    settled=False)
    steady = dataclasses.replace(_m([0.48], wait=0.35, depth=0.0, learned=4.2), lag_mean=2.5, lag_max=3)
    new, history = _run([transient] * 5 + [steady] * 2, allocation, STALE)
    assert history[:6] == [[]] * 6 and new.groups == (2,)
    assert [(d["kind"], d["before"], d["after"]) for d in history[6]] == [("sm_quota", 50, 75)]
    assert history[6][0]["measurements"]["settled"] is True
    grown, history = _run([dataclasses.replace(transient, settled=True)] * 2, allocation, STALE)
    assert _groups(history[1]) == [("actor0", 2, 4)] and grown.groups == (4,)
    # A trial under way waits out an unsettled interval (a restart's compile-ahead) and its cooldown too.
    state = PolicyState(cooldown=1, trial=(0, 2, 4.2))
    four = Allocation((50,), ((2,),), (0,), groups=(4,))
    after, state, decisions = decide(dataclasses.replace(transient, groups_per_second=0.5), four, state, STALE)
    assert decisions == [] and state.cooldown == 1 and state.trial == (0, 2, 4.2) and after.groups == (4,)
    # A lag above the target in the transient is above it in the steady run too (the idle actor's data
    # is fresher): started at 4 groups, lag 5.5 > 3, the batch shrinks after the patience, unsettled.
    stale = dataclasses.replace(transient, lag_mean=5.5, lag_max=7)
    new, history = _run([stale] * 2, four, STALE)
    assert history[0] == [] and _groups(history[1]) == [("actor0", 4, 2)] and history[1][0]["signal"] == "stale"


def test_a_growth_is_judged_by_the_groups_the_learner_learns_not_the_actors_rollout_rate():
    """Session 36's verdict: the reference rollout (2 groups in 0.381 s = 5.25 groups/s) ran beside a
    starving, idle learner; at 4 groups beside a busy learner the rollout took 0.787 s (5.09 groups/s),
    'no gain' by the actor's clock. The learner learned 4.2 groups/s before (2 groups per steady
    0.48 s step) and 5.1 after: 1.21x, kept at grow_gain 1.2; at 4.9 (1.17x) undone."""
    allocation = Allocation((50,), ((2,),), (0,), groups=(2,))
    starving = _m([0.381], wait=0.6, depth=0.0, learned=4.2)
    for learned, kept in ((5.1, True), (4.9, False)):
        after = _m([0.787], wait=0.16, depth=0.0, learned=learned)
        new, history = _run([starving] * 2 + [after] * 3, allocation, BATCH)  # grow, cooldown x2, verdict
        assert _groups(history[1]) == [("actor0", 2, 4)]
        assert _groups(history[4]) == ([] if kept else [("actor0", 4, 2)])
        assert new.groups == ((4,) if kept else (2,))
