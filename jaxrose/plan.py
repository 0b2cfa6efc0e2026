"""A `Plan`: how one iteration of a `Program` is cut into chunks and placed on processes.

A chunk is a contiguous run of the program's top-level nodes, compiled as one jitted function; it
runs in a named process (each process has an optional SM quota under MPS) and, when `deferred`,
overlaps the next iteration instead of finishing this one (legal only if nothing in the next
iteration reads what it writes). Plans are data: printable, saved as JSON, compared, drawn.

Transformations are functions plan → plan; each checks its legality against the dataflow graph
and raises `PlanError` naming the dependency it would break.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional

from jaxrose.graph import DataflowGraph
from jaxrose.program import Loop, Program

PLAN_FORMAT = 1
EVALUATION_PLACES = ("inline", "process")


class PlanError(ValueError):
    """An illegal or malformed plan; the message names the dependency or setting at fault."""


@dataclasses.dataclass(frozen=True)
class Chunk:
    name: str
    nodes: tuple[str, ...]
    process: str = "main"
    deferred: bool = False
    group_processes: tuple[str, ...] = ()
    """Non-empty: the env groups are spread over these processes, each running this chunk for its
    share of the groups, all at once (see `spread_groups`)."""
    unrolled: tuple[str, ...] = ()
    """Loops (by name, at any depth) this chunk runs as straight-line code (see `unroll_loop`)."""


@dataclasses.dataclass(frozen=True)
class Plan:
    program: str
    chunks: tuple[Chunk, ...]
    num_groups: Optional[int] = None
    """Env groups; None keeps the run's `env.num_groups`."""
    quotas: tuple[tuple[str, Optional[int]], ...] = (("main", None),)
    history: tuple[str, ...] = ()
    evaluation: str = "inline"
    """Where the periodic evaluation runs: "inline" (between iterations) or "process" (its own MPS process
    beside training, as `run.eval_mode='process'`). Outside the iteration, so it changes no parameter."""

    @property
    def processes(self) -> list[str]:
        return list(dict.fromkeys(p for c in self.chunks for p in (c.group_processes or (c.process,))))

    @property
    def spread_chunk(self) -> Optional[Chunk]:
        """The chunk whose env groups are spread over processes, if any."""
        return next((c for c in self.chunks if c.group_processes), None)

    def chunk(self, name: str) -> Chunk:
        for chunk in self.chunks:
            if chunk.name == name:
                return chunk
        raise PlanError(f"No chunk named {name!r}; chunks: {', '.join(c.name for c in self.chunks)}.")

    def to_json(self) -> str:
        return json.dumps({"format": PLAN_FORMAT, **dataclasses.asdict(self)}, indent=2)

    @staticmethod
    def from_json(text: str) -> "Plan":
        data = json.loads(text)
        if data.pop("format", None) != PLAN_FORMAT:
            raise PlanError(f"Plan file format is not {PLAN_FORMAT}; it was written by another jaxrose version. "
                            f"Re-run `jaxrose tune` to make a new plan.")
        chunks = tuple(Chunk(c["name"], tuple(c["nodes"]), c["process"], c["deferred"],
                             tuple(c.get("group_processes", ())), tuple(c.get("unrolled", ())))
                       for c in data["chunks"])
        evaluation = data.get("evaluation", "inline")  # absent from plans saved before it existed
        if evaluation not in EVALUATION_PLACES:
            raise PlanError(f"The plan file's \"evaluation\" is {evaluation!r}; set it to one of "
                            f"{', '.join(EVALUATION_PLACES)}, or re-run `jaxrose tune` to make a new plan.")
        return Plan(data["program"], chunks, data["num_groups"], tuple(tuple(q) for q in data["quotas"]),
                    tuple(data["history"]), evaluation)

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            f.write(self.to_json())

    @staticmethod
    def load(path: str) -> "Plan":
        with open(path) as f:
            return Plan.from_json(f.read())

    def __str__(self) -> str:
        lines = [f"Plan for {self.program!r}: {len(self.chunks)} chunks, {len(self.processes)} processes, "
                 f"{self.num_groups or 'configured'} env groups"]
        quotas = dict(self.quotas)
        for chunk in self.chunks:
            quota = quotas.get(chunk.process)
            where = "+".join(chunk.group_processes) + " (groups spread)" if chunk.group_processes else chunk.process
            lines.append(f"  {chunk.name:24s} process={where}"
                         f"{f' ({quota}% SMs)' if quota else ''}{' deferred' if chunk.deferred else ''}: "
                         f"{' → '.join(chunk.nodes)}"
                         f"{' (unrolled: ' + ', '.join(chunk.unrolled) + ')' if chunk.unrolled else ''}")
        if self.evaluation != "inline":
            lines.append("  evaluation: in its own process")
        if self.history:
            lines.append("  transformations: " + "; ".join(self.history))
        return "\n".join(lines)


