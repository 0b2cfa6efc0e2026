"""The group-spread runtime: a plan's rollout chunk runs in several worker processes at once, each
stepping its own share of the env groups (inference and simulation for a whole iteration); the
controller runs the rest of the iteration (the learner) on everything they collected.

Under MPS the group processes run concurrently on one GPU, so one group's policy inference fills
the SMs another group's latency-bound simulation leaves idle (DESIGN.md: cut processes at coarse
boundaries). Per iteration the parameters and normalizer go out once and each process's unrolls
come back once, through `jaxrose.transport` buffers (CUDA IPC memory on a GPU with CuPy, shared
host memory otherwise); each group's env state stays in its process (`materialize` brings it back
for a checkpoint). Sampling noise is drawn for all groups and sliced (`rollout_nodes(group_slice=)`),
so the run computes what the sequential executor computes.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrose.config import TrainConfig, replace
from jaxrose.mps import prepare_clients
from jaxrose.networks import make_actor_critic
from jaxrose.plan import GROUP_RESIDENT_STATE, Plan, PlanError, with_unrolled_loops
from jaxrose.plan_executor import PlanExecutor
from jaxrose.ppo_program import ITERATION_INPUTS, rollout_nodes, run_state_to_program_state
from jaxrose.program import Program, run_program, writes_of
from jaxrose.sequential import RunState, SequentialExecutor, health, make_env, next_run_state
from jaxrose.transport import attach, make_buffers, publish, take, transport_kind
from jaxrose.workers import Worker

BROADCAST = ("params", "normalizer")  # what the controller sends every iteration
log = logging.getLogger(__name__)


def group_chunk_program(config: TrainConfig, plan: Plan, index: int, program_factory: Optional[Callable] = None
                        ) -> Program:
    """The spread chunk as group process `index` runs it: PPO's rollout over its share of the groups,
    then any stages declared `group_local` that the plan moved next to it (from `program_factory`'s
    program: `program_factory(SequentialExecutor(config)) -> Program`, a picklable function)."""
    from envs.wrappers import wrap_for_training

    chunk = plan.spread_chunk
    workers = len(chunk.group_processes)
    local_groups = plan.num_groups // workers
    env = make_env(config)
    train_env = wrap_for_training(env, config.env.episode_length, local_groups, config.env.envs_per_group)
    net = make_actor_critic(int(env.observation_size), int(env.action_size), config.network,
                            config.ppo.normalize_observations)
    nodes = {n.name: n for n in rollout_nodes(train_env, net, config, (index * local_groups, local_groups,
                                                                       plan.num_groups))}
    if program_factory is not None and set(chunk.nodes) - set(nodes):
        # Group-local stages are written for any group count, so the full program's own nodes serve.
        user = program_factory(SequentialExecutor(config))
        nodes.update({n.name: n for n in user.body if n.name not in nodes})
    if set(chunk.nodes) - set(nodes):
        raise PlanError(f"Chunk {chunk.name!r} spreads groups but holds {sorted(set(chunk.nodes) - set(nodes))}: "
                        f"beyond PPO's rollout nodes ({', '.join(nodes)}) the group processes need the program "
                        f"that defines them (pass program_factory).")
    return Program(f"{plan.program}/{chunk.name}@{index}",
                   with_unrolled_loops([nodes[n] for n in chunk.nodes], chunk.unrolled))


def _slice_groups(tree: Any, index: int, count: int) -> Any:
    return jax.tree.map(lambda x: np.asarray(x)[index * count:(index + 1) * count], tree)


def _serve_groups(conn, config: TrainConfig, plan: Plan, index: int, outputs: tuple[str, ...],
                  program_factory: Optional[Callable]) -> None:
    """Group process: holds its groups' env state; per iteration reads the broadcast, runs the
    rollout, writes its unrolls into the controller's buffers."""
    program = group_chunk_program(config, plan, index, program_factory)
    run = jax.jit(lambda values: run_program(program, values))
    device = jax.devices()[0]
    conn.send(("ready", {"platform": device.platform, "core_count": getattr(device, "core_count", None)}))
    broadcast = results = None
    resident: dict[str, Any] = {}
    try:
        while True:
            message = conn.recv()
            kind = message[0]
            if kind == "stop":
                return
            if kind == "setup":
                broadcast, results = attach(message[1]), attach(message[2])
                conn.send(("ok",))
            elif kind == "load":  # this process's groups' env state and the loop key
                resident = jax.device_put(message[1])
                conn.send(("ok",))
            elif kind == "compile":
                start = time.perf_counter()
                run = run.lower({**broadcast.read(), **resident}).compile()
                conn.send(("ok", time.perf_counter() - start))
            elif kind == "run":
                start = time.perf_counter()
                values = run({**broadcast.read(), **resident})
                resident = {GROUP_RESIDENT_STATE: values[GROUP_RESIDENT_STATE], "key": values["key"]}
                results.write({name: values[name] for name in outputs})
                conn.send(("result", message[1], time.perf_counter() - start))
            elif kind == "gather":
                conn.send(("state", publish(resident[GROUP_RESIDENT_STATE])))  # shared memory, not pickled
    finally:
        for buffers in (broadcast, results):
            if buffers is not None:
                buffers.close()


