"""The asynchronous mode's resource manager: SM quotas, CPU cores and batch sizes of the actors
and the learner.

Two halves. `decide` is the policy, a pure function of one interval's measurements: when the
learner starves (waits for trajectories), the slowest actor gets one SM level more and a core;
when trajectories queue up, the fastest actor gives one level up (freeing SMs for the learner,
which is the controller process and stays uncapped) and a core to the learner. A signal must
persist for `patience` intervals, and after a change `cooldown` intervals pass unmeasured before
signals count again, so a noisy measurement or a change's transient does not make quotas flap.
`ResourceManager` is the mechanism: it measures, calls `decide`, pins cores with
`os.sched_setaffinity`, and has the trainer restart an actor whose quota changed (an MPS quota is
fixed for a process's life): by default warm, the new process starting and compiling its rollout
beside the old one, which rolls out until they switch (`run.resources.warm_restarts`). Every
decision, with the measurements behind it, goes to a JSONL log and to the run's result. Without
MPS a quota cannot take effect: the actor is still restarted (the same path) and the log says the
quota was not applied.

Batch sizes (`run.resources.group_levels`). An actor's batch is the number of env groups it steps;
each trajectory it sends holds them all. By default (`run.resources.grow_keeps='update_size'`) the
learner learns a grown trajectory as consecutive updates of the starting batch, each with its own
proximal policy, so PPO's progress per env step is kept; the later pieces are older data, and a
piece that would pass the lag bound is dropped (the config asks for a bound that makes that rare).
Every level's programs compile ahead (`jaxrose.precompile`), and an actor moves only to a level
compiled in it (and, unless every update is on the starting batch, in the learner), so a change
costs no compile stall.
The batch is the first lever when the signal concerns all actors alike: starving with no straggler
(the actors together produce too little) grows the smallest batch, the most efficient per group
first, one level, where the device may have room for more envs at the same quota; a backlog
shrinks the largest batch (less to learn per update, fresher data). A growth is on probation: if
the env groups the learner learned per second did not rise `grow_gain` times, the device (or the
learner) had no room, so it is undone and that size becomes the actor's ceiling. The verdict is on
what the learner learns, not on the actor's rollout rate: the growth's reference interval is one
where the learner starved, idle beside the actor, and a grown batch busies it, slowing the rollout
it shares the GPU with (session 36, H100: a growth from 2 to 4 groups was undone as 5.25 -> 5.09
groups/s of rollout, its reference taken beside an idle learner; beside a busy one 2 groups ran at
4.0-4.3 groups/s). Stragglers, and batches at
their limits, are left to the quotas and cores. With `grow_keeps='update_size'` a grown batch is
older data (a g-group trajectory is g / u updates): `run.resources.lag_target` prices it, growing a
batch only where the lag predicted from the measured one stays within the target and shrinking the
largest batch while the measured mean lag is above it (a `stale` signal, ahead of the others, since
the learner's wait cannot tell what staleness costs in return). Without a target the lag is not a
signal, and a binding bound shows as the learner waiting, i.e. starving. The trainer sends a new
size with the actor's next parameters; new groups' envs are reset from a key folded from the actor
and the update (`AsyncTrainer.resize_actor`); the log gets the decision and a `resize` record when
it is sent.

Rollout times come from the actors' own clocks (the learner's delays in reading a trajectory are
not the actor's speed); an actor's first rollout after a start, restart or resize compiles and is
left out. An interval that began while a process still compiled other batch sizes ahead is a
transient: the compile threads take the CPU and the actor's loop (on the H100 the actor idled up to
2.1 s between rollouts), so the learner starved on the compiles, not on the actors' pace, and a
growth taken on that signal (session 36) priced its lag from that transient too. Such an interval
counts only as a `stale` signal: the idle actor's data is fresher than the steady run's, so a mean
lag above the target then is above it in the steady run too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import time
from typing import Optional

from jaxrose.config import ResourceConfig


@dataclasses.dataclass(frozen=True)
class Measurements:
    """One interval of runtime feedback."""

    rollout_seconds: tuple[float, ...]
    """Per actor: mean seconds a rollout took, on the actor's clock from parameters in to trajectory
    ready to send (the learner's own delays excluded; nan: none finished). An actor's first rollout
    after a start, restart or resize compiles and is left out."""
    learner_wait_fraction: float
    """Share of the interval the learner waited for trajectories."""
    queue_depth: float
    """Mean trajectories already waiting when the learner became free for its next step (a depth
    counted after the learner had waited for its trajectory was 1 at every step with one actor, a
    backlog signal whatever the pace; it restarted the H200 actor twice in a run, BENCHMARKS.md,
    2026-12-04)."""
    updates_per_second: float
    lag_mean: float
    lag_max: int
    compiled_levels: tuple[tuple[int, ...], ...] = ()
    """Per actor, the batch sizes it may move to now: those whose programs (its rollout and resize,
    the learner's update) are compiled (`jaxrose.precompile`), so a change stalls nothing. Empty:
    every level."""
    groups_per_second: float = float("nan")
    """Env groups the learner learned per second (pieces dropped at the lag bound not counted): what
    a growth's verdict compares."""
    settled: bool = True
    """False where the interval began while a process still compiled batch sizes ahead: its
    measurements are that transient's, not the run's, and count only as a `stale` signal."""


@dataclasses.dataclass(frozen=True)
class Allocation:
    sm_quotas: tuple[int, ...]
    """Per actor, an SM percentage from the configured levels."""
    actor_cores: tuple[tuple[int, ...], ...]
    learner_cores: tuple[int, ...]
    groups: tuple[int, ...] = ()
    """Per actor, the env groups it steps (its batch size); empty where batch sizes are not managed."""


@dataclasses.dataclass(frozen=True)
class PolicyState:
    """What `decide` remembers between intervals: how long each signal has lasted, the cooldown,
    a grown batch waiting for its throughput to be judged, and the batch sizes found to be ceilings."""

    streaks: tuple[tuple[str, int], ...] = ()
    cooldown: int = 0
    trial: Optional[tuple[int, int, float]] = None
    """(actor, its groups before growing, the env groups the learner learned per second then)."""
    ceilings: tuple[tuple[int, int], ...] = ()
    """(actor, groups): a growth beyond that size gained nothing, so the actor grows no further."""


def initial_allocation(config: ResourceConfig, num_actors: int, cores: list[int]) -> Allocation:
    """Actors at the highest level that fits the pool evenly; `learner_cores` cores to the learner
    and the rest dealt to the actors (shared round-robin where there are fewer cores than actors)."""
    fitting = [v for v in config.sm_levels if v * num_actors <= config.sm_pool]
    quota = fitting[-1] if fitting else config.sm_levels[0]
    cores = sorted(cores)
    learner = tuple(cores[:min(config.learner_cores, max(len(cores) - 1, 1))])
    rest = cores[len(learner):] or list(learner)
    per_actor = [tuple(c for j, c in enumerate(rest) if j % num_actors == i) or (rest[i % len(rest)],)
                 for i in range(num_actors)]
    return Allocation((quota,) * num_actors, tuple(per_actor), learner)


def _decision(process: str, kind: str, before, after, reason: str, signal: Optional[str], m: Measurements) -> dict:
    measured = {**dataclasses.asdict(m), "rollout_seconds": [s if s == s else None for s in m.rollout_seconds]}
    return {"process": process, "kind": kind, "before": before, "after": after, "reason": reason,
            "signal": signal, "measurements": measured}


def _level_above(levels: tuple[int, ...], groups: int) -> Optional[int]:
    return next((g for g in levels if g > groups), None)


def _level_below(levels: tuple[int, ...], groups: int) -> Optional[int]:
    return next((g for g in reversed(levels) if g < groups), None)


def _with_groups(allocation: Allocation, actor: int, size: int) -> Allocation:
    groups = tuple(size if i == actor else g for i, g in enumerate(allocation.groups))
    return dataclasses.replace(allocation, groups=groups)


def _judge_growth(m: Measurements, allocation: Allocation, state: PolicyState, config: ResourceConfig):
    """None if the batch on trial earned its keep; else what `decide` returns: wait for a
    measurement, or shrink it back and make the old size that actor's ceiling."""
    actor, before, throughput = state.trial
    now = m.groups_per_second
    if m.rollout_seconds[actor] != m.rollout_seconds[actor] or now != now:  # no rollout at the new size yet
        return allocation, dataclasses.replace(state, streaks=()), []  # judge the next interval
    size = allocation.groups[actor]
    if not now < config.grow_gain * throughput:  # a reference never measured (nan) cannot undo it
        return None
    reason = (f"the learner learned {throughput:.3g} env groups/s before actor{actor}'s batch grew from {before} to "
              f"{size} groups and {now:.3g} after, less than run.resources.grow_gain={config.grow_gain:g} times: "
              f"the device has no room for more envs, so it goes back to {before} and grows no further")
    ceilings = tuple(sorted({**dict(state.ceilings), actor: before}.items()))
    return (_with_groups(allocation, actor, before), PolicyState((), config.cooldown, None, ceilings),
            [_decision(f"actor{actor}", "groups", size, before, reason, "no_gain", m)])


def predicted_lag(lag_mean: float, groups: int, size: int) -> float:
    """The mean policy lag expected once a batch of `groups` groups, measured at `lag_mean`, steps
    `size`. With grow_keeps='update_size' (the only mode `lag_target` accepts) a g-group trajectory
    is learned as g / u updates and, one actor one rollout ahead, its pieces lag g/u to 2g/u - 1
    updates: lag + 1/2 grows with g."""
    return (lag_mean + 0.5) * size / groups - 0.5


def _stale(m: Measurements, allocation: Allocation, config: ResourceConfig) -> bool:
    """The measured mean lag is above `lag_target` and a batch could shrink to lower it."""
    return (config.lag_target is not None and m.lag_mean > config.lag_target and bool(allocation.groups)
            and any(_level_below(config.group_levels, g) is not None for g in allocation.groups))


def _batch_change(m: Measurements, allocation: Allocation, state: PolicyState, config: ResourceConfig,
                  starving: bool, straggler: bool, seconds: list[float], stale: bool
                  ) -> Optional[tuple[int, int, str]]:
    """(actor, new groups, reason) when a batch size is the lever to pull, else None. Starving with
    no straggler: the actors together are too slow, so the smallest measured batch that may grow
    (below the top level, the actor's ceiling and, with `lag_target`, the predicted lag) grows one
    level; the quotas are for stragglers. Backlog or stale data: the largest batch above the lowest
    level shrinks one level."""
    levels, groups = config.group_levels, allocation.groups
    if not (levels and groups):
        return None
    per_group = [s / g for s, g in zip(seconds, groups)]
    ready = lambda i, size: not m.compiled_levels or size in m.compiled_levels[i]  # noqa: E731
    fresh = lambda i, size: (config.lag_target is None  # noqa: E731
                             or predicted_lag(m.lag_mean, groups[i], size) <= config.lag_target)
    if starving and not straggler and not stale:
        caps = dict(state.ceilings)
        above = [_level_above(levels, g) for g in groups]
        growable = [i for i in range(len(groups))  # measured: the verdict needs its throughput before
                    if math.isfinite(seconds[i]) and above[i] is not None and above[i] <= caps.get(i, levels[-1])
                    and ready(i, above[i]) and fresh(i, above[i])]
        if not growable:
            return None
        actor = min(growable, key=lambda i: (groups[i], per_group[i]))
        size = above[actor]
        finished = [s for s in seconds if math.isfinite(s)]
        return actor, size, (f"learner waited {m.learner_wait_fraction:.0%} of the interval and no actor lags the "
                             f"others (rollouts {min(finished):.3g}-{max(finished):.3g} s): actor{actor}'s batch grows "
                             f"from {groups[actor]} to {size} groups, kept if its throughput rises")
    if starving and not stale:
        return None
    shrinkable = [i for i, g in enumerate(groups) if _level_below(levels, g) is not None
                  and ready(i, _level_below(levels, g))]
    if not shrinkable:
        return None
    actor = max(shrinkable, key=lambda i: (groups[i], per_group[i]))
    size = _level_below(levels, groups[actor])
    if stale:
        return actor, size, (f"the mean policy lag, {m.lag_mean:.3g} updates, is above run.resources.lag_target="
                             f"{config.lag_target:g}: actor{actor}'s batch shrinks from {groups[actor]} to {size} "
                             f"groups (fresher data)")
    return actor, size, (f"{m.queue_depth:.2g} trajectories waited on average for the learner: actor{actor}'s batch "
                         f"shrinks from {groups[actor]} to {size} groups (less to learn per update, fresher data)")


def decide(m: Measurements, allocation: Allocation, state: PolicyState, config: ResourceConfig
           ) -> tuple[Allocation, PolicyState, list[dict]]:
    """The next allocation, the policy's memory, and the decisions taken (each a dict with the
    process, what changed, why, and the measurements)."""
    rates = [s for s in m.rollout_seconds if s == s]  # nan: no rollout finished in the interval
    starving = m.learner_wait_fraction >= config.starve_fraction
    # Dead band: a queue counts only while the learner barely waits, so the two signals never both hold.
    backlog = (not starving and m.learner_wait_fraction < config.starve_fraction / 2
               and m.queue_depth >= config.queue_fraction * len(m.rollout_seconds))
    stale = _stale(m, allocation, config)
    signal = "stale" if stale else "starving" if starving else "backlog" if backlog else None
    # A compile-ahead's transient: the actor idles, so the learner's wait overstates its starving and the
    # lag understates the steady one; only a lag already above the target is safe to act on, and neither
    # a cooldown nor a growth's verdict is spent on it.
    if not m.settled and (not stale or state.cooldown > 0 or state.trial is not None):
        return allocation, dataclasses.replace(state, streaks=()), []
    if state.cooldown > 0:  # a change's effect is still settling: its measurements count for nothing
        return allocation, dataclasses.replace(state, streaks=(), cooldown=state.cooldown - 1), []
    if state.trial is not None:
        judged = _judge_growth(m, allocation, state, config)
        if judged is not None:
            return judged
        state = dataclasses.replace(state, trial=None)
    streaks = {signal: dict(state.streaks).get(signal, 0) + 1} if signal else {}
    if signal is None or streaks[signal] < config.patience or len(rates) < 1:
        return allocation, dataclasses.replace(state, streaks=tuple(streaks.items()), cooldown=0), []
    seconds = [s if s == s else float("inf") for s in m.rollout_seconds]  # none finished: slower than any
    slowest = max(range(len(seconds)), key=lambda i: seconds[i])
    fastest = min(range(len(seconds)), key=lambda i: seconds[i])
    others = [s for i, s in enumerate(seconds) if i != slowest] or seconds
    straggler = seconds[slowest] >= config.slow_ratio * statistics.median(others)
    batch = _batch_change(m, allocation, state, config, starving, straggler, seconds, stale)
    if stale and batch is None:  # the batch that would lower the lag is not compiled yet: wait for it
        return allocation, dataclasses.replace(state, streaks=tuple(streaks.items()), cooldown=0), []
    if batch is not None:  # one lever at a time, so that its effect can be measured
        actor, size, reason = batch
        before = allocation.groups[actor]
        trial = (actor, before, m.groups_per_second) if size > before else None
        return (_with_groups(allocation, actor, size), PolicyState((), config.cooldown, trial, state.ceilings),
                [_decision(f"actor{actor}", "groups", before, size, reason, signal, m)])
    decisions: list[dict] = []
    quotas, actor_cores, learner_cores = list(allocation.sm_quotas), list(allocation.actor_cores), allocation.learner_cores
    levels = config.sm_levels

    def record(process: str, kind: str, before, after, reason: str) -> None:
        decisions.append(_decision(process, kind, before, after, reason, signal, m))

    if starving:
        why = (f"learner waited {m.learner_wait_fraction:.0%} of the interval; actor{slowest}'s rollouts take "
               f"{seconds[slowest]:.3g} s" + (" (a straggler)" if straggler else ""))
        level = levels.index(quotas[slowest])
        if level + 1 < len(levels):
            raised = levels[level + 1]
            donor = fastest if fastest != slowest else None
            if sum(quotas) - quotas[slowest] + raised > config.sm_pool and donor is not None:
                lower = levels.index(quotas[donor])
                if lower > 0:
                    record(f"actor{donor}", "sm_quota", quotas[donor], levels[lower - 1], f"gives SMs to actor{slowest}")
                    quotas[donor] = levels[lower - 1]
            if sum(quotas) - quotas[slowest] + raised <= config.sm_pool:
                record(f"actor{slowest}", "sm_quota", quotas[slowest], raised, why)
                quotas[slowest] = raised
        if len(learner_cores) > 1 and learner_cores[-1] not in actor_cores[slowest]:
            moved = learner_cores[-1]
            record(f"actor{slowest}", "cores", list(actor_cores[slowest]), sorted({*actor_cores[slowest], moved}),
                   f"{why}; core {moved} from the learner")
            actor_cores[slowest] = tuple(sorted({*actor_cores[slowest], moved}))
            learner_cores = learner_cores[:-1]
    else:
        why = (f"{m.queue_depth:.2g} trajectories waited on average for the learner; actor{fastest} is the "
               f"fastest ({seconds[fastest]:.3g} s per rollout)")
        level = levels.index(quotas[fastest])
        if level > 0:
            record(f"actor{fastest}", "sm_quota", quotas[fastest], levels[level - 1], f"{why}: SMs to the learner")
            quotas[fastest] = levels[level - 1]
        if len(actor_cores[fastest]) > 1:
            moved = actor_cores[fastest][-1]
            if moved not in learner_cores:
                record("learner", "cores", list(learner_cores), sorted({*learner_cores, moved}),
                       f"{why}: core {moved} from actor{fastest}")
                learner_cores = tuple(sorted({*learner_cores, moved}))
                actor_cores[fastest] = actor_cores[fastest][:-1]
    new = Allocation(tuple(quotas), tuple(actor_cores), learner_cores, allocation.groups)
    return new, dataclasses.replace(state, streaks=(), cooldown=config.cooldown if decisions else 0), decisions


class ResourceManager:
    """Applies `decide` to a running `AsyncTrainer` (see the module doc)."""

    def __init__(self, config: ResourceConfig, num_actors: int, quota_env, log_path: Optional[str] = None,
                 cores: Optional[list[int]] = None):
        """`quota_env(name, quota)`: the environment for a worker at an SM quota, and whether MPS
        applies it (`mps.prepare_clients` gives it); `log_path`: the decisions' JSONL file."""
        self.config, self.num_actors, self._quota_env = config, num_actors, quota_env
        self._own_cores = sorted(os.sched_getaffinity(0))
        self.allocation = initial_allocation(config, num_actors, cores or self._own_cores)
        self.state = PolicyState()
        self.decisions: list[dict] = []
        self._log = open(log_path, "a") if log_path else None
        self._pending: dict[int, int] = {}  # actor -> SM quota waiting for its restart
        self._restarting: dict[int, int] = {}  # actor -> SM quota of the process starting for it
        self._pending_groups: dict[int, int] = {}  # actor -> batch size waiting for its next parameters
        self._warming: set[int] = set()  # actors whose next rollout compiles (new process or shape)
        self._resizing: set[int] = set()  # actors decided a new batch size, still rolling out the old one
        self._trainer = None
        self._reset_window(time.perf_counter())

    def actor_env(self, index: int) -> dict:
        return self._quota_env(f"actor{index}", self.allocation.sm_quotas[index])[0]

    def _reset_window(self, now: float) -> None:
        self._window_start, self._waited, self._groups_learned = now, 0.0, 0
        # An interval counts only if no process was compiling ahead when it began (see the module doc).
        self._window_settled = self._trainer is not None and not self._trainer.compiling_ahead()
        self._rollouts: dict[int, list[float]] = {i: [] for i in range(self.num_actors)}
        self._depths: list[int] = []
        self._lags: list[int] = []

    def start(self, trainer) -> None:
        self._trainer = trainer
        if self.config.group_levels:  # the actors' sizes, as started or restored from a checkpoint
            self.allocation = dataclasses.replace(self.allocation, groups=tuple(trainer.groups))
        self._warming = set(range(self.num_actors))  # first rollouts compile: not the actors' speed
        self._pin("learner", 0, self.allocation.learner_cores)
        for i, actor in enumerate(trainer.actors):
            self._pin(f"actor{i}", actor.process.pid, self.allocation.actor_cores[i])
        self._write({"process": "all", "kind": "initial", "after": dataclasses.asdict(self.allocation),
                     "reason": "start"})
        self._reset_window(time.perf_counter())

    def _pin(self, name: str, pid: int, cores) -> None:
        pin_process(pid, cores)

    def on_trajectory(self, index: int, seconds: float) -> None:
        if index in self._resizing:  # the old batch size: not what the next verdict is about
            return
        if index in self._warming:  # that rollout paid for a compile: not a measure of the actor's speed
            self._warming.discard(index)
            return
        self._rollouts[index].append(seconds)

    def on_update(self, now: float, lags: list[int], queue_depth: int, waited: float, groups: int = 0) -> None:
        """One learner step: the lags of the updates it made, the queue it found, the seconds it waited
        and the env groups it learned."""
        self._waited += waited
        self._groups_learned += groups
        self._depths.append(queue_depth)
        self._lags.extend(lags)
        if now - self._window_start >= self.config.interval:
            self._decide(now)

    def measurements(self, now: float) -> Measurements:
        span = max(now - self._window_start, 1e-9)
        seconds = tuple(sum(r) / len(r) if r else float("nan") for r in self._rollouts.values())
        ready = self._trainer.compiled_levels() if self._trainer is not None else ()
        return Measurements(seconds, min(self._waited / span, 1.0),
                            sum(self._depths) / max(len(self._depths), 1), len(self._depths) / span,
                            sum(self._lags) / max(len(self._lags), 1), max(self._lags, default=0), ready,
                            self._groups_learned / span, self._window_settled)

    def _decide(self, now: float) -> None:
        before = self.allocation
        self.allocation, self.state, decisions = decide(self.measurements(now), before, self.state, self.config)
        for decision in decisions:
            index = None if decision["process"] == "learner" else int(decision["process"][5:])
            if decision["kind"] == "cores":
                pid = 0 if index is None else self._trainer.actors[index].process.pid
                self._pin(decision["process"], pid, decision["after"])
                decision["applied"] = True
            elif decision["kind"] == "groups":  # sent with the actor's next parameters
                self._pending_groups[index] = decision["after"]
                self._resizing.add(index)
                decision["applied"] = "with the actor's next parameters"
            else:  # a quota takes a restart, done by the trainer between that actor's rollouts
                self._pending[index] = decision["after"]
                decision["applied"] = "pending restart"
            self._write(decision)
        self._reset_window(now)

    def restart_env(self, index: int) -> Optional[dict]:
        """The environment to restart actor `index` with now, if its quota changed. A quota decided
        while that process starts (a warm restart takes many intervals) waits for the next restart."""
        if index not in self._pending:
            return None
        self._restarting[index] = quota = self._pending.pop(index)
        env, applied = self._quota_env(f"actor{index}", quota)
        self._applies = applied
        return env

    def resize_to(self, index: int) -> Optional[int]:
        """The batch size (env groups) to send actor `index` with its next parameters, if it changed."""
        return self._pending_groups.pop(index, None)

    def resized(self, index: int, before: int, groups: int, update: int) -> None:
        self._resizing.discard(index)
        self._warming.add(index)
        reason = f"sent with the parameters of update {update}: the actor's next trajectory holds {groups} env group(s)"
        self._write({"process": f"actor{index}", "kind": "resize", "before": before, "after": groups,
                     "update": update, "reason": reason})

    def restarted(self, index: int, seconds: float, standby_seconds: Optional[float] = None) -> None:
        """Actor `index` runs in its new process: `seconds` the learner was held for it, and with
        a warm restart `standby_seconds` the new process took to start and compile beside the old."""
        self._warming.add(index)
        quota = self._restarting.pop(index)
        pid = self._trainer.actors[index].process.pid
        self._pin(f"actor{index}", pid, self.allocation.actor_cores[index])
        note = (f"restarted with an SM quota of {quota}%" if self._applies is True else
                f"restarted, but the quota of {quota}% is not in effect: {self._applies}")
        if standby_seconds is not None:
            note += f" (warm: started and compiled beside the old process in {standby_seconds:.3g} s)"
        self._write({"process": f"actor{index}", "kind": "restart", "after": quota, "pid": pid,
                     "restart_seconds": seconds, "standby_seconds": standby_seconds,
                     "quota_in_effect": self._applies is True, "reason": note})

    def _write(self, record: dict) -> None:
        record = json.loads(json.dumps({"time": time.time(), **record}))  # as the log reads back
        self.decisions.append(record)
        if self._log is not None:
            self._log.write(json.dumps(record) + "\n")
            self._log.flush()

    def close(self) -> None:
        """Gives this process its cores back and closes the log."""
        pin_process(0, self._own_cores)
        if self._log is not None:
            self._log.close()
            self._log = None


def quota_env(use_mps: bool, compile_cache: Optional[str]):
    """`ResourceManager`'s `quota_env` over this run's MPS daemon: (environment, True) where MPS
    applies the quota, else (environment, the reason it cannot)."""
    from jaxrose import mps

    def env(name: str, quota: int):
        envs = mps.prepare_clients({name: quota}, use_mps, compile_cache)
        if mps._controller_daemon is not None:
            return envs[name], True
        return envs[name], ("MPS is switched off (run.use_mps)" if not use_mps else
                            mps.unavailable_reason() or "this process could not attach to an MPS daemon")

    return env


def pin_process(pid: int, cores) -> None:
    """Pins every thread of process `pid` (0: this one) to `cores`. Linux's affinity call pins one
    thread, and threads started before it (XLA's pools, a worker's inbox) would keep the old cores;
    threads started later inherit their creator's."""
    pid = pid or os.getpid()
    try:
        threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:  # no /proc (not Linux): the process's main thread, as the call allows
        threads = [pid]
    for thread in threads:
        try:
            os.sched_setaffinity(thread, set(cores))
        except ProcessLookupError:  # the thread ended meanwhile
            pass
