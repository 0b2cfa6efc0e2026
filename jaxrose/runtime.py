"""The multi-process runtime: a plan's main chunks run here, every other process of the plan is a
spawned worker (an MPS client with its SM quota on a GPU) that runs its chunks.

What crosses processes travels once per iteration through shared host memory (`jaxrose.transport`),
double-buffered so that the trainer never waits for a helper that is still busy with the previous
iteration. This runtime runs helper chunks that are *deferred* (nothing in the next iteration reads
what they write): on the measured H200 a hand-off costs far too much to sit on the critical path
every step (DESIGN.md), so chunks on the critical path stay in the main process. Results of helper
chunks arrive asynchronously; `results()` returns those that are in, `drain()` waits for all.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import jax

from jaxrose.config import TrainConfig
from jaxrose.distributed import local_copy
from jaxrose.mps import prepare_clients
from jaxrose.plan import Plan, PlanError, chunk_program, stages_of
from jaxrose.plan_executor import PlanExecutor
from jaxrose.program import Program, run_program, writes_of
from jaxrose.sequential import RunState, SequentialExecutor, health, next_run_state
from jaxrose.transport import SharedTree, SharedTreeReader
from jaxrose.workers import Worker

MAIN = "main"


def _helper_program(config: TrainConfig, plan: Plan, process: str, program_factory: Optional[Callable]) -> Program:
    executor = SequentialExecutor(config)
    program = program_factory(executor) if program_factory else executor.program
    chunks = [chunk_program(program, c) for c in plan.chunks if c.process == process]
    return Program(f"{program.name}@{process}", tuple(node for chunk in chunks for node in chunk.body))


def _serve_chunks(conn, config: TrainConfig, plan: Plan, process: str, program_factory) -> None:
    """Worker side: receive the inputs of iteration k, run this process's chunks, send back their writes."""
    program = _helper_program(config, plan, process, program_factory)
    outputs = sorted(writes_of(program.body))
    run = jax.jit(lambda values: {k: v for k, v in run_program(program, values).items() if k in outputs})
    reader = SharedTreeReader()
    device = jax.devices()[0]
    conn.send(("ready", {"platform": device.platform, "core_count": getattr(device, "core_count", None)}))
    try:
        while True:
            message = conn.recv()
            if message[0] == "stop":
                return
            _, iteration, described = message
            values = reader.read(described)
            start = time.perf_counter()
            result = jax.device_get(run(values))
            conn.send(("result", iteration, result, time.perf_counter() - start))
    finally:
        reader.close()


def _check_helpers_feed_only_themselves(plan: Plan, program: Program, graph) -> None:
    """Data crosses processes from the main one to helpers only: a helper's results come back
    asynchronously, never as another chunk's input in the same iteration."""
    chunk_of = {stage: chunk for chunk in plan.chunks if not chunk.group_processes
                for stage in stages_of(program, chunk.nodes)}
    for edge in graph.edges:
        source, reader = chunk_of.get(edge.src), chunk_of.get(edge.dst)
        if (edge.carried_by is None and source is not None and reader is not None and source.process != MAIN
                and reader.process != source.process):
            raise PlanError(f"Chunk {reader.name!r} (process {reader.process!r}) reads {edge.name!r}, which chunk "
                            f"{source.name!r} writes on process {source.process!r} in the same iteration: this "
                            f"runtime hands data from {MAIN!r} to helpers only. Place {reader.name!r} on "
                            f"{source.process!r} too, or {source.name!r} on {MAIN!r}.")


