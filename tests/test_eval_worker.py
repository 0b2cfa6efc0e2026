"""Evaluation in a separate (real, spawned) process: same results as inline, clear errors, clean exit."""

import multiprocessing
import os
import signal
import time

import jax
import numpy as np
import pytest

from jaxrose import train
from jaxrose.config import replace
from jaxrose.eval_worker import ProcessEvaluator
from jaxrose.sequential import SequentialExecutor
from jaxrose.workers import WorkerError


def test_process_evaluation_equals_inline(tiny_config, tmp_path):
    inline = train(replace(tiny_config, **{"run.out_dir": str(tmp_path / "inline")}))
    remote = train(replace(tiny_config, **{"run.out_dir": str(tmp_path / "remote"), "run.eval_mode": "process"}))
    assert [e["iteration"] for e in remote.evaluations] == [e["iteration"] for e in inline.evaluations] == [0, 2, 4]
    for a, b in zip(inline.evaluations, remote.evaluations):
        assert a["eval/episode_return"] == b["eval/episode_return"]
    for x, y in zip(jax.tree.leaves(inline.state.learner), jax.tree.leaves(remote.state.learner)):
        np.testing.assert_array_equal(x, y)
    assert not multiprocessing.active_children()


def test_killed_evaluator_is_a_clear_error(tiny_config):
    executor = SequentialExecutor(tiny_config)
    state = executor.init(jax.random.PRNGKey(0))
    evaluator = ProcessEvaluator(tiny_config, timeout=60)
    evaluator.start()
    pid = evaluator.worker.process.pid
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"evaluator \(pid \d+\) died .* exit code -9"):
        evaluator.submit(0, state.learner)
        evaluator.drain()
    assert time.monotonic() - start < 10
    evaluator.close()
    assert not evaluator.worker.process.is_alive()


def test_hung_evaluator_times_out(tiny_config):
    executor = SequentialExecutor(tiny_config)
    state = executor.init(jax.random.PRNGKey(0))
    evaluator = ProcessEvaluator(tiny_config, timeout=60)
    evaluator.start()
    os.kill(evaluator.worker.process.pid, signal.SIGSTOP)  # a fault injected: the worker stops answering
    evaluator.timeout = 2.0
    try:
        with pytest.raises(WorkerError, match="did not answer within 2 s"):
            evaluator.submit(0, state.learner)
            evaluator.drain()
    finally:
        os.kill(evaluator.worker.process.pid, signal.SIGCONT)
        evaluator.close()
    assert not evaluator.worker.process.is_alive()


def test_workers_share_the_persistent_compile_cache(tiny_config, tmp_path):
    """With run.compile_cache, the evaluation worker compiles into the shared folder: a restarted
    worker (e.g. for a new MPS quota) then finds its programs there."""
    cache = tmp_path / "xla-cache"
    config = replace(tiny_config, **{"run.out_dir": str(tmp_path / "run"), "run.eval_mode": "process",
                                     "run.compile_cache": str(cache)})
    import jax

    previous = jax.config.jax_compilation_cache_dir
    try:
        train(config)
    finally:
        jax.config.update("jax_compilation_cache_dir", previous)
    entries = list(cache.iterdir())
    assert entries, "the cache folder holds compiled programs"
    assert any("evaluate" in p.name for p in entries), [p.name for p in entries][:5]