def top_level_names(program: Program) -> list[str]:
    return [node.name for node in program.body]


def stages_of(program: Program, node_names) -> list[str]:
    """Stage names inside the given top-level nodes."""
    wanted = set(node_names)
    result = []
    for node in program.body:
        if node.name in wanted:
            result.extend(s.name for s, _ in Program("", (node,)).stages())
    return result


def sequential_plan(program: Program) -> Plan:
    """The reference: the whole iteration as one chunk in one process."""
    return Plan(program.name, (Chunk("iteration", tuple(top_level_names(program))),))


def validate(plan: Plan, program: Program, graph: DataflowGraph) -> None:
    """Every top-level node in exactly one chunk, in program order; deferred chunks legal."""
    order = [n for chunk in plan.chunks for n in chunk.nodes]
    if order != top_level_names(program):
        raise PlanError(f"Plan chunks must cover the program's nodes once each, in order: expected "
                        f"{top_level_names(program)}, got {order}.")
    for chunk in plan.chunks:
        for loop in chunk.unrolled:  # a typo in a plan file would otherwise run the loop rolled, silently
            if all(_find_loop(program_node(program, n), loop) is None for n in chunk.nodes):
                raise PlanError(f"Chunk {chunk.name!r} unrolls loop {loop!r}, which it does not contain; its "
                                f"loops: {', '.join(_loop_names(program, chunk.nodes)) or 'none'}.")
        if chunk.deferred:
            _check_deferrable(plan, program, graph, chunk)
        if chunk.group_processes:
            _check_spreadable(plan, program, graph, chunk)


# -- transformations --------------------------------------------------------------------------------


def split_chunk(plan: Plan, chunk_name: str, before: str) -> Plan:
    """Cuts a chunk in two before one of its nodes (legal: order and data flow are unchanged)."""
    chunk = plan.chunk(chunk_name)
    if before not in chunk.nodes[1:]:
        raise PlanError(f"Cannot split chunk {chunk_name!r} before {before!r}: it must be one of "
                        f"{list(chunk.nodes[1:])}.")
    i = chunk.nodes.index(before)
    first = dataclasses.replace(chunk, nodes=chunk.nodes[:i])
    second = dataclasses.replace(chunk, name=before, nodes=chunk.nodes[i:])
    chunks = _replace_chunk(plan.chunks, chunk_name, (first, second))
    return dataclasses.replace(plan, chunks=chunks, history=plan.history + (f"split {chunk_name} before {before}",))


def fuse_chunks(plan: Plan, first: str, second: str) -> Plan:
    """Merges two consecutive chunks of one process into one jitted call (fewer dispatches)."""
    a, b = plan.chunk(first), plan.chunk(second)
    names = [c.name for c in plan.chunks]
    if names.index(second) != names.index(first) + 1:
        raise PlanError(f"Only consecutive chunks fuse: {first!r} and {second!r} are not neighbours.")
    if a.process != b.process or a.deferred != b.deferred:
        raise PlanError(f"Chunks {first!r} and {second!r} run in different processes or iterations; "
                        f"place them together before fusing.")
    fused = dataclasses.replace(a, nodes=a.nodes + b.nodes, unrolled=a.unrolled + b.unrolled)
    chunks = tuple(c for c in _replace_chunk(plan.chunks, first, (fused,)) if c.name != second)
    return dataclasses.replace(plan, chunks=chunks, history=plan.history + (f"fuse {first}+{second}",))


