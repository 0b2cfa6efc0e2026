"""`train(config)`: the sequential executor driven by a host loop with evaluation, logging and checkpoints.

Evaluations follow brax's schedule: one before training, then one every
`config.iterations_per_eval` iterations, either inline (as brax) or in a separate process that
overlaps them with training (`run.eval_mode='process'`). A checkpoint is written at each
evaluation, every `run.checkpoint_every` iterations, at the end, and on Ctrl-C.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from typing import Iterable, Mapping, Optional

import jax
import numpy as np

from jaxrose import distributed
from jaxrose.callbacks import Callback, JsonlWriter, ProgressBar, TensorBoardWriter
from jaxrose.async_checkpoint import BackgroundSaver
from jaxrose.checkpoint import Checkpointer
from jaxrose.config import SEVERAL_PROCESSES, ConfigError, PPOConfig, RunConfig, TrainConfig
from jaxrose.config import replace as replace_config
from jaxrose.eval_worker import ProcessEvaluator
from jaxrose.evaluation import evaluation_key, make_evaluate
from jaxrose.mps import prepare_clients
from jaxrose.nonfinite import NonFiniteError, NonFiniteGuard
from jaxrose.plan import Plan
from jaxrose.runtime import MAIN, executor_for
from jaxrose.plotting import plot_learning_curve
from jaxrose.run_folder import drop_metrics_after, resumes_in_place, set_aside_earlier_run, unlogged_evaluations
from jaxrose.sequential import RunState, SequentialExecutor

__all__ = ["DeviceLostError", "NonFiniteError", "TerminatedError", "TrainResult", "reset_compile_cache", "train",
           "use_compile_cache"]


class TerminatedError(KeyboardInterrupt):
    """SIGTERM or SIGINT (Ctrl-C) arrived: the loop saved a checkpoint and stopped. `exit_code` is
    the shell's convention for the signal (143, 130)."""

    def __init__(self, message: str, exit_code: int = 143):
        super().__init__(message)
        self.exit_code = exit_code


class DeviceLostError(RuntimeError):
    """This process's GPU context failed mid-run (under MPS: the run's MPS server or daemon died)."""


def _device_lost(error: Exception) -> bool:
    text = str(error)
    return "CUDA_ERROR" in text or "CUDA error" in text


@dataclasses.dataclass
class TrainResult:
    state: RunState
    executor: SequentialExecutor
    evaluations: list[dict]
    iteration_seconds: list[float]
    compile_seconds: float
    out_dir: str
    wall_seconds: float = float("nan")
    """From the first training iteration's dispatch to the last evaluation's result."""
    iteration_start_times: list[float] = dataclasses.field(default_factory=list)
    """`time.perf_counter()` at each iteration's dispatch; evaluations carry `done_time` likewise."""
    eval_worker: dict = dataclasses.field(default_factory=dict)
    """What the evaluation process reported at start (device, SM count), when evaluation ran there."""
    skipped_iterations: list[int] = dataclasses.field(default_factory=list)
    """Iterations whose update was dropped for NaN or Inf (`run.on_nonfinite='skip'`)."""
    iteration_env_steps: list[int] = dataclasses.field(default_factory=list)
    """Asynchronous mode: env steps consumed by the end of each update, counted from the run's start (updates
    differ in size when batches grow)."""

    @property
    def params(self):
        return self.state.learner.params

    @property
    def final_return(self) -> float:
        return self.evaluations[-1]["eval/episode_return"] if self.evaluations else float("nan")


