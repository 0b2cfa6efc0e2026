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


def test_process_evaluation_uses_the_trainers_own_env(tiny_config, tmp_path):
    """An executor given its own env: the evaluation process evaluates that env, as inline evaluation does."""
    from fault_envs import DoubledReward

    def run(mode):
        config = replace(tiny_config, **{"run.out_dir": str(tmp_path / mode), "run.eval_mode": mode})
        return train(config, executor=SequentialExecutor(config, env=DoubledReward()))

    inline, remote = run("inline"), run("process")
    returns = lambda result: [e["eval/episode_return"] for e in result.evaluations]
    assert returns(remote) == returns(inline)
    registered = train(replace(tiny_config, **{"run.out_dir": str(tmp_path / "registered")}))
    assert returns(registered) != returns(inline)  # the doubled reward shows in every evaluation


def test_killed_evaluator_is_a_clear_error(tiny_config):
    executor = SequentialExecutor(tiny_config)
    state = executor.init(jax.random.PRNGKey(0))
    evaluator = ProcessEvaluator(tiny_config, timeout=60)
    evaluator.start()
    pid = evaluator.worker.process.pid
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"evaluator \(pid \d+\) died .* killed by SIGKILL"):
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

    from jaxrose.train import reset_compile_cache

    previous = jax.config.jax_compilation_cache_dir
    try:
        train(config)
    finally:  # back to the suite's cache (train moved this process to the run's)
        jax.config.update("jax_compilation_cache_dir", previous)
        reset_compile_cache()
    entries = list(cache.iterdir())
    assert entries, "the cache folder holds compiled programs"
    assert any("evaluate" in p.name for p in entries), [p.name for p in entries][:5]


_BACKEND_PROBE = """
import pickle, sys
from jax._src import xla_bridge
import jaxrose.train

train_module = sys.modules["jaxrose.train"]  # the package's `train` attribute is the function
seen = []
real = train_module.prepare_clients

def recording(*args, **kwargs):
    seen.append((xla_bridge.backends_are_initialized(), kwargs.get("priorities"), kwargs.get("own_priority")))
    return real(*args, **kwargs)

if __name__ == "__main__":  # the evaluator is spawned: it re-imports this file
    train_module.prepare_clients = recording
    with open(sys.argv[1], "rb") as f:
        train_module.train(pickle.load(f))
    print("BACKEND_STARTED_BEFORE_MPS", seen)
"""


def test_the_trainer_sets_up_its_workers_before_its_gpu_starts(tiny_config, tmp_path):
    """MPS can only take in a process whose GPU has not started; a trainer that touched its device
    first (e.g. through `jax.process_index()`) leaves the evaluator and its own quota without MPS,
    silently on a CPU. In a fresh process, `train` must reach `prepare_clients` with no backend up."""
    import pickle
    import subprocess
    import sys

    config = replace(tiny_config, **{"run.eval_mode": "process", "run.out_dir": str(tmp_path / "run"),
                                     "run.total_env_steps": 1024, "run.num_evals": 2,
                                     "run.eval_priority": "below-normal", "run.learner_priority": "below-normal"})
    (tmp_path / "config.pickle").write_bytes(pickle.dumps(config))
    (tmp_path / "probe.py").write_text(_BACKEND_PROBE)
    done = subprocess.run([sys.executable, str(tmp_path / "probe.py"), str(tmp_path / "config.pickle")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    # ... and hands it the MPS priorities asked for: the evaluator's, and its own.
    assert "BACKEND_STARTED_BEFORE_MPS [(False, {'evaluator': 'below-normal'}, 'below-normal')]" in done.stdout, \
        done.stdout[-2000:]
