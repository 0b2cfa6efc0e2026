"""Compiling other batch sizes ahead: the real call at a new size finds the program compiled in
the background (no compilation on the calling thread), in the learner and in an actor."""

import multiprocessing
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrose.config import ResourceConfig, replace
from jaxrose.precompile import Precompiler, abstract, resized_axis


class CompileLog:
    """Backend compilations, with the thread that ran each (JAX's monitoring events)."""

    def __init__(self):
        self.threads: list[str] = []
        jax.monitoring.register_event_duration_secs_listener(self._record)

    def _record(self, event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            self.threads.append(threading.current_thread().name)

    def on(self, thread: str) -> int:
        return sum(t == thread for t in self.threads)


@pytest.fixture(scope="module")
def compiles():
    return CompileLog()


def test_a_program_compiled_ahead_is_what_the_real_call_runs(compiles):
    @jax.jit
    def f(params, x):
        return jnp.tanh(x @ params["w"]).sum(axis=-1)

    params = jax.device_put({"w": jnp.ones((3, 3))}, jax.devices()[0])  # committed, like the learner's
    x = jnp.ones((4, 3))  # uncommitted, like a rollout's output
    expected = f(params, jnp.ones((8, 3)))  # the reference: compiled on first use
    f.clear_cache() if hasattr(f, "clear_cache") else jax.clear_caches()

    precompiler = Precompiler("test")
    args = (jax.tree.map(abstract, params), resized_axis(x, 0, lambda n: 2 * n))
    precompiler.submit("x of 8", lambda: f.lower(*args).compile())
    assert precompiler.wait(60) and [label for label, _ in precompiler.compiled] == ["x of 8"]
    main = compiles.on("MainThread")
    np.testing.assert_allclose(f(params, jnp.ones((8, 3))), expected)
    assert compiles.on("MainThread") == main  # found the background thread's program
    precompiler.close()


def test_a_failed_compile_ahead_only_warns():
    precompiler = Precompiler("test")

    def broken():
        raise RuntimeError("out of memory")

    with pytest.warns(RuntimeWarning, match="test: compiling broken ahead failed .*compiles on first use instead"):
        precompiler.submit("broken", broken)
        assert precompiler.wait(10)
        precompiler.close()
        precompiler._thread.join(10)
    assert precompiler.compiled == []


def test_idle_only_when_every_submitted_job_finished():
    """`wait(0)` is the actor's 'all compiled' report: never true while a job is still compiling or queued."""
    import threading

    precompiler = Precompiler("test")
    release = threading.Event()
    try:
        precompiler.submit("slow", release.wait)
        precompiler.submit("quick", lambda: None)
        assert not precompiler.wait(0.2)  # the first still compiling, the second queued
        release.set()
        assert precompiler.wait(10)
        assert [label for label, _ in precompiler.compiled] == ["slow", "quick"]
        precompiler.submit("again", lambda: None)
        assert precompiler.wait(10) and len(precompiler.compiled) == 3
    finally:
        release.set()
        precompiler.close()


def _managed(tiny_config):
    resources = ResourceConfig(manager="on", group_levels=(1, 2), grow_keeps="minibatch_size")
    return replace(tiny_config, **{"run.mode": "async", "run.actors": 2, "run.resources": resources})


def test_the_learner_compiles_the_other_batch_size_ahead(tiny_config, compiles):
    """After the first update on 1-group trajectories, an update on a 2-group trajectory (the next
    level) compiles nothing on the learner's thread."""
    from jaxrose.async_mode import AsyncTrainer

    trainer = AsyncTrainer(_managed(tiny_config), num_actors=2, max_lag=1)
    taken = []
    learn = trainer._learn
    trainer._learn = lambda learner, unrolls, *rest: (taken.append((learner, unrolls)), learn(learner, unrolls, *rest))[1]
    try:
        result = trainer.run(updates=3)
        assert trainer._precompiler.wait(120)
    finally:
        trainer.close()
    # The result holds what was compiled when the run returned; the update may have finished after.
    labels = ["batch preparation for 2 groups", "update on 2 groups"]
    assert [label for label, _ in result.precompiled["learner"]] == labels[:len(result.precompiled["learner"])]
    assert [label for label, _ in trainer._precompiler.compiled] == labels
    learner, unrolls = taken[0]
    assert unrolls["reward"].shape[2] == 1
    grown = {k: jnp.concatenate([v, v], axis=1 if k == "last_obs" else 2) for k, v in unrolls.items()}
    grown = jax.device_put(grown, jax.devices()[0])  # as a received trajectory is
    main = compiles.on(threading.current_thread().name)
    batch, _ = trainer._prepare(grown, learner)
    updated, _ = trainer._update(learner, batch)
    jax.block_until_ready(updated)
    assert compiles.on(threading.current_thread().name) == main
    assert not multiprocessing.active_children()


def test_an_actor_resized_to_the_next_level_compiles_nothing_on_its_thread(tiny_config, compiles):
    """The actor's loop, in a thread of this process: after its first rollout it compiles the other
    level's rollout and the resizes in the background and says so; a resize to 2 groups and the
    2-group rollout then compile nothing on the actor's thread."""
    from jaxrose.async_actor import run_actor
    from jaxrose.sequential import SequentialExecutor

    config = _managed(tiny_config)
    learner_end, actor_end = multiprocessing.Pipe()
    actor = threading.Thread(target=run_actor, args=(actor_end, config, 0, 2, 0.0), name="actor-under-test")
    actor.start()
    try:
        assert learner_end.recv()[0] == "ready"
        learner = SequentialExecutor(config).init(jax.random.PRNGKey(0)).learner
        learner_end.send(("params", 0, *jax.device_get((learner.params, learner.normalizer))))
        wanted = {"resize 2->1", "resize 1->2", "rollout of 2 groups"}
        reported, consumed = set(), 0
        while reported != wanted:  # roll out until the actor reports every program compiled ahead
            learner_end.send(("credit", 1, consumed))
            message = learner_end.recv()
            while message[0] != "trajectory":
                if message[0] == "precompiled":
                    reported = {label for label, _ in message[2]}
                message = learner_end.recv()
            assert message[4] == 1
            consumed += 1
            while learner_end.poll(0.2):
                message = learner_end.recv()
                if message[0] == "precompiled":
                    reported = {label for label, _ in message[2]}
            assert reported <= wanted
        before = compiles.on("actor-under-test")
        learner_end.send(("resize", 2, 7))
        learner_end.send(("credit", 1, consumed))
        message = learner_end.recv()
        while message[0] != "trajectory":
            message = learner_end.recv()
        assert message[4] == 2  # a 2-group trajectory
        assert compiles.on("actor-under-test") == before
    finally:
        learner_end.send(("stop",))
        actor.join(60)
    assert not actor.is_alive()


@pytest.mark.parametrize("levels", [(1, 2, 4), (1, 2, 4, 8), (2, 4)])
def test_an_actor_compiles_the_moves_open_from_its_size_first(levels):
    """The first programs compiled are a neighbouring level's rollout and the resize from the running
    size to it (a run started at the top level could otherwise not shrink until resizes into its own
    size were compiled, session 33); in all, every other level's rollout and every resize between
    neighbouring levels, each once."""
    from jaxrose.async_actor import precompile_order

    for current in levels:
        order = precompile_order(levels, current)
        i = levels.index(current)
        first = levels[i + 1] if i + 1 < len(levels) else levels[i - 1]  # growth when there is room
        assert order[:2] == [(None, first), (current, first)]
        wanted = {(None, g) for g in levels if g != current}
        wanted |= {(levels[a], levels[b]) for a in range(len(levels)) for b in range(len(levels)) if abs(a - b) == 1}
        assert sorted(order, key=str) == sorted(wanted, key=str)
        neighbours = [levels[j] for j in (i + 1, i - 1) if 0 <= j < len(levels)]  # both moves before the rest
        assert set(order[:2 * len(neighbours)]) == {(h, n) for n in neighbours for h in (None, current)}
