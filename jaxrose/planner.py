"""Window-guided planning: from a stage profile, model a plan's timeline, find low-activity GPU
windows, and rank the legal transformations by the gain the model predicts for them.

The model is deliberately simple and stated: a chunk lasts the sum of its stages' measured times
plus one dispatch cost; chunks in one process run one after another; chunks in different
processes overlap when their dependencies allow, and the modelled SM activity of overlapping
chunks adds up (capped at 100%) without slowing them. It is optimistic under contention, which is
why the keep-or-drop decision belongs to an end-to-end measurement (the autotuner).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from jaxrose.graph import ITERATION, DataflowGraph
from jaxrose.plan import Plan, PlanError, defer, fuse_chunks, place, split_chunk, stages_of
from jaxrose.program import Program


@dataclasses.dataclass(frozen=True)
class StageProfile:
    seconds: float
    sm_activity: float  # percent of the GPU's SMs busy while the stage runs alone


@dataclasses.dataclass(frozen=True)
class Profile:
    stages: dict[str, StageProfile]
    dispatch_seconds: float = 5e-5
    source: str = "modelled"


@dataclasses.dataclass(frozen=True)
class Interval:
    chunk: str
    iteration: int
    process: str
    start: float
    end: float
    sm_activity: float
    component: str


@dataclasses.dataclass(frozen=True)
class Schedule:
    intervals: tuple[Interval, ...]
    iterations: int
    stage_intervals: tuple[Interval, ...] = ()
    """Each chunk's stages laid out one after another inside it (`chunk` holds the stage name)."""

    @property
    def makespan(self) -> float:
        return max(i.end for i in self.intervals)

    def iteration_seconds(self) -> float:
        """Steady time per iteration: the spacing between the ends of the last two iterations."""
        ends = {}
        for i in self.intervals:
            ends[i.iteration] = max(ends.get(i.iteration, 0.0), i.end)
        k = self.iterations - 1
        return ends[k] - ends[k - 1] if k >= 1 else ends[0]

    def activity(self, t: float) -> float:
        """Modelled SM activity at time t, from the stages running then (summed, capped at 100%)."""
        return min(100.0, sum(i.sm_activity for i in (self.stage_intervals or self.intervals) if i.start <= t < i.end))

    def windows(self, threshold: float, min_seconds: float = 0.0) -> list[tuple[float, float, float]]:
        """Spans of the last iteration whose modelled SM activity is below `threshold`: (start, end, mean)."""
        pieces = self.stage_intervals or self.intervals
        cuts = sorted({i.start for i in pieces} | {i.end for i in pieces})
        last = [i for i in self.intervals if i.iteration == self.iterations - 1]
        t0, t1 = min(i.start for i in last), max(i.end for i in last)
        found, current = [], None
        for a, b in zip(cuts, cuts[1:]):
            if b <= t0 or a >= t1:
                continue
            level = self.activity((a + b) / 2)
            if level < threshold:
                current = (current[0], b, current[2] + level * (b - a)) if current else (a, b, level * (b - a))
            elif current:
                found.append(current)
                current = None
        if current:
            found.append(current)
        return [(a, b, area / (b - a)) for a, b, area in found if b - a >= min_seconds]


def pieces(program: Program, chunk_nodes, profile: Profile) -> list[tuple[str, StageProfile, str]]:
    """What a chunk is made of, as the profile knows it: (name, cost, component) per stage, or per
    top-level node where the profile measured the node as a whole (a loop timed end to end)."""
    components = {s.name: s.component for s, _ in program.stages()}
    out = []
    for node in chunk_nodes:
        inner = stages_of(program, (node,))
        if node in profile.stages:
            kinds = [components[s] for s in inner]
            out.append((node, profile.stages[node], "env" if "env" in kinds else kinds[0]))
        else:
            out.extend((s, profile.stages[s], components[s]) for s in inner)
    return out


