"""`train(config)`: the sequential executor driven by a host loop with evaluation, logging and checkpoints.

Evaluations follow brax's schedule: one before training, then one every
`config.iterations_per_eval` iterations; a checkpoint is written at each evaluation, every
`run.checkpoint_every` iterations, at the end, and on Ctrl-C.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Iterable, Mapping, Optional

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
    try:
        for iteration in range(start_iteration + 1, config.num_iterations + 1):
            # Each iteration is timed from dispatch to its metrics on the host. On a GPU the XLA while
            # loops inside an iteration already make dispatch wait for the device, so a deeper
            # dispatch queue would not overlap anything and would only blur per-iteration timing.
            start = time.perf_counter()
            state, metrics = executor.step(state)
            metrics = _scalars(jax.device_get(metrics))
            seconds = time.perf_counter() - start
            iteration_seconds.append(seconds)
            emit(iteration, {**metrics, "perf/iteration_seconds": seconds, "perf/sps": steps_per_iteration / seconds})
            at_eval = iteration % config.iterations_per_eval == 0
            if at_eval:
                emit(iteration, run_evaluation(iteration, state))
            if at_eval or iteration == config.num_iterations or (
                    run.checkpoint_every and iteration % run.checkpoint_every == 0):
                save(iteration, state)
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