class GroupSpreadExecutor(PlanExecutor):
    """Runs a plan with a `spread_groups` chunk: group processes for the rollout, the rest here."""

    def __init__(self, config: TrainConfig, plan: Plan, worker_env: Optional[dict[str, dict[str, str]]] = None,
                 timeout: float = 600.0, transport: str = "auto", program_factory: Optional[Callable] = None):
        if plan.num_groups is not None:
            config = replace(config, **{"env.num_groups": plan.num_groups})
        self.program_factory = program_factory
        super().__init__(config, plan, program=program_factory(SequentialExecutor(config)) if program_factory else None)
        chunk = plan.spread_chunk
        if chunk is None:
            raise PlanError("This plan spreads no chunk over group processes; run it with PlanExecutor.")
        for other in plan.chunks:
            if other is not chunk and other.process != "main":
                raise PlanError(f"Chunk {other.name!r} is on process {other.process!r}: with groups spread, the "
                                f"other chunks run in the main process.")
        self.spread = chunk
        self.processes = chunk.group_processes
        self.local_groups = plan.num_groups // len(self.processes)
        later_reads = {name for c in plan.chunks if c is not chunk
                       for stage, _ in Program("", self._nodes(c)).stages() for name in stage.reads}
        written = writes_of(self._nodes(chunk))
        self.outputs = tuple(sorted((written & later_reads) | (written & set(ITERATION_INPUTS) - {GROUP_RESIDENT_STATE})))
        self.timeout = timeout
        self.transport = transport_kind(transport)
        if worker_env is None:
            quotas = dict(plan.quotas)
            worker_env = prepare_clients({p: quotas.get(p) for p in self.processes}, config.run.use_mps,
                                         config.run.compile_cache)
        self.workers: list[Worker] = []
        self._broadcast = None
        self._results: list = []
        self._group_axes: Optional[dict] = None
        self._output_shapes: dict = {}
        self._resident_iteration: Optional[int] = None
        self.last_seconds: list[float] = []
        try:
            for index, process in enumerate(self.processes):
                worker = Worker(process, _serve_groups, (self.config, plan, index, self.outputs, program_factory),
                                worker_env.get(process, {}))
                self.workers.append(worker)
                worker.launch()
            for worker in self.workers:  # they import JAX and build their envs concurrently
                worker.wait_ready(timeout)
            log.info("%d group processes ready (%s transport)", len(self.workers), self.transport)
        except BaseException:
            self.close()
            raise

    def _nodes(self, chunk) -> tuple:
        by_name = {node.name: node for node in self.program.body}
        return tuple(by_name[n] for n in chunk.nodes)

    def _runs_here(self, chunk) -> bool:
        return chunk is not self.spread

    # -- set-up --------------------------------------------------------------------------------------

    def _setup(self, state: RunState) -> None:
        """Buffers shaped from the state, and each output's group axis (where one process's share
        differs from the whole), found by tracing the chunk both ways."""
        if self._broadcast is not None:
            return
        values = run_state_to_program_state(state)
        full = jax.eval_shape(lambda v: run_program(Program("", self._nodes(self.spread)), v), values)
        local_values = {**values, GROUP_RESIDENT_STATE: jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((self.local_groups,) + x.shape[1:], x.dtype), values[GROUP_RESIDENT_STATE])}
        group_program = group_chunk_program(self.config, self.plan, 0, self.program_factory)
        local = jax.eval_shape(lambda v: run_program(group_program, v), local_values)
        local_out = {name: local[name] for name in self.outputs}
        self._output_shapes = {name: full[name] for name in self.outputs}
        self._group_axes = jax.tree.map(_group_axis, local_out, self._output_shapes)
        self._broadcast = make_buffers({name: jax.eval_shape(lambda x: x, values[name]) for name in BROADCAST},
                                       self.transport)
        for worker in self.workers:
            results = make_buffers(local_out, self.transport)
            self._results.append(results)
            worker.send(("setup", self._broadcast.describe(), results.describe()))
        for worker in self.workers:
            worker.receive(self.timeout)

    def _load(self, state: RunState) -> None:
        """Hands each group process its groups' env state (at start and after a restore)."""
        env_state = jax.device_get(state.env_state)
        for index, worker in enumerate(self.workers):
            worker.send(("load", {GROUP_RESIDENT_STATE: _slice_groups(env_state, index, self.local_groups),
                                  "key": np.asarray(state.key)}))
        for worker in self.workers:
            worker.receive(self.timeout)
        self._resident_iteration = int(state.iteration)

    def compile(self, state: RunState) -> float:
        """Compiles the group processes' rollout (concurrently) and this process's chunks."""
        start = time.perf_counter()
        self._setup(state)
        self._load(state)
        self._broadcast.write({name: getattr(state.learner, name) for name in BROADCAST})
        for worker in self.workers:
            worker.send(("compile",))
        values = {**jax.eval_shape(run_state_to_program_state, state), **self._output_shapes}
        compiled = []
        for fn in self._local_fns():
            compiled.append(fn.lower(values).compile())
            values = jax.eval_shape(fn, values)
        self._compiled_chunks = compiled
        log.info("controller chunks compiled after %.1f s", time.perf_counter() - start)
        worker_seconds = [worker.receive(self.timeout)[1] for worker in self.workers]
        log.info("group processes compiled in %s s", ", ".join(f"{s:.1f}" for s in worker_seconds))
        return time.perf_counter() - start

    # -- one iteration -------------------------------------------------------------------------------

    def step(self, state: RunState) -> tuple[RunState, dict]:
        self._setup(state)
        iteration = int(state.iteration)
        if self._resident_iteration != iteration:
            self._load(state)
        self._broadcast.write({name: getattr(state.learner, name) for name in BROADCAST})
        for worker in self.workers:
            worker.send(("run", iteration))
        self.last_seconds = [worker.receive(self.timeout)[2] for worker in self.workers]
        log.debug("iteration %d: group rollouts took %s s", iteration, ", ".join(f"{s:.3f}" for s in self.last_seconds))
        parts = [results.read() for results in self._results]
        gathered = jax.tree_util.tree_map_with_path(_gather_output, self._group_axes, *parts)
        values = {**run_state_to_program_state(state), **gathered}
        for fn in self._local_fns():
            values = fn(values)
        self._resident_iteration = iteration + 1
        # The returned state's env_state is the one last loaded: `materialize` fetches the live one.
        return next_run_state(values, state), {**values["metrics"], **health(values)}

    def materialize(self, state: RunState) -> RunState:
        """`state` with the group processes' live env state (for a checkpoint)."""
        if self._resident_iteration != int(state.iteration):
            return state
        for worker in self.workers:
            worker.send(("gather",))
        parts = [take(worker.receive(self.timeout)[1]) for worker in self.workers]
        env_state = jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *parts)
        return state.replace(env_state=jax.device_put(env_state))

    def reload(self) -> None:
        """The next step hands the group processes the env state and key of the state it is given
        (after the caller replaced them, e.g. a NaN skip resetting envs)."""
        self._resident_iteration = None

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers = []
        for buffers in [self._broadcast, *self._results]:
            if buffers is not None:
                buffers.close()
        self._broadcast, self._results = None, []


REPLICATED = -1  # an output every group process computes identically (the loop key): take the first


def _gather_output(path, axis: int, *parts):
    """One output of the spread chunk from every group process: joined along its group axis, or, where
    each process has the whole output (REPLICATED), the first after checking that they all agree: a
    difference means a stage declared `group_local` combined env groups."""
    if axis != REPLICATED:
        return jnp.concatenate(parts, axis=axis)
    if any(not np.array_equal(parts[0], other, equal_nan=True) for other in parts[1:]):
        raise PlanError(f"The spread chunk's output {jax.tree_util.keystr(path)} differs between group processes "
                        f"although each computes it whole: a stage in the chunk combines env groups. Declare it "
                        f"without `group_local=True` (it then runs after the spread), or make it per group.")
    return parts[0]


def _group_axis(local, full) -> int:
    differing = [i for i, (a, b) in enumerate(zip(local.shape, full.shape)) if a != b]
    if not differing and local.shape == full.shape:
        return REPLICATED
    if len(differing) != 1:
        raise PlanError(f"A spread chunk's output of shape {full.shape} has no single group axis "
                        f"(one process's share: {local.shape}).")
    return differing[0]
