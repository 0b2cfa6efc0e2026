"""The inline evaluation compiles in a thread beside the iteration's compile, and only there."""

import logging

import jax
import pytest

from jaxrose.config import replace
from jaxrose.train import train


@pytest.fixture
def compile_log(caplog):
    """Every compilation JAX logs, in any thread (`jax.log_compiles` alone is this thread's)."""
    jax.config.update("jax_log_compiles", True)
    try:
        with caplog.at_level(logging.WARNING):
            yield caplog
    finally:
        jax.config.update("jax_log_compiles", False)


def test_the_evaluation_compiles_once_beside_the_iteration(tiny_config, tmp_path, compile_log):
    config = replace(tiny_config, **{"run.out_dir": str(tmp_path), "run.seed": 7})
    result = train(config)
    compiles = [(r.threadName, r.getMessage()) for r in compile_log.records if r.getMessage().startswith("Compiling")]
    evaluation = [thread for thread, message in compiles if message.startswith("Compiling jit(evaluate)")]
    assert evaluation == ["jaxrose-compile-evaluation"], [c[0] + ": " + c[1][:40] for c in compiles]
    assert any(message.startswith("Compiling jit(_iteration)") for _, message in compiles)
    assert len(result.evaluations) == config.run.num_evals  # every evaluation ran, the first at step 0
    assert result.evaluations[0]["env_steps"] == 0


def test_an_evaluation_process_gets_step_0_before_this_process_compiles(tiny_config, tmp_path, monkeypatch):
    """With evaluation in its own process, that process compiles its program while this one compiles the
    iteration: the parameters of step 0 are submitted first."""
    import sys

    from jaxrose.eval_worker import ProcessEvaluator
    from jaxrose.sequential import SequentialExecutor

    events = []
    submit, compile_ = ProcessEvaluator.submit, SequentialExecutor.compile

    def recorded_submit(self, iteration, learner):
        events.append(f"submit {iteration}")
        return submit(self, iteration, learner)

    def recorded_compile(self, state):
        events.append("compile")
        return compile_(self, state)

    monkeypatch.setattr(ProcessEvaluator, "submit", recorded_submit)
    monkeypatch.setattr(SequentialExecutor, "compile", recorded_compile)
    config = replace(tiny_config, **{"run.out_dir": str(tmp_path), "run.eval_mode": "process"})
    result = sys.modules["jaxrose.train"].train(config)
    assert events[:2] == ["submit 0", "compile"]
    assert [e["env_steps"] for e in result.evaluations][0] == 0 and len(result.evaluations) == config.run.num_evals