def train(config: TrainConfig, callbacks: Iterable[Callback] = (), executor: Optional[SequentialExecutor] = None,
          write_outputs: bool = True) -> TrainResult:
    """Trains with PPO, on the sequential executor or on the plan in `run.plan`, and returns the
    final state and metrics. In asynchronous mode (`run.mode='async'`) only `executor.env` is
    used: the env the actors step (e.g. a fault injector).

    Outputs (metrics.jsonl, TensorBoard events, checkpoints/, learning_curve.png) go to
    `config.run.out_dir` when `write_outputs` is true. Over several processes (`jaxrose.distributed`)
    only process 0 writes them and calls `callbacks`; every process takes part in each checkpoint,
    so out_dir must be one shared folder.
    """
    if config.run.compile_cache:
        use_compile_cache(config.run.compile_cache)
    several = distributed.initialize(config.run)  # before anything touches a device (MPS comes later still)
    if several and config.run.mode != "sync":
        raise ConfigError(SEVERAL_PROCESSES)
    if config.run.mode == "async":
        from jaxrose.async_train import train_async

        return train_async(config, callbacks, write_outputs, env=executor.env if executor is not None else None)
    # Worker processes (and MPS) must be set up before this process touches its GPU.
    plan = Plan.load(config.run.plan) if config.run.plan else None
    if plan is not None and plan.evaluation == "process" and config.run.eval_mode == "inline":
        config = replace_config(config, **{"run.eval_mode": "process"})  # the plan was tuned with it there
    helpers = {p: dict(plan.quotas).get(p) for p in plan.processes if p != MAIN} if plan else {}
    # Several processes: process 0 alone evaluates, in a worker beside it on its GPU, under its own daemon.
    evaluating_remotely = config.run.eval_mode == "process" and distributed.is_main_process()
    worker_envs = {}
    if helpers or evaluating_remotely:
        quotas = {**helpers, **({"evaluator": config.run.eval_sm_percentage} if evaluating_remotely else {})}
        worker_envs = prepare_clients(quotas, config.run.use_mps, config.run.compile_cache,
                                      own_quota=config.run.learner_sm_percentage,
                                      priorities={"evaluator": config.run.eval_priority},
                                      own_priority=config.run.learner_priority)
    _warn_unused_settings(config, starts_workers=bool(helpers or evaluating_remotely))
    remote = None
    try:
        if evaluating_remotely:
            remote = ProcessEvaluator(config, worker_envs["evaluator"], task=getattr(executor, "custom_env", None))
            remote.start()
        if executor is None and plan is not None:
            executor = executor_for(config, plan, worker_envs or None)
        return _TrainingLoop(config, list(callbacks), executor, write_outputs, remote).run()
    finally:
        if remote is not None:
            remote.close()
        if executor is not None and hasattr(executor, "close"):
            executor.close()


def _warn_unused_settings(config: TrainConfig, starts_workers: bool) -> None:
    """A synchronous run ignores the asynchronous mode's settings, and the MPS settings of processes it
    does not start: one changed from its default is named, so an ablation is not silently void."""
    import warnings

    default_run, default_ppo = RunConfig(), PPOConfig()
    changed = lambda section, default, names: [f"{section}.{n}={getattr(getattr(config, section), n)}"
                                               for n in names if getattr(getattr(config, section), n)
                                               != getattr(default, n)]
    asynchronous = (changed("run", default_run, ("actors", "max_policy_lag", "actor_run_ahead", "actor_timeout"))
                    + changed("ppo", default_ppo, ("off_policy_correction", "max_off_policy_weight")))
    if asynchronous:
        warnings.warn(f"{', '.join(asynchronous)} has no effect in a synchronous run (run.mode='sync'): it sets the "
                      f"asynchronous mode (run.mode='async').", stacklevel=3)
    if not starts_workers:
        idle = changed("run", default_run, ("learner_sm_percentage", "learner_priority"))
        if idle:
            warnings.warn(f"{' and '.join(idle)} has no effect: this run starts no worker process under MPS (use "
                          f"it with run.mode='async', run.eval_mode='process' or a plan with helpers).", stacklevel=3)
    if config.run.eval_mode != "process":
        idle = changed("run", default_run, ("eval_sm_percentage", "eval_priority"))
        if idle:
            warnings.warn(f"{' and '.join(idle)} has no effect: evaluation runs inline (set run.eval_mode='process' "
                          f"to evaluate in its own process under MPS).", stacklevel=3)


def use_compile_cache(folder: str) -> None:
    """This process compiles through the persistent cache its workers share (`run.compile_cache`); a
    later run naming another folder moves it there."""
    folder = os.path.abspath(os.path.expanduser(folder))
    os.makedirs(folder, exist_ok=True)
    moved = jax.config.jax_compilation_cache_dir != folder
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    if moved:
        reset_compile_cache()


def reset_compile_cache() -> None:
    """JAX opens its persistent cache once per process, at the first compile, and keeps that folder: reset,
    it opens the folder set now at the next compile."""
    from jax._src import compilation_cache  # no public reset; guarded in case a JAX release moves it

    if hasattr(compilation_cache, "reset_cache"):
        compilation_cache.reset_cache()


