"""`train(config)`: the sequential executor driven by a host loop with evaluation, logging and checkpoints.

The host loop dispatches iteration k+1 before it reads iteration k's metrics, so reading metrics
never leaves the device idle. Evaluations follow brax's schedule: one before training, then one
every `config.iterations_per_eval` iterations.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Callable, Iterable, Mapping, Optional

import jax
import numpy as np

from jaxrose.callbacks import Callback, JsonlWriter, ProgressBar, TensorBoardWriter
from jaxrose.checkpoint import Checkpointer
from jaxrose.config import TrainConfig
from jaxrose.evaluation import make_evaluate
from jaxrose.plotting import plot_learning_curve
from jaxrose.sequential import RunState, SequentialExecutor


@dataclasses.dataclass
class TrainResult:
    state: RunState
    executor: SequentialExecutor
    evaluations: list[dict]
    iteration_seconds: list[float]
    compile_seconds: float
    out_dir: str

    @property
    def params(self):
        return self.state.learner.params

    @property
    def final_return(self) -> float:
        return self.evaluations[-1]["eval/episode_return"] if self.evaluations else float("nan")


def _scalars(metrics: Mapping) -> dict[str, float]:
    return {k: float(np.asarray(v)) for k, v in metrics.items()}


def train(config: TrainConfig, callbacks: Iterable[Callback] = (), executor: Optional[SequentialExecutor] = None,
          write_outputs: bool = True) -> TrainResult:
    """Trains with PPO on the sequential executor and returns the final state and metrics.

    Outputs (metrics.jsonl, TensorBoard events, checkpoints/, learning_curve.png) go to
    `config.run.out_dir` when `write_outputs` is true.
    """
    run = config.run
    executor = executor or SequentialExecutor(config)
    evaluate = make_evaluate(executor.env, executor.net, run.num_eval_envs, config.env.episode_length,
                             run.deterministic_eval)
    out_dir = os.path.abspath(run.out_dir)
    sinks: list[Callback] = list(callbacks)
    checkpointer = None
    if write_outputs:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(dataclasses.asdict(config), f, indent=2)
        checkpointer = Checkpointer(os.path.join(out_dir, "checkpoints"), keep=run.keep_checkpoints)
        sinks.append(JsonlWriter(os.path.join(out_dir, "metrics.jsonl")))
        if run.tensorboard:
            sinks.append(TensorBoardWriter(os.path.join(out_dir, "tensorboard")))

    state = executor.init(jax.random.PRNGKey(run.seed))
    if run.resume:
        resume_from = Checkpointer(os.path.join(os.path.abspath(run.resume), "checkpoints"), keep=run.keep_checkpoints)
        state = resume_from.restore(state, config)
    start_iteration = int(state.iteration)
    steps_per_iteration = executor.env_steps_per_iteration
    if run.progress_bar:
        sinks.append(ProgressBar(config.num_iterations * steps_per_iteration, start_iteration * steps_per_iteration))

    def emit(iteration: int, metrics: Mapping[str, float]) -> None:
        for sink in sinks:
            sink(iteration * steps_per_iteration, metrics)

    eval_key = jax.random.PRNGKey(run.seed + 1_000_003)
    evaluations: list[dict] = []

    def run_evaluation(iteration: int, state: RunState) -> dict:
        start = time.perf_counter()
        learner = state.learner
        metrics = _scalars(evaluate(learner.params, learner.normalizer, jax.random.fold_in(eval_key, iteration)))
        result = {f"eval/{k}": v for k, v in metrics.items()}
        result["eval/walltime"] = time.perf_counter() - start
        evaluations.append({"iteration": iteration, "env_steps": iteration * steps_per_iteration, **result})
        return result

    def save(iteration: int, state: RunState) -> None:
        if checkpointer is not None:
            checkpointer.save(iteration, state, config)

    compile_seconds = executor.compile(state)
    emit(start_iteration, {"perf/compile_seconds": compile_seconds})
    if start_iteration == 0 and run.num_evals > 1:
        emit(0, run_evaluation(0, state))

    iteration_seconds: list[float] = []
    pending = None  # (iteration number, metrics on device) of the iteration dispatched last
    last_time = time.perf_counter()
    try:
        for iteration in range(start_iteration + 1, config.num_iterations + 1):
            state, metrics = executor.step(state)
            if pending is not None:
                _report(pending, emit, iteration_seconds, steps_per_iteration, last_time)
                last_time = time.perf_counter()
            pending = (iteration, metrics)
            at_eval = iteration % config.iterations_per_eval == 0
            at_checkpoint = run.checkpoint_every and iteration % run.checkpoint_every == 0
            if at_eval or at_checkpoint or iteration == config.num_iterations:
                _report(pending, emit, iteration_seconds, steps_per_iteration, last_time)
                pending = None
                if at_eval:
                    emit(iteration, run_evaluation(iteration, state))
                if at_eval or at_checkpoint or iteration == config.num_iterations:
                    save(iteration, state)
                last_time = time.perf_counter()
    except KeyboardInterrupt:
        save(int(state.iteration), state)
        raise
    finally:
        for sink in sinks:
            if hasattr(sink, "close"):
                sink.close()
        if checkpointer is not None:
            checkpointer.close()

    if write_outputs:
        plot_learning_curve(os.path.join(out_dir, "metrics.jsonl"), os.path.join(out_dir, "learning_curve.png"),
                            title=f"{config.env.name}: PPO (jaxrose)")
    return TrainResult(state, executor, evaluations, iteration_seconds, compile_seconds, out_dir)


def _report(pending, emit: Callable, iteration_seconds: list, steps_per_iteration: int, since: float) -> None:
    iteration, metrics = pending
    metrics = _scalars(jax.device_get(metrics))
    seconds = time.perf_counter() - since
    iteration_seconds.append(seconds)
    metrics["perf/iteration_seconds"] = seconds
    metrics["perf/sps"] = steps_per_iteration / seconds
    emit(iteration, metrics)