def chunk_cost(program: Program, chunk_nodes, profile: Profile) -> tuple[float, float, str]:
    parts = pieces(program, chunk_nodes, profile)
    seconds = sum(cost.seconds for _, cost, _ in parts) + profile.dispatch_seconds
    busy = sum(cost.seconds * cost.sm_activity for _, cost, _ in parts)
    by_component: dict[str, float] = {}
    for _, cost, component in parts:
        by_component[component] = by_component.get(component, 0.0) + cost.seconds
    return seconds, busy / max(seconds, 1e-12), max(by_component, key=by_component.get)


def simulate(plan: Plan, program: Program, graph: DataflowGraph, profile: Profile, iterations: int = 4) -> Schedule:
    """List-schedules `iterations` iterations of the plan under the model above."""
    chunk_of = {stage: c.name for c in plan.chunks for stage in stages_of(program, c.nodes)}
    deps: dict[str, set[tuple[str, int]]] = {c.name: set() for c in plan.chunks}
    for edge in graph.edges:
        src, dst = chunk_of[edge.src], chunk_of[edge.dst]
        if edge.carried_by == ITERATION:
            deps[dst].add((src, 1))
        elif edge.carried_by is None and src != dst:
            deps[dst].add((src, 0))
    costs = {c.name: chunk_cost(program, c.nodes, profile) for c in plan.chunks}
    end: dict[tuple[str, int], float] = {}
    process_free: dict[str, float] = {}
    intervals, stage_intervals = [], []
    # Per process, chunks run in plan order; a deferred chunk of iteration k queues after iteration
    # k+1's non-deferred chunks of its process.
    order = []
    for k in range(iterations + 1):
        order += [(c, k) for c in plan.chunks if not c.deferred and k < iterations]
        order += [(c, k - 1) for c in plan.chunks if c.deferred and k >= 1]
    for chunk, k in order:
        seconds, activity, component = costs[chunk.name]
        ready = max([end[(src, k - lag)] for src, lag in deps[chunk.name] if k - lag >= 0] or [0.0])
        start = max(ready, process_free.get(chunk.process, 0.0))
        end[(chunk.name, k)] = start + seconds
        process_free[chunk.process] = start + seconds
        intervals.append(Interval(chunk.name, k, chunk.process, start, start + seconds, activity, component))
        t = start + profile.dispatch_seconds
        for name, cost, component in pieces(program, chunk.nodes, profile):
            stage_intervals.append(Interval(name, k, chunk.process, t, t + cost.seconds, cost.sm_activity, component))
            t += cost.seconds
    return Schedule(tuple(intervals), iterations, tuple(stage_intervals))


@dataclasses.dataclass(frozen=True)
class Candidate:
    description: str
    plan: Plan
    predicted_seconds: float
    predicted_gain: float  # fraction of the current iteration time saved
    window: Optional[tuple[float, float, float]]


def candidate_transformations(plan: Plan, program: Program, graph: DataflowGraph) -> list[tuple[str, Plan]]:
    """Every single legal step from `plan`: split a chunk, fuse neighbours, or cut the iteration's
    tail from some node on into a chunk that runs on a helper process, overlapping the next iteration."""
    out: list[tuple[str, Plan]] = []

    def attempt(description: str, make: Callable[[], Plan]) -> None:
        try:
            out.append((description, make()))
        except PlanError:
            pass  # illegal here: not a candidate

    for chunk in plan.chunks:
        for node in chunk.nodes[1:]:
            attempt(f"split {chunk.name} before {node}", lambda c=chunk, n=node: split_chunk(plan, c.name, n))
    for a, b in zip(plan.chunks, plan.chunks[1:]):
        attempt(f"fuse {a.name}+{b.name}", lambda a=a, b=b: fuse_chunks(plan, a.name, b.name))
    last = plan.chunks[-1]
    if not last.deferred:
        for node in last.nodes:
            attempt(f"overlap {node}.. with the next iteration on a helper process",
                    lambda n=node: _overlap_tail(plan, program, graph, n))
    return out