class _TrainingLoop:
    def __init__(self, config: TrainConfig, sinks: list[Callback], executor: Optional[SequentialExecutor],
                 write_outputs: bool, remote: Optional[ProcessEvaluator]):
        self.config, self.run_config, self.sinks, self.remote = config, config.run, sinks, remote
        self.executor = executor or SequentialExecutor(config)
        self.evaluate = make_evaluate(self.executor.env, self.executor.net, self.run_config.num_eval_envs,
                                      config.env.episode_length, self.run_config.deterministic_eval)
        self.steps_per_iteration = self.executor.env_steps_per_iteration
        self.out_dir = os.path.abspath(self.run_config.out_dir)
        self.write_outputs = write_outputs
        self.main = distributed.is_main_process()
        if not self.main:
            self.sinks = []  # logs, metrics and plots come from process 0 alone
        self.checkpointer = None
        self.saver = None
        self.evaluations: list[dict] = []
        if write_outputs:
            self._open_outputs()

    def _open_outputs(self) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        if self.main:  # a fresh run's files never mix with an earlier run's
            set_aside_earlier_run(self.out_dir, self.run_config.resume)
        distributed.barrier("jaxrose_out_dir_ready")
        # Every process saves its shards of each checkpoint; the rest is process 0's.
        self.checkpointer = Checkpointer(os.path.join(self.out_dir, "checkpoints"), keep=self.run_config.keep_checkpoints)
        if jax.process_count() == 1:
            self.saver = BackgroundSaver(self.checkpointer, self.config)
        if not self.main:
            return
        with open(os.path.join(self.out_dir, "config.json"), "w") as f:
            json.dump(dataclasses.asdict(self.config), f, indent=2)
        self.sinks.append(JsonlWriter(os.path.join(self.out_dir, "metrics.jsonl")))
        if self.run_config.tensorboard:
            self.sinks.append(TensorBoardWriter(os.path.join(self.out_dir, "tensorboard")))

    def emit(self, iteration: int, metrics: Mapping[str, float]) -> None:
        for sink in self.sinks:
            sink(iteration * self.steps_per_iteration, metrics)

    def initial_state(self) -> RunState:
        state = self.executor.init(jax.random.PRNGKey(self.run_config.seed))
        if self.run_config.resume:
            source = Checkpointer(os.path.join(os.path.abspath(self.run_config.resume), "checkpoints"))
            try:
                state = source.restore(state, self.config)
            finally:
                source.close()
            if self.checkpointer is not None:  # the restore may have moved a damaged step aside
                self.checkpointer.reload()
            if self.write_outputs and self.main and resumes_in_place(self.out_dir, self.run_config.resume):
                drop_metrics_after(os.path.join(self.out_dir, "metrics.jsonl"),
                                   int(state.iteration) * self.steps_per_iteration)
        return state

    def record_evaluation(self, iteration: int, result: dict) -> None:
        self.evaluations.append({"iteration": iteration, "env_steps": iteration * self.steps_per_iteration,
                                 "done_time": time.perf_counter(), **result})
        self.emit(iteration, result)

    def compile_evaluation_ahead(self, state: RunState) -> Optional[threading.Thread]:
        """Compiles the inline evaluation in a thread while the iteration compiles: the evaluation before
        training would otherwise compile only after it (each took 20-45 s on the H200 for MJX presets,
        BENCHMARKS.md). jit finds the program this compiled (the same abstract arguments), so nothing is
        compiled twice; a failure here is left to the real call, which raises it where it belongs."""
        if self.remote is not None or self.run_config.eval_mode == "process":
            return None
        from jaxrose.precompile import abstract

        learner = distributed.local_copy(state.learner)
        args = jax.tree.map(abstract, (learner.params, learner.normalizer, evaluation_key(self.run_config.seed, 0)))

        def compile_quietly() -> None:
            try:
                self.evaluate.lower(*args).compile()
            except Exception:  # noqa: BLE001 - the evaluation's own call reports it
                pass

        thread = threading.Thread(target=compile_quietly, name="jaxrose-compile-evaluation", daemon=True)
        thread.start()
        return thread

    def start_evaluation(self, iteration: int, state: RunState) -> None:
        if self.remote is not None:
            self.remote.submit(iteration, distributed.local_copy(state.learner))
            return
        if self.run_config.eval_mode == "process":  # another process's evaluator reports (several processes)
            return
        start = time.perf_counter()
        learner = distributed.local_copy(state.learner)  # each process evaluates alone; process 0 reports
        metrics = _scalars(self.evaluate(learner.params, learner.normalizer,
                                         evaluation_key(self.run_config.seed, iteration)))
        result = {f"eval/{k}": v for k, v in metrics.items()}
        result["eval/walltime"] = time.perf_counter() - start
        self.record_evaluation(iteration, result)

    def collect_remote(self, wait: bool) -> None:
        """Results computed in other processes: evaluations, and the outputs of a plan's helper chunks."""
        if self.remote is not None:
            for iteration, result in (self.remote.drain() if wait else self.remote.finished()):
                self.record_evaluation(iteration, result)
        if hasattr(self.executor, "results"):
            for _, iteration, outputs, _ in (self.executor.drain() if wait else self.executor.results()):
                if "metrics" in outputs:
                    self.emit(iteration + 1, _scalars(outputs["metrics"]))

    def evaluation_lost(self, iteration: int) -> bool:
        """A resumed run starts at `iteration`, a step on the evaluation schedule, and the metrics of the run
        it resumes hold no evaluation of it: that run was killed (SIGKILL, a node lost, a stop past the wait)
        with the evaluation in flight. The state is the checkpoint's and the key is the step's, so evaluating
        it now logs what the killed run would have."""
        run = self.run_config
        if not run.resume or iteration == 0 or run.num_evals <= 1 or iteration % self.config.iterations_per_eval:
            return False
        return bool(unlogged_evaluations(run.resume, [iteration], self.steps_per_iteration))

    def record_evaluations_in_flight(self) -> None:
        """On a stop signal, after the checkpoint: the evaluation process's results for parameters already
        sent, waited for a bounded time (a resumed run starts after them and never redoes them)."""
        if self.remote is None:
            return
        for iteration, result in self.remote.drain_on_stop():
            self.record_evaluation(iteration, result)

    def save(self, iteration: int, state: RunState, wait: bool = False) -> None:
        if self.checkpointer is None:
            return
        if hasattr(self.executor, "materialize"):  # env state held by group processes comes back first
            state = self.executor.materialize(state)
        if self.saver is None:  # several processes write their shards of one checkpoint together
            self.checkpointer.save(iteration, state, self.config)
            return
        # The next step donates the state's device buffers: copy to the host now, write the files
        # in the background while training goes on.
        self.saver.submit(iteration, jax.device_get(state))
        if wait:
            self.saver.wait()

    def run(self) -> TrainResult:
        config, run = self.config, self.run_config
        state = self.initial_state()
        start_iteration = int(state.iteration)
        if run.progress_bar and self.main:
            self.sinks.append(ProgressBar(config.num_iterations * self.steps_per_iteration,
                                          start_iteration * self.steps_per_iteration))
        # A resumed run's first evaluation: the one its checkpoint's step lost, if any; else none until its schedule.
        evaluate_first = (start_iteration == 0 and run.num_evals > 1) or self.evaluation_lost(start_iteration)
        # The evaluation before training compiles beside the iteration's compile: in a thread (inline), or
        # in the evaluation process, which gets its parameters before this process compiles.
        evaluation_compile = self.compile_evaluation_ahead(state) if evaluate_first else None
        if evaluate_first and self.remote is not None:
            self.start_evaluation(start_iteration, state)
        try:
            compile_seconds = self.executor.compile(state)
        finally:  # a compile error must not leave the thread inside XLA at exit (the process aborts)
            if evaluation_compile is not None:
                evaluation_compile.join()
        self.emit(start_iteration, {"perf/compile_seconds": compile_seconds})
        if evaluate_first and self.remote is None:
            self.start_evaluation(start_iteration, state)

        iteration_seconds: list[float] = []
        start_times: list[float] = []
        wall_start = time.perf_counter()
        guard = NonFiniteGuard(self.executor, run, self._latest_checkpoint, self.out_dir)
        termination = StopSignals()
        saved_at = None
        try:
            for iteration in range(start_iteration + 1, config.num_iterations + 1):
                # Timed from dispatch to metrics on the host. On a GPU the XLA while loops inside an
                # iteration already make dispatch wait for the device, so a deeper dispatch queue
                # would overlap nothing and only blur per-iteration timing.
                start = time.perf_counter()
                start_times.append(start)
                guard.before_step(state)
                state, metrics = self.executor.step(state)
                metrics = _scalars(jax.device_get(metrics))
                seconds = time.perf_counter() - start
                state = guard.check(iteration, state, metrics)
                iteration_seconds.append(seconds)
                self.emit(iteration, {**metrics, **guard.metrics(), "perf/iteration_seconds": seconds,
                                      "perf/sps": self.steps_per_iteration / seconds})
                at_eval = iteration % config.iterations_per_eval == 0
                if at_eval:
                    self.start_evaluation(iteration, state)
                self.collect_remote(wait=False)
                if at_eval or iteration == config.num_iterations or (
                        run.checkpoint_every and iteration % run.checkpoint_every == 0):
                    self.save(iteration, state)
                    saved_at = iteration
                if termination.requested:
                    if saved_at != iteration:
                        self.save(iteration, state)
                    self.record_evaluations_in_flight()
                    raise TerminatedError(f"{termination.requested} received; checkpoint of iteration {iteration} "
                                          f"saved in {self.out_dir}, resume with --run.resume.",
                                          130 if termination.requested == "SIGINT" else 143)
            self.collect_remote(wait=True)
        except TerminatedError:
            raise
        except jax.errors.JaxRuntimeError as error:
            if not _device_lost(error):
                raise
            cause = "MPS server or daemon of this run died" if "MPS" in str(error) else "GPU reported an error"
            raise DeviceLostError(
                f"The GPU context of this process failed (the {cause}): {str(error).splitlines()[0][:300]}. "
                f"No state after the last checkpoint can be read back. The last checkpoint is iteration "
                f"{self._latest_checkpoint()} in {self.out_dir}: resume in a fresh process with --run.resume "
                f"(--run.no-use-mps trains without MPS).") from error
        except KeyboardInterrupt:  # Ctrl-C: keep the progress, if the interrupt left a whole state
            if _intact(state) and saved_at != int(state.iteration):
                self.save(int(state.iteration), state, wait=True)
            else:
                print("Interrupted inside an iteration (its input buffers were already consumed): the last "
                      "checkpoint is the one to resume from.", file=sys.stderr)
            raise
        finally:
            termination.restore()
            self._close_outputs()
        wall_seconds = time.perf_counter() - wall_start
        self.evaluations.sort(key=lambda e: e["iteration"])
        if self.write_outputs and self.main:
            plot_learning_curve(os.path.join(self.out_dir, "metrics.jsonl"),
                                os.path.join(self.out_dir, "learning_curve.png"),
                                title=f"{config.env.name}: PPO (jaxrose)")
        return TrainResult(state, self.executor, self.evaluations, iteration_seconds, compile_seconds, self.out_dir,
                           wall_seconds, start_times, self.remote.worker.info if self.remote else {},
                           guard.skipped)

    def _latest_checkpoint(self) -> Optional[int]:
        if self.saver is not None:
            self.saver.wait()
        return self.checkpointer.latest_step() if self.checkpointer else None

    def _close_outputs(self) -> None:
        for sink in self.sinks:
            if hasattr(sink, "close"):
                sink.close()
        if self.checkpointer is not None:
            try:
                if self.saver is not None:
                    self.saver.wait()  # the last checkpoint is on disk before the run returns
            finally:
                self.checkpointer.close()