def split_groups(plan: Plan, num_groups: int, num_envs: int) -> Plan:
    """Lays the envs out as `num_groups` groups (vmapped); legal when the groups are equal."""
    if num_groups < 1 or num_envs % num_groups:
        raise PlanError(f"Cannot split {num_envs} envs into {num_groups} equal groups; choose a divisor of "
                        f"env.num_envs.")
    return dataclasses.replace(plan, num_groups=num_groups, history=plan.history + (f"groups={num_groups}",))


def place(plan: Plan, chunk_name: str, process: str, sm_percentage: Optional[int] = None) -> Plan:
    """Runs a chunk in another process (with an SM quota under MPS). Order and data flow are kept;
    what crosses processes is carried by the transport."""
    if sm_percentage is not None and not 1 <= sm_percentage <= 100:
        raise PlanError(f"An SM quota is a percentage in [1, 100], got {sm_percentage}.")
    chunk = dataclasses.replace(plan.chunk(chunk_name), process=process)
    quotas = dict(plan.quotas)
    quotas[process] = sm_percentage if sm_percentage is not None else quotas.get(process)
    return dataclasses.replace(plan, chunks=_replace_chunk(plan.chunks, chunk_name, (chunk,)),
                               quotas=tuple(quotas.items()),
                               history=plan.history + (f"place {chunk_name} on {process}",))


GROUP_LOCAL_COMPONENTS = frozenset({"policy", "env", "rng"})
GROUP_RESIDENT_STATE = "env_state"  # laid out by group; stays in the process that steps those groups


def spread_groups(plan: Plan, program: Program, graph: DataflowGraph, chunk_name: str,
                  processes: tuple[str, ...], sm_percentage: Optional[int] = None) -> Plan:
    """Spreads the env groups over `processes`: each runs `chunk_name` (the rollout: inference and
    simulation) for its share of the groups, all at once, so under MPS one group's inference
    overlaps another's simulation. Parameters go out once per iteration and each process's unrolls
    come back once; each group's env state stays in its process.

    Legal when the chunk opens the iteration, every stage in it is group-local (components
    policy, env, rng, or a stage declared `group_local`: no reduction across groups; group-local
    batch preparation thus moves next to its groups' rollout), the groups divide evenly, and no stage outside the
    chunk reads the env state (it never leaves the group processes during training).
    """
    if sm_percentage is not None and not 1 <= sm_percentage <= 100:
        raise PlanError(f"An SM quota is a percentage in [1, 100], got {sm_percentage}.")
    processes = tuple(processes)
    spread = dataclasses.replace(plan.chunk(chunk_name), process=processes[0] if processes else "main",
                                 group_processes=processes)
    quotas = dict(plan.quotas)
    for process in processes:
        quotas[process] = sm_percentage if sm_percentage is not None else quotas.get(process)
    new = dataclasses.replace(plan, chunks=_replace_chunk(plan.chunks, chunk_name, (spread,)),
                              quotas=tuple(quotas.items()),
                              history=plan.history + (f"spread {chunk_name} over {len(processes)} group processes",))
    _check_spreadable(new, program, graph, spread)
    return new


