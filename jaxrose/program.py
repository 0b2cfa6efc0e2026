"""The programmable interface: an RL iteration as stages with named reads and writes, in loops.

A `Stage` is a pure function of the state names it reads, returning the names it writes, tagged
with the component that runs it (`policy`, `env`, `learner`, or any user name). A `Loop` repeats a
body of stages and loops: `length` times, or once per leading slice of the arrays named in `over`;
per-step values named in `collect` are stacked after the loop. A `Program` is the iteration's body.

The same `Program` is what the sequential executor runs (`run_program`, one `lax.scan` per loop),
what the dataflow graph is built from (`jaxrose.graph`), and what the planner transforms.

    Program("ppo", (
        Stage("policy", policy_fn, reads=("params", "obs"), writes=("action",), component="policy"),
        ...,
        Loop("epoch", length=4, body=(...)),
    ))
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Union

import jax


class ProgramError(ValueError):
    """A program is malformed: the message names the stage and the state it reads or writes."""


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    fn: Callable[..., Mapping[str, Any]]
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    component: str = "user"
    group_local: bool = False
    """The author's statement that the stage never combines env groups (each group's outputs come
    from that group's inputs alone, shapes polymorphic in the group count): such a stage may run
    next to its groups' rollout in a group process (`jaxrose.plan.spread_groups`)."""

    def __call__(self, state: Mapping[str, Any]) -> dict[str, Any]:
        outputs = self.fn(**{name: state[name] for name in self.reads})
        if set(outputs) != set(self.writes):
            raise ProgramError(f"Stage {self.name!r} declares writes {sorted(self.writes)} but returned "
                               f"{sorted(outputs)}; make its function return exactly what it declares.")
        return dict(outputs)


@dataclasses.dataclass(frozen=True)
class Loop:
    name: str
    body: tuple["Node", ...]
    length: Optional[int] = None
    over: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """{per-step name: stacked name}: step t reads stacked[t] under the per-step name."""
    collect: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """{stacked name: per-step name}: each step's value is stacked into stacked name after the loop."""
    unroll: int = 1
    """Steps per device-loop iteration (`lax.scan`'s unroll); the loop's length turns it into
    straight-line code with no device loop at all. Same computation; a longer compile."""

    def __post_init__(self):
        if self.length is None and not self.over:
            raise ProgramError(f"Loop {self.name!r} needs a length or names to iterate `over`.")
        if self.length is not None and self.length < 1:
            raise ProgramError(f"Loop {self.name!r} has length {self.length}; it must be >= 1.")
        if self.unroll < 1:
            raise ProgramError(f"Loop {self.name!r} has unroll {self.unroll}; it must be >= 1.")


Node = Union[Stage, Loop]


@dataclasses.dataclass(frozen=True)
class Program:
    name: str
    body: tuple[Node, ...]

    def stages(self) -> list[tuple[Stage, tuple[str, ...]]]:
        """Every stage with the path of loops that encloses it, in program order."""
        return list(_walk(self.body, ()))

    def validate(self, inputs: set[str]) -> None:
        """Checks that every read is defined by an input, an earlier write, or the loop that carries it."""
        _check(self.body, set(inputs), "the iteration")


def _walk(nodes, path):
    for node in nodes:
        if isinstance(node, Stage):
            yield node, path
        else:
            yield from _walk(node.body, path + (node.name,))


def writes_of(nodes) -> set[str]:
    """Every name the nodes may write, step-local names of inner loops included."""
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, Stage):
            names.update(node.writes)
        else:
            names.update(writes_of(node.body))
            names.update(node.collect)
    return names


def _check(nodes, defined: set[str], where: str) -> set[str]:
    for node in nodes:
        if isinstance(node, Stage):
            missing = [name for name in node.reads if name not in defined]
            if missing:
                raise ProgramError(f"Stage {node.name!r} in {where} reads {missing} before anything writes "
                                   f"{'it' if len(missing) == 1 else 'them'}; write it in an earlier stage or pass "
                                   f"it as an input of the program.")
            defined |= set(node.writes)
        else:
            inner = defined | set(node.over)
            _check(node.body, set(inner), f"loop {node.name!r}")
            produced = writes_of(node.body)
            missing = [per_step for per_step in node.collect.values() if per_step not in produced]
            if missing:
                raise ProgramError(f"Loop {node.name!r} collects {missing}, which no stage in its body writes.")
            missing = [stacked for stacked in node.over.values() if stacked not in defined]
            if missing:
                raise ProgramError(f"Loop {node.name!r} iterates over {missing}, which nothing writes before it.")
            # A loop's outputs: what it carries (names defined before it) and what it stacks.
            defined |= (produced & defined) | set(node.collect)
    return defined


def run_program(program: Program, state: Mapping[str, Any]) -> dict[str, Any]:
    """Runs the program as written: stages in order, each loop one `lax.scan`. Pure and jittable."""
    return _run(program.body, dict(state))


def _run(nodes, state: dict) -> dict:
    for node in nodes:
        state.update(node(state) if isinstance(node, Stage) else _run_loop(node, state))
    return state


def _run_loop(loop: Loop, state: dict) -> dict:
    # Loop-carried: what the body writes and existed before the loop; the rest of the body's writes
    # are step-local, and names the body only reads are closed over.
    carried = sorted(n for n in writes_of(loop.body) if n in state and n not in loop.over)
    constants = {k: v for k, v in state.items() if k not in carried}
    xs = {per: state[stacked] for per, stacked in loop.over.items()}

    def body(carry, x):
        s = _run(loop.body, {**constants, **carry, **(x or {})})
        return {n: s[n] for n in carried}, {per: s[per] for per in loop.collect.values()}

    carry, ys = jax.lax.scan(body, {n: state[n] for n in carried}, xs or None, length=loop.length,
                             unroll=loop.unroll)
    return {**carry, **{stacked: ys[per] for stacked, per in loop.collect.items()}}