def _scalars(metrics: Mapping) -> dict[str, float]:
    return {k: float(np.asarray(v)) for k, v in metrics.items()}


class StopSignals:
    """SIGTERM (a scheduler stopping the job) or a first SIGINT (Ctrl-C, a notebook's interrupt)
    sets a flag; the loop checkpoints at the end of the iteration in flight and raises
    TerminatedError. Raising from the handler itself could land inside a step after the state's
    buffers were donated, leaving no whole state to save. A second Ctrl-C interrupts at once."""

    def __init__(self):
        import signal
        import threading

        self.requested: Optional[str] = None  # the signal's name, once one arrived
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGTERM, signal.SIGINT):
                self._previous[number] = signal.signal(number, self._handle)

    def _handle(self, signum, frame) -> None:
        import signal

        if signum == signal.SIGINT and self.requested == "SIGINT":
            raise KeyboardInterrupt  # asked twice: stop now (the loop keeps the last checkpoint)
        self.requested = signal.Signals(signum).name
        if signum == signal.SIGINT:
            print("Ctrl-C: stopping after this iteration with a checkpoint (press again to stop at once).",
                  file=sys.stderr)

    def restore(self) -> None:
        import signal

        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous = {}


def _intact(state) -> bool:
    """False when some buffer of `state` was donated to a step that was then interrupted."""
    return not any(getattr(x, "is_deleted", lambda: False)() for x in jax.tree.leaves(state))
