"""`train` in asynchronous mode: actors, learner, evaluation in its own process, logging.

The env-step budget and the evaluation schedule are the synchronous run's (an evaluation each time
the consumed env steps pass another `iterations_per_eval` iterations' worth), so the two modes
compare run for run. Checkpoints are snapshots (`AsyncTrainer`: no barrier, the actors report
between rollouts) taken on the evaluation schedule, every `run.checkpoint_every` iterations' worth
of env steps, and at the end, written in a background thread; `run.resume` continues from the
newest; each notes the evaluations given its learner, so a run resumed after a kill redoes one it
lost. With `run.resources.manager='on'`, `jaxrose.resources` rebalances SM quotas, cores and (with
`run.resources.group_levels`) the actors' batch sizes; `resources/actor<i>_groups` in the
metrics is each actor's batch after every update. `run.on_nonfinite` is honoured as in the
synchronous loop (see `jaxrose.async_mode`): a stop names the newest checkpoint, which never holds
the bad state.
"""

from __future__ import annotations

import os
import sys
import time
import warnings

import jax
import numpy as np

from jaxrose import async_checkpoint
from jaxrose.async_mode import AsyncTrainer
from jaxrose.checkpoint import Checkpointer
from jaxrose.callbacks import JsonlWriter, ProgressBar, TensorBoardWriter
from jaxrose.config import TrainConfig
from jaxrose.eval_worker import ProcessEvaluator
from jaxrose.mps import prepare_clients
from jaxrose.nonfinite import NonFinitePolicy
from jaxrose.resources import ResourceManager, initial_allocation, quota_env
from jaxrose.run_folder import drop_metrics_after, resumes_in_place, set_aside_earlier_run, unlogged_evaluations