def spread_rollout(plan: Plan, program: Program, graph: DataflowGraph, processes: tuple[str, ...],
                   num_envs: int, groups_per_process: int = 1) -> Plan:
    """The usual group spread in one call: lay the envs out as groups (one or more per process), cut
    the first chunk after its group-local prefix (the rollout), and spread that over `processes`."""
    local = {node.name: all(_is_group_local(graph.node(s)) for s in stages_of(program, [node.name]))
             for node in program.body}
    first = plan.chunks[0]
    prefix = 0
    while prefix < len(first.nodes) and local[first.nodes[prefix]]:
        prefix += 1
    if prefix == 0:
        raise PlanError(f"Chunk {first.name!r} opens with {first.nodes[0]!r}, which is not group-local: nothing to spread.")
    if prefix < len(first.nodes):
        plan = split_chunk(plan, first.name, first.nodes[prefix])
    plan = split_groups(plan, len(processes) * groups_per_process, num_envs)
    return spread_groups(plan, program, graph, plan.chunks[0].name, processes)


def _is_group_local(node) -> bool:
    return node.component in GROUP_LOCAL_COMPONENTS or node.group_local


def _check_spreadable(plan: Plan, program: Program, graph: DataflowGraph, chunk: Chunk) -> None:
    processes = chunk.group_processes
    if len(processes) < 2 or len(set(processes)) != len(processes) or "main" in processes:
        raise PlanError(f"Spreading groups needs two or more distinct processes other than 'main', got {processes}.")
    if plan.num_groups is None or plan.num_groups % len(processes):
        raise PlanError(f"Cannot spread {plan.num_groups or 'the configured'} env groups evenly over "
                        f"{len(processes)} processes; split the envs into a multiple of {len(processes)} groups "
                        f"first (split_groups).")
    if plan.chunks[0].name != chunk.name or chunk.deferred or sum(bool(c.group_processes) for c in plan.chunks) > 1:
        raise PlanError(f"Only the one chunk that opens the iteration can spread its groups; {chunk.name!r} does not.")
    inside = set(stages_of(program, chunk.nodes))
    for node in graph.nodes:
        if node.name in inside and not _is_group_local(node):
            raise PlanError(f"Stage {node.name!r} ({node.component}) in chunk {chunk.name!r} is not group-local "
                            f"(only {', '.join(sorted(GROUP_LOCAL_COMPONENTS))} stages and stages declared "
                            f"`group_local=True` are); split the chunk before it.")
        if node.name not in inside and GROUP_RESIDENT_STATE in node.reads:
            raise PlanError(f"Stage {node.name!r} outside chunk {chunk.name!r} reads {GROUP_RESIDENT_STATE!r}, which "
                            f"stays in the group processes once the groups are spread.")
    if any(c.process in processes for c in plan.chunks if c is not chunk and c.name != chunk.name):
        raise PlanError(f"Group processes {processes} run only the spread chunk; place other chunks elsewhere.")


def with_quota(plan: Plan, process: str, sm_percentage: Optional[int]) -> Plan:
    """Caps a process at `sm_percentage` of the SMs under MPS (None: no cap). Always legal: a quota
    changes how fast a process runs, not what it computes."""
    if process not in plan.processes:
        raise PlanError(f"No process {process!r} in the plan; processes: {', '.join(plan.processes)}.")
    if sm_percentage is not None and not 1 <= sm_percentage <= 100:
        raise PlanError(f"An SM quota is a percentage in [1, 100], got {sm_percentage}.")
    quotas = dict(plan.quotas)
    quotas[process] = sm_percentage
    return dataclasses.replace(plan, quotas=tuple(quotas.items()),
                               history=plan.history + (f"quota {sm_percentage}% for {process}",))


def evaluate_in_process(plan: Plan) -> Plan:
    """The periodic evaluation in its own process beside training. Always legal: evaluation reads a copy
    of the parameters and writes nothing the iteration reads."""
    if plan.evaluation == "process":
        raise PlanError("The plan already evaluates in its own process.")
    return dataclasses.replace(plan, evaluation="process", history=plan.history + ("evaluation in its own process",))