class MultiProcessPlanExecutor(PlanExecutor):
    def __init__(self, config: TrainConfig, plan: Plan, program_factory: Optional[Callable] = None,
                 worker_env: Optional[dict[str, dict[str, str]]] = None, timeout: float = 300.0):
        executor_program = None
        if program_factory is not None:
            executor_program = program_factory(SequentialExecutor(config))
        super().__init__(config, plan, program=executor_program)
        for chunk in plan.chunks:
            if chunk.process != MAIN and not chunk.deferred:
                raise PlanError(f"Chunk {chunk.name!r} is on process {chunk.process!r} but not deferred: this "
                                f"runtime keeps the critical path in the main process (a hand-off per iteration "
                                f"on it costs more than it saves). Defer it or place it on {MAIN!r}.")
        _check_helpers_feed_only_themselves(plan, self.program, self.graph)
        if worker_env is None:  # each helper an MPS client at its planned quota, where MPS is available
            quotas = dict(plan.quotas)
            worker_env = prepare_clients({p: quotas.get(p) for p in plan.processes if p != MAIN},
                                         config.run.use_mps, config.run.compile_cache)
        self.timeout = timeout
        self.helpers: dict[str, Worker] = {}
        self._inputs: dict[str, list[str]] = {}
        self._buffers: dict[str, list[SharedTree]] = {}
        self._in_flight: dict[str, list[int]] = {}
        self._results: list[tuple[str, int, dict, float]] = []
        try:
            for process in [p for p in plan.processes if p != MAIN]:
                program = _helper_program(config, plan, process, program_factory)
                reads = {name for stage, _ in program.stages() for name in stage.reads}
                self._inputs[process] = sorted(reads - writes_of(program.body))
                env = (worker_env or {}).get(process, {})
                worker = Worker(process, _serve_chunks, (config, plan, process, program_factory), env)
                self.helpers[process] = worker
                worker.start(timeout)
                self._buffers[process] = [SharedTree(), SharedTree()]
                self._in_flight[process] = []
        except BaseException:
            self.close()
            raise

    def _runs_here(self, chunk) -> bool:
        return chunk.process == MAIN

    def step(self, state: RunState) -> tuple[RunState, dict]:
        values = self._run_local(state)
        iteration = int(state.iteration)
        for process, worker in self.helpers.items():
            inputs = {name: values[name] for name in self._inputs[process]}
            self._send(process, worker, iteration, local_inputs(process, inputs))
        return next_run_state(values, state), {**values.get("metrics", {}), **health(values)}

    def _send(self, process: str, worker: Worker, iteration: int, inputs: dict) -> None:
        # Double buffering: buffer iteration % 2 is free once the helper answered iteration - 2.
        in_flight = self._in_flight[process]
        while in_flight and in_flight[0] <= iteration - 2:
            self._receive(process, worker)
        message = self._buffers[process][iteration % 2].write(inputs)
        worker.send(("run", iteration, message))
        in_flight.append(iteration)

    def _receive(self, process: str, worker: Worker) -> None:
        _, iteration, result, seconds = worker.receive(self.timeout)
        self._in_flight[process].remove(iteration)
        self._results.append((process, iteration, result, seconds))

    def results(self) -> list[tuple[str, int, dict, float]]:
        """Helper results that have arrived: (process, iteration, outputs, seconds); never waits."""
        for process, worker in self.helpers.items():
            while self._in_flight[process] and worker.poll():
                self._receive(process, worker)
            if self._in_flight[process] and not worker.process.is_alive():
                raise worker.death_error("with work outstanding")
        done, self._results = self._results, []
        return done

    def drain(self) -> list[tuple[str, int, dict, float]]:
        for process, worker in self.helpers.items():
            while self._in_flight[process]:
                self._receive(process, worker)
        done, self._results = self._results, []
        return done

    def close(self) -> None:
        for worker in self.helpers.values():
            worker.stop()
        for buffers in self._buffers.values():
            for buffer in buffers:
                buffer.close()
        self.helpers.clear()


def local_inputs(process: str, inputs: dict) -> dict:
    """A helper's inputs as this process holds them. Over several processes (`jax.distributed`) each
    process sends to its own helpers, on its own GPU, its copy of values every process holds whole;
    a value sharded over processes has no whole copy here, so a chunk reading one stays in main."""
    for name, value in inputs.items():
        for leaf in jax.tree.leaves(value):
            if not getattr(leaf, "is_fully_addressable", True) and not leaf.is_fully_replicated:
                raise PlanError(f"Helper {process!r} reads {name!r}, which is split over this run's processes: a "
                                f"helper gets whole values only. Keep the chunk that reads it in {MAIN!r}, or run "
                                f"the plan on one process.")
    return local_copy(inputs)


def executor_for(config: TrainConfig, plan: Plan, worker_env: Optional[dict[str, dict[str, str]]] = None):
    """The executor that runs `plan`: one process, helper processes for deferred chunks, or group
    processes for a spread rollout."""
    if plan.spread_chunk is not None:
        from jaxrose.group_runtime import GroupSpreadExecutor

        if jax.process_count() > 1:
            raise PlanError("A plan that spreads the rollout over group processes runs on one process: over several "
                            "processes each already steps its own env groups. Use a plan without a group spread.")
        return GroupSpreadExecutor(config, plan, worker_env=worker_env)
    if any(p != MAIN for p in plan.processes):
        return MultiProcessPlanExecutor(config, plan, worker_env=worker_env)
    return PlanExecutor(config, plan)