def _overlap_tail(plan: Plan, program: Program, graph: DataflowGraph, node: str) -> Plan:
    last = plan.chunks[-1]
    if node != last.nodes[0]:
        plan = split_chunk(plan, last.name, node)
    return defer(place(plan, node if node != last.nodes[0] else last.name, "helper"), program, graph,
                 node if node != last.nodes[0] else last.name)


def rank(plan: Plan, program: Program, graph: DataflowGraph, profile: Profile, threshold: float = 50.0,
         iterations: int = 4) -> list[Candidate]:
    """Candidates ordered by predicted gain; an overlap is tagged with the low-activity window of the
    current plan that the moved work lands in."""
    base = simulate(plan, program, graph, profile, iterations)
    base_seconds = base.iteration_seconds()
    windows = base.windows(threshold)
    ranked = []
    for description, candidate in candidate_transformations(plan, program, graph):
        schedule = simulate(candidate, program, graph, profile, iterations)
        seconds = schedule.iteration_seconds()
        ranked.append(Candidate(description, candidate, seconds, 1.0 - seconds / base_seconds,
                                _window_filled(base, windows, schedule, candidate)))
    return sorted(ranked, key=lambda c: -c.predicted_gain)


def _window_filled(base: Schedule, windows, schedule: Schedule, candidate: Plan):
    """Deferred work starts beside the next iteration's first chunks: the base window it lands in is
    the one overlapping most with [start of the last iteration, + the deferred work's duration]."""
    deferred = {c.name for c in candidate.chunks if c.deferred}
    seconds = sum(i.end - i.start for i in schedule.intervals
                  if i.chunk in deferred and i.iteration == schedule.iterations - 2)
    if not seconds or not windows:
        return None
    t0 = min(i.start for i in base.intervals if i.iteration == base.iterations - 1)
    overlap = lambda w: max(0.0, min(w[1], t0 + seconds) - max(w[0], t0))
    best = max(windows, key=overlap)
    return best if overlap(best) > 0 else None


def draw_timeline(schedule: Schedule, path: str, title: str = "", measured: Optional[list] = None) -> str:
    """A Gantt chart per process (bars coloured by component) with the SM activity beneath: the
    modelled curve, and the measured one when `measured` [(t, activity %), ...] is given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    processes = list(dict.fromkeys(i.process for i in schedule.intervals))
    colours = {"policy": "tab:orange", "env": "tab:blue", "learner": "tab:green", "rng": "tab:gray",
               "logging": "tab:purple", "eval": "tab:red"}
    fig, (gantt, activity) = plt.subplots(2, 1, figsize=(10, 1.2 + 0.6 * len(processes) + 2), sharex=True,
                                          gridspec_kw={"height_ratios": [max(1, len(processes)), 2]})
    for row, process in enumerate(processes):
        for i in (i for i in schedule.stage_intervals if i.process == process):
            gantt.barh(row, i.end - i.start, left=i.start, color=colours.get(i.component, "tab:cyan"), height=0.6)
        for i in (i for i in schedule.intervals if i.process == process):
            gantt.barh(row, i.end - i.start, left=i.start, fill=False, edgecolor="black", linewidth=0.6, height=0.7)
            gantt.text(i.start, row - 0.42, f"{i.chunk}[{i.iteration}]", ha="left", va="bottom", fontsize=6)
    gantt.set_yticks(range(len(processes)), processes)
    gantt.invert_yaxis()
    gantt.set_title(title)
    pieces = schedule.stage_intervals or schedule.intervals
    cuts = sorted({i.start for i in pieces} | {i.end for i in pieces})
    activity.step(cuts, [schedule.activity(t) for t in cuts], where="post", label="modelled SM activity")
    if measured:
        activity.plot([t for t, _ in measured], [a for _, a in measured], lw=0.8, label="measured (NVML GPM)")
    activity.set_ylim(0, 105)
    activity.set_ylabel("SM activity %")
    activity.set_xlabel("seconds")
    activity.legend(loc="upper right", fontsize=7)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    gantt.legend(handles, list(colours), fontsize=7, loc="upper right", ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