def defer(plan: Plan, program: Program, graph: DataflowGraph, chunk_name: str) -> Plan:
    """Lets a chunk of iteration k run during iteration k+1 (off the critical path).

    Legal only when nothing in a later iteration reads what the chunk writes (it is off the critical
    path: evaluation, logging, checkpoints); this refuses e.g. overlapping training k with rollout k+1.
    """
    chunk = dataclasses.replace(plan.chunk(chunk_name), deferred=True)
    new = dataclasses.replace(plan, chunks=_replace_chunk(plan.chunks, chunk_name, (chunk,)),
                              history=plan.history + (f"defer {chunk_name}",))
    _check_deferrable(new, program, graph, chunk)
    return new


def _check_deferrable(plan: Plan, program: Program, graph: DataflowGraph, chunk: Chunk) -> None:
    names = [c.name for c in plan.chunks]
    later = [c for c in plan.chunks[names.index(chunk.name):]]
    if any(not c.deferred for c in later):
        blocking = next(c.name for c in later if not c.deferred)
        raise PlanError(f"Chunk {chunk.name!r} cannot be deferred while chunk {blocking!r} after it is not: "
                        f"{blocking!r} would have to wait for it anyway. Defer a tail of the iteration.")
    stages = set(stages_of(program, chunk.nodes))
    for edge in graph.iteration_carried():
        if edge.src in stages:
            raise PlanError(f"Deferring {chunk.name!r} would break synchronous semantics: stage {edge.src!r} "
                            f"writes {edge.name!r}, which {edge.dst!r} reads in the next iteration.")


def _replace_chunk(chunks, name, replacement) -> tuple[Chunk, ...]:
    out = []
    for chunk in chunks:
        out.extend(replacement if chunk.name == name else (chunk,))
    return tuple(out)


def unroll_loop(plan: Plan, program: Program, loop_name: str) -> Plan:
    """Runs loop `loop_name` as straight-line code (`lax.scan` fully unrolled): a loop nested in
    another leaves one device loop instead of two. Same computation, longer compile; on a GPU,
    entering a device loop has a cost of its own, which only a measurement can weigh."""
    for chunk in plan.chunks:
        for node in (program_node(program, n) for n in chunk.nodes):
            loop = _find_loop(node, loop_name)
            if loop is None:
                continue
            if loop.length is None:
                raise PlanError(f"Loop {loop_name!r} iterates over data (no static length): only a loop with a "
                                f"`length` unrolls.")
            if loop_name in chunk.unrolled:
                raise PlanError(f"Loop {loop_name!r} is unrolled already.")
            unrolled = dataclasses.replace(chunk, unrolled=chunk.unrolled + (loop_name,))
            return dataclasses.replace(plan, chunks=_replace_chunk(plan.chunks, chunk.name, (unrolled,)),
                                       history=plan.history + (f"unroll loop {loop_name}",))
    raise PlanError(f"No loop named {loop_name!r} in program {program.name!r}.")


def program_node(program: Program, name: str):
    return next(node for node in program.body if node.name == name)


def _loop_names(program: Program, node_names) -> list[str]:
    def names(node) -> list[str]:
        return [node.name, *(n for child in node.body for n in names(child))] if isinstance(node, Loop) else []
    return [n for name in node_names for n in names(program_node(program, name))]


def _find_loop(node, name: str):
    if not isinstance(node, Loop):
        return None
    if node.name == name:
        return node
    return next((found for child in node.body if (found := _find_loop(child, name)) is not None), None)


def with_unrolled_loops(nodes, names) -> tuple:
    """`nodes` with every loop named in `names` (at any depth) fully unrolled."""
    def rebuild(node):
        if not isinstance(node, Loop):
            return node
        body = tuple(rebuild(child) for child in node.body)
        unroll = node.length if node.name in names else node.unroll
        return dataclasses.replace(node, body=body, unroll=unroll)

    return tuple(rebuild(node) for node in nodes) if names else tuple(nodes)


def chunk_program(program: Program, chunk: Chunk) -> Program:
    nodes = {node.name: node for node in program.body}
    return Program(f"{program.name}/{chunk.name}", with_unrolled_loops([nodes[n] for n in chunk.nodes], chunk.unrolled))

