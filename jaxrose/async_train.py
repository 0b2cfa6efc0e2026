"""`train` in asynchronous mode: actors, learner, evaluation in its own process, logging.

The env-step budget and the evaluation schedule are the synchronous run's (an evaluation each time
the consumed env steps pass another `iterations_per_eval` iterations' worth), so the two modes
compare run for run. Checkpoints are not written in this mode yet (the env states live in the
actor processes); `run.resume` is refused.
"""

from __future__ import annotations

import os
import time

import jax
import numpy as np

from jaxrose.async_mode import AsyncTrainer
from jaxrose.callbacks import JsonlWriter, ProgressBar, TensorBoardWriter
from jaxrose.config import ConfigError, TrainConfig
from jaxrose.eval_worker import ProcessEvaluator
from jaxrose.mps import prepare_clients


def train_async(config: TrainConfig, callbacks=(), write_outputs: bool = True):
    from jaxrose.sequential import RunState
    from jaxrose.train import TrainResult

    run = config.run
    if run.resume:
        raise ConfigError("run.resume is not supported with run.mode='async' yet; resume in sync mode.")
    names = [f"actor{i}" for i in range(run.actors)]
    envs = prepare_clients({**{n: None for n in names}, "evaluator": run.eval_sm_percentage}, run.use_mps,
                           run.compile_cache)
    out_dir = os.path.abspath(run.out_dir)
    sinks = list(callbacks)
    if write_outputs:
        os.makedirs(out_dir, exist_ok=True)
        sinks.append(JsonlWriter(os.path.join(out_dir, "metrics.jsonl")))
        if run.tensorboard:
            sinks.append(TensorBoardWriter(os.path.join(out_dir, "tensorboard")))
    budget = config.num_iterations * config.env_steps_per_iteration
    if run.progress_bar:
        sinks.append(ProgressBar(budget))
    evaluator, trainer = ProcessEvaluator(config, envs["evaluator"]), None
    evaluations, update_seconds, update_starts = [], [], []
    eval_every = config.iterations_per_eval * config.env_steps_per_iteration

    def emit(steps, metrics):
        for sink in sinks:
            sink(steps, metrics)

    def record(results):
        for iteration, result in results:
            evaluations.append({"iteration": iteration, "env_steps": iteration * config.env_steps_per_iteration,
                                "done_time": time.perf_counter(), **result})
            emit(iteration * config.env_steps_per_iteration, result)

    try:
        evaluator.start()
        start = time.perf_counter()
        trainer = AsyncTrainer(config, run.actors, run.max_policy_lag, worker_env=envs[names[0]])
        startup_seconds = time.perf_counter() - start
        state0 = trainer.executor.init(jax.random.PRNGKey(run.seed))
        if run.num_evals > 1:
            evaluator.submit(0, state0.learner)
        last = {"time": time.perf_counter(), "next_eval": eval_every}

        def on_update(update, steps, learner, info):
            now = time.perf_counter()
            update_starts.append(last["time"])
            update_seconds.append(now - last["time"])
            last["time"] = now
            emit(steps, {"train/policy_lag_max": max(info["lags"]), "perf/queue_depth": info["queue_depth"],
                         "train/episode_return": info["episode_return"] if info["episodes"] else float("nan")})
            while steps >= last["next_eval"]:
                evaluator.submit(last["next_eval"] // config.env_steps_per_iteration, learner)
                last["next_eval"] += eval_every
            record(evaluator.finished())

        result = trainer.run(env_steps=budget, on_update=on_update)
        record(evaluator.drain())
        emit(result.env_steps, {"perf/rollout_sps": result.rollout_sps,
                                "perf/updates_per_second": result.updates_per_second,
                                "train/policy_lag_mean": float(np.mean(result.lags)),
                                "perf/queue_depth_mean": float(np.mean(result.queue_depths))})
    finally:
        if trainer is not None:
            trainer.close()
        evaluator.close()
        for sink in sinks:
            if hasattr(sink, "close"):
                sink.close()
    evaluations.sort(key=lambda e: e["iteration"])
    state = RunState(result.learner, None, None, result.updates)
    out = TrainResult(state, trainer.executor, evaluations, update_seconds, startup_seconds, out_dir,
                      sum(update_seconds), update_starts, evaluator.worker.info)
    out.async_result = result
    return out