def train_async(config: TrainConfig, callbacks=(), write_outputs: bool = True, env=None):
    """`env`: the env the actors step (e.g. a fault injector); None builds the config's."""
    from jaxrose.sequential import RunState
    from jaxrose.train import StopSignals, TerminatedError, TrainResult

    run = config.run
    names = [f"actor{i}" for i in range(run.actors)]
    managed = run.resources.manager == "on"
    quotas = initial_allocation(run.resources, run.actors, [0]).sm_quotas if managed else [None] * run.actors
    envs = prepare_clients({**dict(zip(names, quotas)), "evaluator": run.eval_sm_percentage}, run.use_mps,
                           run.compile_cache, own_quota=run.learner_sm_percentage,
                           priorities={"evaluator": run.eval_priority}, own_priority=run.learner_priority)
    out_dir = os.path.abspath(run.out_dir)
    sinks = list(callbacks)
    saver, manager = None, None
    if write_outputs:
        os.makedirs(out_dir, exist_ok=True)
        set_aside_earlier_run(out_dir, run.resume)  # a fresh run's files never mix with an earlier run's
        saver = async_checkpoint.BackgroundSaver(
            Checkpointer(os.path.join(out_dir, "checkpoints"), keep=run.keep_checkpoints), config)
        sinks.append(JsonlWriter(os.path.join(out_dir, "metrics.jsonl")))
        if run.tensorboard:
            sinks.append(TensorBoardWriter(os.path.join(out_dir, "tensorboard")))
    budget = config.num_iterations * config.env_steps_per_iteration
    if run.progress_bar:
        sinks.append(ProgressBar(budget))
    evaluator, trainer = ProcessEvaluator(config, envs["evaluator"], task=env), None
    evaluations, update_seconds, update_starts, update_env_steps = [], [], [], []
    eval_every = config.iterations_per_eval * config.env_steps_per_iteration
    every = [eval_every] + ([run.checkpoint_every * config.env_steps_per_iteration] if run.checkpoint_every else [])
    next_save = {"steps": eval_every}

    def last_checkpoint():
        if saver is None:
            return None
        saver.wait()
        return saver.checkpointer.latest_step()

    nonfinite = NonFinitePolicy(run, last_checkpoint, os.path.join(out_dir, "checkpoints"), unit="update")

    def snapshot_due(update, steps):
        if steps < next_save["steps"]:
            return False
        next_save["steps"] = min((steps // n + 1) * n for n in every)
        return True

    def emit(steps, metrics):
        for sink in sinks:
            sink(steps, metrics)

    evaluated_at: dict[int, list[int]] = {}  # update -> the iterations whose evaluation got its learner

    def save_snapshot(snapshot):
        # The checkpoint notes the evaluations given its learner: a resumed run redoes one that was lost.
        snapshot.evaluated = tuple(evaluated_at.get(snapshot.updates, ()))
        for update in [u for u in evaluated_at if u <= snapshot.updates]:
            del evaluated_at[update]
        saver(snapshot)

    def record(results):
        for iteration, result in results:
            evaluations.append({"iteration": iteration, "env_steps": iteration * config.env_steps_per_iteration,
                                "done_time": time.perf_counter(), **result})
            emit(iteration * config.env_steps_per_iteration, result)

    try:
        evaluator.start()
        start = time.perf_counter()
        trainer = AsyncTrainer(config, run.actors, run.max_policy_lag, actor_envs=[envs[n] for n in names], env=env)
        startup_seconds = time.perf_counter() - start
        resumed = None
        if run.resume:
            source = Checkpointer(os.path.join(os.path.abspath(run.resume), "checkpoints"))
            try:
                resumed = async_checkpoint.restore(source, trainer.template(), config)
            finally:
                source.close()
            if saver is not None:  # the restore may have moved a damaged step aside
                saver.checkpointer.reload()
                if resumes_in_place(out_dir, run.resume):
                    drop_metrics_after(os.path.join(out_dir, "metrics.jsonl"), resumed.env_steps)
        if managed:
            manager = ResourceManager(run.resources, run.actors, quota_env(run.use_mps, run.compile_cache),
                                      os.path.join(out_dir, "resources.jsonl") if write_outputs else None)
        consumed0 = resumed.env_steps if resumed else 0
        if run.num_evals > 1 and resumed is None:
            evaluator.submit(0, trainer.executor.init(jax.random.PRNGKey(run.seed)).learner)
        # Evaluations given the restored learner that a killed run never logged: the same parameters and key
        # give its result. (With grow_keeps='update_size' an evaluation may fall on an update inside a learner
        # step, whose learner no checkpoint holds; such a loss is not redone.)
        lost = unlogged_evaluations(run.resume, resumed.evaluated, config.env_steps_per_iteration) if resumed else []
        for iteration in lost:
            evaluator.submit(iteration, resumed.learner)
        last = {"time": time.perf_counter(), "next_eval": (consumed0 // eval_every + 1) * eval_every}
        next_save["steps"] = min((consumed0 // n + 1) * n for n in every)

        def on_update(update, steps, learner, info):
            now = time.perf_counter()
            update_starts.append(last["time"])
            update_seconds.append(now - last["time"])
            update_env_steps.append(steps - consumed0)
            last["time"] = now
            emit(steps, {"train/policy_lag_max": max(info["lags"]), "perf/queue_depth": info["queue_depth"],
                         "train/episode_return": info["episode_return"] if info["episodes"] else float("nan"),
                         **{f"resources/actor{i}_groups": float(g) for i, g in enumerate(info["groups_per_actor"])},
                         **({"train/skipped_updates": float(info["skipped"])} if nonfinite.skip else {})})
            while steps >= last["next_eval"]:
                evaluator.submit(last["next_eval"] // config.env_steps_per_iteration, learner)
                evaluated_at.setdefault(update, []).append(last["next_eval"] // config.env_steps_per_iteration)
                last["next_eval"] += eval_every
            record(evaluator.finished())

        termination = StopSignals()  # SIGTERM or Ctrl-C: end after this update, with the final snapshot
        try:
            # Snapshots only where a checkpoint is written: each fetches every actor's env state through its
            # pipe (~24 KB per ant env, 397 MB at 16,384 envs), which stalled the H200's learner 1-3 s per
            # evaluation period in runs that saved nothing (BENCHMARKS.md, 2026-12-04).
            result = trainer.run(env_steps=budget, timeout=run.actor_timeout, on_update=on_update, start=resumed,
                                 snapshot_due=snapshot_due if saver is not None else None,
                                 on_snapshot=save_snapshot if saver is not None else None, manager=manager,
                                 nonfinite=nonfinite,
                                 should_stop=lambda: termination.requested is not None)
        finally:
            termination.restore()
        if saver is not None:
            saver.wait()
        if termination.requested is not None:
            # The evaluations in flight, after the checkpoint is on disk: a resumed run starts past them.
            record(evaluator.drain_on_stop())
            saved = (f"checkpoint of update {last_checkpoint()} saved in {out_dir}, resume with --run.resume"
                     if saver is not None else "no checkpoint (outputs are off)")
            raise TerminatedError(f"{termination.requested} received; {saved}.",
                                  130 if termination.requested == "SIGINT" else 143)
        record(evaluator.drain())
        for decision in result.resource_decisions:
            if decision["kind"] in ("sm_quota", "cores", "restart", "groups"):
                emit(consumed0 + result.env_steps, {f"resources/{decision['process']}_{decision['kind']}":
                                        float(np.mean(decision["after"]))})
        emit(consumed0 + result.env_steps, {"perf/rollout_sps": result.rollout_sps,
                                "perf/updates_per_second": result.updates_per_second,
                                "train/policy_lag_mean": _mean(result.lags),
                                "perf/queue_depth_mean": _mean(result.queue_depths)})
    finally:
        # Every step runs whatever another raised; the first error surfaces unless one is already on its way.
        problems = []
        steps = [trainer.close if trainer is not None else None, manager.close if manager is not None else None,
                 saver.wait if saver is not None else None, saver.checkpointer.close if saver is not None else None,
                 evaluator.close, *(sink.close for sink in sinks if hasattr(sink, "close"))]
        for step in steps:
            try:
                if step is not None:
                    step()
            except Exception as error:  # noqa: BLE001 - reported below
                problems.append(error)
        if problems:
            if sys.exc_info()[0] is None:
                raise problems[0]
            warnings.warn(f"While stopping after an error, cleanup also failed: {problems[0]!r}", stacklevel=2)
    evaluations.sort(key=lambda e: e["iteration"])
    state = RunState(result.learner, None, None, result.updates)
    out = TrainResult(state, trainer.executor, evaluations, update_seconds, startup_seconds, out_dir,
                      sum(update_seconds), update_starts, evaluator.worker.info)
    out.async_result = result
    out.skipped_iterations = nonfinite.skipped
    out.iteration_env_steps = update_env_steps
    return out


def _mean(values) -> float:
    return float(np.mean(values)) if len(values) else float("nan")  # no update made (a finished run resumed)

