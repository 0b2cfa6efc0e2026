"""Runs a `Plan` in one process: each chunk its own jitted call, in dependency order.

This is the checking ground for transformations: whatever a plan changes (chunking, groups,
placement, deferral), run here it must give the same parameters as the sequential executor. The
multi-process runtime runs the same chunks in the processes the plan names.
"""

from __future__ import annotations

import time

import jax

from jaxrose.config import TrainConfig, replace
from jaxrose.graph import build_graph
from jaxrose.plan import Plan, chunk_program, validate
from jaxrose.ppo_program import ITERATION_INPUTS, run_state_to_program_state
from jaxrose.program import run_program
from jaxrose.sequential import RunState, SequentialExecutor, health, next_run_state


class PlanExecutor(SequentialExecutor):
    def __init__(self, config: TrainConfig, plan: Plan, env=None, program=None):
        if plan.num_groups is not None:
            config = replace(config, **{"env.num_groups": plan.num_groups})
        super().__init__(config, env=env, program=program)
        self.plan = plan
        self.graph = build_graph(self.program, ITERATION_INPUTS)
        validate(plan, self.program, self.graph)
        self._chunk_fns = [jax.jit(_chunk_runner(chunk_program(self.program, chunk))) for chunk in plan.chunks]
        self._compiled_chunks = None

    def _runs_here(self, chunk) -> bool:
        """In one process every chunk runs here; the multi-process runtime keeps only the main ones."""
        return True

    def _local_fns(self):
        return self._compiled_chunks or [fn for fn, c in zip(self._chunk_fns, self.plan.chunks) if self._runs_here(c)]

    def compile(self, state: RunState) -> float:
        start = time.perf_counter()
        # Shapes with the state's shardings, chunk by chunk: over several devices or processes a chunk
        # compiled for one device would refuse the sharded values it is given.
        values = _with_shardings(jax.eval_shape(run_state_to_program_state, state),
                                 jax.tree.map(lambda x: x.sharding, run_state_to_program_state(state)))
        compiled = []
        for fn in self._local_fns():
            chunk = fn.lower(values).compile()
            compiled.append(chunk)
            values = _with_shardings(jax.eval_shape(fn, values), chunk.output_shardings)
        self._compiled_chunks = compiled
        return time.perf_counter() - start

    def _run_local(self, state: RunState) -> dict:
        values = run_state_to_program_state(state)
        for fn in self._local_fns():
            values = fn(values)
        return values

    def step(self, state: RunState) -> tuple[RunState, dict]:
        values = self._run_local(state)
        return next_run_state(values, state), {**values["metrics"], **health(values)}


def _with_shardings(shapes, shardings):
    return jax.tree.map(lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), shapes, shardings)


def _chunk_runner(program):
    def run(values):
        return run_program(program, values)

    return run
