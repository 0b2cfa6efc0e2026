"""The dataflow graph of a `Program`: stages as nodes, data dependencies derived from reads and writes.

An edge W → S says S reads a name that W wrote last before it. Where S reads a name before any
stage of its loop writes it, the value comes from the previous trip of the loop that carries it: a
loop-carried edge, tagged with that loop. The outermost loop is the training iteration itself
(`ITERATION`): e.g. `sgd_step → policy_inference` on `params`, carried by the iteration, is what
makes rollout k+1 wait for training k under synchronous semantics.

Readiness is modelled per stage instance `(stage, k)` of iteration k: it may start once every
in-iteration predecessor `(W, k)` and every iteration-carried predecessor `(W, k - 1)` has finished.
Stages that share an inner loop (policy inference and env step) interleave trip by trip inside one
chunk; at this level each is one instance per iteration.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Optional

from jaxrose.program import Loop, Program, Stage

ITERATION = "iteration"


@dataclasses.dataclass(frozen=True)
class StageNode:
    name: str
    component: str
    loops: tuple[str, ...]
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    index: int  # program order
    group_local: bool = False


@dataclasses.dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    name: str
    carried_by: Optional[str] = None  # None: same trip of every enclosing loop


@dataclasses.dataclass(frozen=True)
class DataflowGraph:
    nodes: tuple[StageNode, ...]
    edges: tuple[Edge, ...]
    inputs: frozenset[str]

    def node(self, name: str) -> StageNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"No stage named {name!r}; stages: {', '.join(n.name for n in self.nodes)}.")

    def predecessors(self, name: str, carried: Optional[bool] = None) -> list[Edge]:
        return [e for e in self.edges if e.dst == name and (carried is None or (e.carried_by is not None) == carried)]

    def iteration_carried(self) -> list[Edge]:
        return [e for e in self.edges if e.carried_by == ITERATION]

    def ready(self, stage: str, iteration: int, finished: set[tuple[str, int]]) -> bool:
        """May instance (stage, iteration) start, given the finished instances?"""
        for edge in self.predecessors(stage):
            if edge.carried_by == ITERATION:
                if iteration > 0 and (edge.src, iteration - 1) not in finished:
                    return False
            elif edge.carried_by is None and (edge.src, iteration) not in finished:
                return False
            # Edges carried by an inner loop stay inside that loop's execution: no instance-level wait.
        return True

    def ready_order(self, iterations: int) -> list[tuple[str, int]]:
        """A schedule that respects readiness, built by repeatedly starting whatever is ready
        (the order a sequential executor uses; a check that the graph has no cycle)."""
        finished: set[tuple[str, int]] = set()
        order = []
        pending = [(n.name, k) for k in range(iterations) for n in self.nodes]
        while pending:
            for item in pending:
                if self.ready(*item, finished):
                    break
            else:
                raise ValueError(f"No stage instance can start among {pending[:3]}...: the graph has a cycle.")
            pending.remove(item)
            finished.add(item)
            order.append(item)
        return order


def build_graph(program: Program, inputs: Iterable[str]) -> DataflowGraph:
    inputs = frozenset(inputs)
    program.validate(set(inputs))
    stages = program.stages()
    nodes = tuple(StageNode(s.name, s.component, loops, s.reads, s.writes, i, s.group_local)
                  for i, (s, loops) in enumerate(stages))
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise ValueError(f"Stage names must be unique in a program; repeated: "
                         f"{sorted({n for n in names if names.count(n) > 1})}.")
    # The stacked outputs of loops, attributed to the stages that write their per-step values.
    stacked_by = _stacked_writers(program)
    edges = []
    for node in nodes:
        for name in node.reads:
            edges.extend(_edges_for_read(node, name, nodes, stacked_by))
    return DataflowGraph(nodes, tuple(dict.fromkeys(edges)), inputs)


def _stacked_writers(program: Program) -> dict[str, set[str]]:
    result: dict[str, set[str]] = {}

    def writers(nodes, name) -> set[str]:
        found = set()
        for n in nodes:
            if isinstance(n, Stage) and name in n.writes:
                found.add(n.name)
            elif isinstance(n, Loop):
                found |= writers(n.body, name)
                for stacked, per_step in n.collect.items():
                    if stacked == name:
                        found |= writers(n.body, per_step)
        return found

    def visit(nodes):
        for n in nodes:
            if isinstance(n, Loop):
                for stacked, per_step in n.collect.items():
                    result.setdefault(stacked, set()).update(writers(n.body, per_step))
                visit(n.body)

    visit(program.body)
    return result


def _edges_for_read(node: StageNode, name: str, nodes, stacked_by) -> list[Edge]:
    writers = [n for n in nodes if name in n.writes or n.name in stacked_by.get(name, ())]
    before = [w for w in writers if w.index < node.index]
    if before:
        writer = before[-1]
        # Several writers in one loop body (e.g. a key split twice) all precede; the last one counts.
        return [Edge(writer.name, node.name, name)]
    # Read before any write in program order: the value comes from a previous trip of the innermost
    # loop that encloses both the reader and a writer, or from the previous iteration.
    # Its first trip reads what the previous iteration left, so the last writer in program order is
    # also an iteration-carried predecessor.
    edges = []
    for writer in [w for w in writers if w.index >= node.index][-1:]:
        common = _common_prefix(writer.loops, node.loops)
        if common:
            edges.append(Edge(writer.name, node.name, name, common[-1]))
        edges.append(Edge(writer.name, node.name, name, ITERATION))
    return edges


def _common_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    prefix = []
    for x, y in zip(a, b):
        if x != y:
            break
        prefix.append(x)
    return tuple(prefix)
