"""Asynchronous training (EBRL-style): env groups roll out in actor processes, each on its own, and
the learner updates from whichever group's trajectory is ready, with a bounded policy lag.

Actors are spawned workers (MPS clients on a GPU; `jaxrose.async_actor`); each owns
`num_groups / num_actors` env groups and runs the rollout stages of PPO's program on them. The learner grants each actor rollouts
(credits): `1 + run_ahead` outstanding, one more for each of its trajectories consumed. An actor
rolls out whenever it holds a credit, with the newest parameters it has been sent (the learner sends
them to every actor after each update), so with `run_ahead >= 1` it never waits for the learner and
training runs beside the rollouts; nothing waits for the other groups. Trajectories come back
through transport buffers (`jaxrose.transport`: CUDA IPC memory on a GPU, shared memory on a CPU),
one slot per outstanding rollout, copied out by the learner on receipt. The lag of a trajectory is
the number of updates between the parameters that collected it and the update that consumes it; it
never exceeds `max_lag`: when one more update would push an outstanding rollout past the bound, the
learner first waits for it (and for all such rollouts together, in one update). With `max_lag=0`
(and so no run-ahead) every update therefore consumes all groups at once: synchronous PPO, and with
one actor the same computation as the sequential executor. Stale batches are corrected by the
decoupled loss (`jaxrose.ppo`), which is PPO's own loss at lag 0.

A snapshot (for checkpoints, or to restart an actor with a new SM quota) is a cut that needs no
barrier: the learner after update v, and for each actor the env state and RNG key its oldest
unconsumed rollout starts from. Actors keep the start state of every rollout not yet consumed, and
answer by rollout number between rollouts, so none waits. A snapshot holds each actor's env state
at its group count then, and a restore adopts it.

An actor's batch (the env groups it steps) may change at run time (`resize_actor`, driven by
`jaxrose.resources`): its next rollout that has not begun, and those after, hold the new count;
updates take whatever trajectories are ready, and the learner compiles once per batch size it meets.

NaN or Inf (`run.on_nonfinite`, `jaxrose.nonfinite`): every trajectory taken is checked
(observations, rewards) before it reaches the learner, and every update (losses, parameters)
before its parameters go out or a snapshot is asked for. `stop` raises `NonFiniteError` naming the
stage; `skip` drops the trajectory (its actor has reset its broken envs before its next rollout) or
the update (the parameters stay as they were), with a warning; more than `run.max_consecutive_skips`
in a row, of updates or of one actor's trajectories, stops the run.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from multiprocessing.connection import wait
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrose.config import ConfigError, TrainConfig
from jaxrose.async_actor import groups_of, resize_label, rollout_label, run_actor, trajectory_groups
from jaxrose.ppo_program import learner_batch
from jaxrose.precompile import Precompiler
from jaxrose.transport import publish, take
from jaxrose.workers import Worker, WorkerError


@dataclasses.dataclass
class AsyncResult:
    learner: object
    updates: int
    lags: list[int]
    rollouts_per_actor: dict[int, int]
    queue_depths: list[int]
    """Per learner step, the trajectories already waiting when the learner became free (0 while the
    actors set the pace, > 0 while the learner does)."""
    wall_seconds: float
    env_steps: int
    train_returns: list[float]
    resource_decisions: list[dict] = dataclasses.field(default_factory=list)
    trajectory_groups: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    """(actor, env groups) of every trajectory the learner took, read from the trajectory's arrays."""
    groups_per_actor: list[int] = dataclasses.field(default_factory=list)
    """Each actor's batch size (env groups) at the end."""
    learner_batch_segments: list[int] = dataclasses.field(default_factory=list)
    """The distinct learner batch sizes (segments) met; the learner compiled once for each."""
    skipped: list[dict] = dataclasses.field(default_factory=list)
    """Trajectories and updates dropped for NaN or Inf (`run.on_nonfinite='skip'`)."""
    hand_offs: dict = dataclasses.field(default_factory=dict)
    """Trajectories received through transport buffers ("slot") and through the pipe ("pipe")."""
    run_ahead: int = 0
    transport: str = "host"
    actor_rollout_seconds: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    """Each actor's own clock for every trajectory it sent: the rollout and its hand-off into the
    transport (or the pipe), compilation included for its first."""
    learner_busy_seconds: list[float] = dataclasses.field(default_factory=list)
    """Per learner step (the trajectories taken at once: one update, or with grow_keeps='update_size'
    one per starting-size piece; none where skipped for NaN): from taking its trajectories to the new
    parameters sent (copy-in, batch, updates, NaN checks, parameter fetch)."""
    learner_wait_seconds: list[float] = dataclasses.field(default_factory=list)
    """Per learner step: how long the learner waited for the trajectories it took."""
    learner_step_updates: list[int] = dataclasses.field(default_factory=list)
    """Per learner step: the updates this run had done by its end (a step may hold several), which
    maps the per-step times above onto update indices."""
    actor_timing: dict[int, list[dict]] = dataclasses.field(default_factory=dict)
    """Each actor's clock split for every trajectory: `collect` (the rollout program until its arrays
    are ready), `hand_off` (into the transport or the pipe), `idle_before` (since the previous one
    went out: waiting for a credit or parameters)."""
    lag_dropped: list[dict] = dataclasses.field(default_factory=list)
    """Pieces of split trajectories (grow_keeps='update_size') not learned because their data would
    have been more than run.max_policy_lag updates old by their turn; their env steps count as consumed."""
    precompiled: dict[str, list] = dataclasses.field(default_factory=dict)
    """Per process ("learner", "actor0", ...): (label, seconds) of each other batch size's program
    compiled ahead in the background (`jaxrose.precompile`); empty where batch sizes are not managed."""

    @property
    def rollout_sps(self) -> float:
        return self.env_steps / self.wall_seconds

    @property
    def updates_per_second(self) -> float:
        return self.updates / self.wall_seconds


@dataclasses.dataclass
class Snapshot:
    """A consistent cut of an asynchronous run (host arrays): the learner after `updates` updates
    and `env_steps` consumed env steps, and per actor the (env_state, key) its next unconsumed
    rollout starts from. `evaluated`: the iterations whose evaluation was given this learner (kept in
    the checkpoint's notes, so a resumed run redoes one that a killed run lost)."""

    learner: object
    actors: list
    updates: int
    env_steps: int
    evaluated: tuple = ()


def _segments(unrolls: dict) -> int:
    """Unroll segments in a trajectory: the learner batch it makes."""
    u, _, g, e = unrolls["reward"].shape
    return u * g * e


def _concatenate(unrolls: list[dict]) -> dict:
    """Several trajectories' unrolls as one, groups in actor order ([U, T, G, E, ...]; last_obs [U, G, E, ...])."""
    if len(unrolls) == 1:
        return unrolls[0]
    return {k: jnp.concatenate([u[k] for u in unrolls], axis=1 if k == "last_obs" else 2) for k in unrolls[0]}


def _check_batch_sizes(config: TrainConfig, num_actors: int, max_lag: int) -> None:
    """Every batch an update may take splits into minibatches (`learner_config`)."""
    start = config.env.num_groups // num_actors
    resources = config.run.resources
    levels = resources.group_levels if resources.manager == "on" else ()
    if levels and start not in levels:
        raise ConfigError(f"run.resources.group_levels {levels} must include the actors' starting batch, "
                          f"env.num_groups / actors = {start} group(s).")
    if resources.start_groups and resources.start_groups not in levels:
        raise ConfigError(f"run.resources.start_groups={resources.start_groups} must be one of run.resources."
                          f"group_levels {levels} with run.resources.manager='on' (the sizes whose programs are "
                          f"built and checked); add it to the levels or set start_groups to 0.")
    per_group = config.unrolls_per_iteration * config.env.envs_per_group
    minibatches = config.ppo.num_minibatches
    if max_lag > 0 and (start * per_group) % minibatches:
        raise ConfigError(f"One actor's batch holds {start * per_group} segments, not a multiple of "
                          f"ppo.num_minibatches ({minibatches}); change the minibatch count or the actor count.")
    if levels and resources.grow_keeps == "update_size":
        run_ahead = min(config.run.actor_run_ahead, max_lag)
        pieces = max(levels) // start
        if any(g % start for g in levels):
            raise ConfigError(f"run.resources.grow_keeps='update_size' learns a trajectory as updates of the starting "
                              f"batch ({start} group(s)): every level of run.resources.group_levels {levels} must be "
                              f"a multiple of it.")
        needed = (run_ahead + 1) * num_actors * pieces - 1
        if max_lag < needed:
            raise ConfigError(f"run.resources.grow_keeps='update_size' learns a {max(levels)}-group trajectory as "
                              f"{pieces} updates; with {num_actors} actor(s) the last one's data is up to "
                              f"(run.actor_run_ahead + 1) x actors x {pieces} - 1 = {needed} updates old: set "
                              f"run.max_policy_lag to at least that, or lower the top level.")
    size = learner_config(config, num_actors, max_lag).ppo.minibatch_segments
    for groups in levels:
        segments = groups * per_group
        if size is None and segments % minibatches:
            raise ConfigError(f"A batch of {groups} group(s) per actor (run.resources.group_levels) holds "
                              f"{segments} segments, not a multiple of ppo.num_minibatches ({minibatches}); "
                              f"change the levels or the minibatch count.")
        if size is not None and segments % size:
            raise ConfigError(f"A batch of {groups} group(s) per actor (run.resources.group_levels) holds {segments} "
                              f"segments, not a multiple of the starting minibatch ({size} segments, kept by "
                              f"run.resources.grow_keeps='minibatch_size'); change the levels.")


def learner_config(config: TrainConfig, num_actors: int, max_lag: int) -> TrainConfig:
    """The config the learner's update is built from. With batch sizes managed and
    `run.resources.grow_keeps='minibatch_size'`, minibatches keep the size they have in an update
    on the starting batches (`ppo.minibatch_segments`), so a resized batch changes the number of
    SGD steps, not their size; otherwise `config` unchanged."""
    resources = config.run.resources
    if (resources.manager != "on" or not resources.group_levels or resources.grow_keeps != "minibatch_size"
            or config.ppo.minibatch_segments is not None):
        return config
    per_group = config.unrolls_per_iteration * config.env.envs_per_group
    start = config.env.num_groups // num_actors
    segments = (start if max_lag > 0 else config.env.num_groups) * per_group  # one update's starting batch
    size = max(segments // config.ppo.num_minibatches, 1)
    return dataclasses.replace(config, ppo=dataclasses.replace(config.ppo, minibatch_segments=size))


def _pieces(unrolls: dict, groups: Optional[int]) -> list[dict]:
    """`unrolls` as consecutive updates' trajectories of `groups` groups each (None: one piece)."""
    total = trajectory_groups(unrolls)
    if groups is None or total <= groups:
        return [unrolls]
    return [{k: (v[:, g:g + groups] if k == "last_obs" else v[:, :, g:g + groups]) for k, v in unrolls.items()}
            for g in range(0, total, groups)]


def _learner_labels(size: int) -> tuple[str, str]:
    """The learner's programs for a trajectory of `size` groups, as compiled ahead: preparation, update."""
    return f"batch preparation for {size} groups", f"update on {size} groups"


def _with_params_health(update):
    """The learner's update, its metrics with the parameters' health flag (`jaxrose.nonfinite`)."""
    from jaxrose.nonfinite import params_health

    def checked(learner, batch):
        learner, metrics = update(learner, batch)
        return learner, {**metrics, **params_health(learner.params)}

    return checked


@dataclasses.dataclass
class _Rollout:
    """A rollout the learner granted an actor, until consumed: `lower_bound` is the parameter
    version it was granted at (the actor uses that or newer); `version` is exact once it arrived."""

    seq: int
    lower_bound: int
    version: Optional[int] = None
    unrolls: Optional[dict] = None

    @property
    def arrived(self) -> bool:
        return self.unrolls is not None

    @property
    def params_version(self) -> int:
        return self.version if self.arrived else self.lower_bound


class AsyncTrainer:
    def __init__(self, config: TrainConfig, num_actors: int, max_lag: int,
                 actor_delays: Optional[dict[int, float]] = None, worker_env: Optional[dict] = None,
                 actor_envs: Optional[list[dict]] = None, env=None, run_ahead: Optional[int] = None,
                 learner_delay: float = 0.0):
        """`env`: the env the actors step (pickled to them; e.g. a fault injector); None builds the config's.
        `run_ahead`: rollouts an actor may start before its previous trajectory is consumed (default
        `run.actor_run_ahead`; at most `max_lag`, since such a rollout is consumed at least one update
        after its parameters). `actor_delays` and `learner_delay` (seconds added to each rollout or
        update) are fault injection for tests."""
        if num_actors < 1 or config.env.num_groups % num_actors:
            raise ConfigError(f"env.num_groups ({config.env.num_groups}) must be a multiple of the number of actors "
                              f"({num_actors}): each actor owns whole env groups.")
        if max_lag < 0:
            raise ConfigError(f"The largest policy lag must be >= 0, got {max_lag}.")
        _check_batch_sizes(config, num_actors, max_lag)
        from jaxrose.sequential import SequentialExecutor
        from jaxrose.transport import transport_kind

        self.config, self.num_actors, self.max_lag = config, num_actors, max_lag
        self.run_ahead = min(config.run.actor_run_ahead if run_ahead is None else run_ahead, max_lag)
        # The learner, network and key layout; minibatches per `learner_config`.
        self.executor = SequentialExecutor(learner_config(config, num_actors, max_lag), env=env)
        self._custom_env = env
        self._update = jax.jit(_with_params_health(self.executor.learner.update))
        # One program for every batch: with a lag bound above 0 every batch gets the proximal policy's
        # log-probs (at lag 0 they equal the behaviour's up to rounding); a second variant would
        # compile again mid-run, the first time a batch arrives at lag 0.
        self._prepare = jax.jit(functools.partial(learner_batch, self.executor.net, stale=max_lag > 0))
        self._learner_delay = learner_delay
        resources = config.run.resources
        managed = resources.group_levels if resources.manager == "on" else ()
        # With grow_keeps='update_size', the groups one update learns (an actor's starting batch).
        self._update_groups = (config.env.num_groups // num_actors
                               if managed and resources.grow_keeps == "update_size" else None)
        # The learner compiles other batch sizes ahead only where it learns them: with 'update_size' every
        # update is on the starting batch whatever an actor steps, so a resize needs the actor's programs alone.
        self._precompiler = (Precompiler("learner") if len(managed) > 1 and self._update_groups is None else None)
        self._actors_precompile = len(managed) > 1
        self._precompiling = False
        self.precompiled: dict[str, list] = {}  # process -> (label, seconds) of each program compiled ahead
        self._precompile_finished = [False] * num_actors  # per actor: every level's programs compiled (or failed)
        self._delays = actor_delays or {}
        self.groups = [config.env.num_groups // num_actors] * num_actors  # each actor's batch size
        self.transport = transport_kind()
        self.hand_offs = {"slot": 0, "pipe": 0}  # trajectories received through buffers / the pipe
        self.actor_rollout_seconds: dict[int, list[float]] = {}  # per actor, from its own clock
        self.actor_timing: dict[int, list[dict]] = {}  # per actor and trajectory: collect, hand-off, idle before
        self._buffers: dict[tuple[int, int], list] = {}  # (actor, groups) -> transport slots
        self._rollouts: list[collections.deque] = [collections.deque() for _ in range(num_actors)]
        self._next_seq = [0] * num_actors  # the next rollout each actor will be granted
        self._sent_version = [-1] * num_actors  # newest parameters sent to each actor process
        self._sent_buffers: list[set] = [set() for _ in range(num_actors)]  # batch sizes it has buffers for
        envs = actor_envs or [worker_env] * num_actors
        self.actors = [self._worker(i, envs[i]) for i in range(num_actors)]
        self._states: dict = {}  # snapshot tag -> {actor: (env_state, key)}
        self._manager = None
        self._standby: dict[int, dict] = {}  # actor -> its replacement starting beside it (warm restarts)
        self._host_params = None  # the newest parameters fetched to the host (their shapes compile a standby)
        try:
            for actor in self.actors:
                actor.launch()
            for actor in self.actors:
                actor.wait_ready()
        except BaseException:
            self.close()
            raise
        start_groups = resources.start_groups if managed else 0
        for i in range(num_actors):  # before any credit: the first rollout steps this many groups
            if start_groups and start_groups != self.groups[i]:
                self.resize_actor(i, start_groups, 0)

    def _worker(self, index: int, env: Optional[dict]) -> Worker:
        args = (self.config, index, self.num_actors, self._delays.get(index, 0.0), self._custom_env)
        return Worker(f"actor{index}", run_actor, args, env)

    def _oldest_unconsumed(self, index: int) -> int:
        rollouts = self._rollouts[index]
        return rollouts[0].seq if rollouts else self._next_seq[index]

    def template(self) -> Snapshot:
        """A snapshot of the initial state (the shapes a checkpoint restores into)."""
        state = self.executor.init(jax.random.PRNGKey(self.config.run.seed))
        actors = self._request_states("template", {i: self._next_seq[i] for i in range(self.num_actors)}, wait=True)
        return Snapshot(jax.device_get(state.learner), actors, 0, 0)

    def restart_actor(self, index: int, env: Optional[dict]) -> float:
        """Replaces actor `index` by a new process with environment `env` (e.g. another SM quota),
        started once the old one has stopped (a cold restart: the learner waits for its start-up).
        Returns the seconds it took."""
        return self._replace_actor(index, self._worker(index, env), started=False)

    def _advance_standby(self, index: int) -> bool:
        """Moves actor `index`'s standby process on without waiting: once it is ready it gets the
        newest parameters and compiles the rollout of the actor's batch; True once that is done."""
        standby = self._standby[index]
        worker = standby["worker"]
        if standby["stage"] == "starting" and worker.poll():
            worker.wait_ready(5.0)  # its "ready" is in the pipe
            worker.send(("params", -1, *self._host_params))  # shapes for the compile; the real ones follow
            worker.send(("warm", self.groups[index]))
            standby["stage"] = "warming"
        elif standby["stage"] == "warming" and worker.poll():
            kind, *_ = worker.receive(5.0)
            if kind != "warmed":
                raise WorkerError(f"Standby actor{index} sent {kind!r} while compiling its rollout.")
            standby["stage"], standby["warm_seconds"] = "warm", time.perf_counter() - standby["began"]
        elif not worker.process.is_alive():
            raise worker.death_error("while starting as a standby")
        return standby["stage"] == "warm"

    def _replace_actor(self, index: int, worker: Worker, started: bool) -> float:
        """Puts `worker` in actor `index`'s place (starting it after the old one stops unless `started`,
        a warm standby), carrying over the state the oldest unconsumed rollout starts from; the
        rollouts outstanding are dropped (not consumed, so not counted) and granted again. Returns
        the seconds the learner was held."""
        start = time.perf_counter()
        seq = self._oldest_unconsumed(index)
        state = self._request_states(f"restart{index}", {index: seq}, wait=True)[0]
        self.actors[index].stop()
        if not started:
            worker.start()
        self.actors[index] = worker
        worker.send(("restore", publish(state), seq))
        self._rollouts[index].clear()
        self._next_seq[index], self._sent_version[index], self._sent_buffers[index] = seq, -1, set()
        self.precompiled.pop(f"actor{index}", None)  # the new process compiles its other levels again
        self._precompile_finished[index] = False
        return time.perf_counter() - start

    def resize_actor(self, index: int, groups: int, update: int) -> None:
        """Gives actor `index` a batch of `groups` env groups from its next rollout that has not
        begun: a shrink drops its last groups, a growth adds groups reset from a key folded from the
        actor and `update` (the update the change goes out with), so a run is reproducible."""
        self.actors[index].send(("resize", groups, update))
        self.groups[index] = groups

    def _request_states(self, tag, which: dict[int, int], wait: bool) -> Optional[list]:
        """Asks each actor in `which` for the state its rollout `which[i]` starts from."""
        self._states[tag] = {}
        for i, seq in which.items():
            self.actors[i].send(("state", tag, seq))
        if not wait:
            return None
        timeout = self.config.run.actor_timeout
        deadline = time.monotonic() + timeout
        while len(self._states[tag]) < len(which):
            self._pump(deadline, timeout)
        states = self._states.pop(tag)
        return [states[i] for i in sorted(states)]

    def _grant(self, index: int, version: int, host_params) -> None:
        """Tops actor `index` up to `1 + run_ahead` outstanding rollouts, with parameters `version`."""
        rollouts, granted = self._rollouts[index], 0
        while len(rollouts) < 1 + self.run_ahead:
            rollouts.append(_Rollout(self._next_seq[index], version))
            self._next_seq[index] += 1
            granted += 1
        if granted or self.run_ahead:  # with run-ahead, rollouts begun before the next credit get them too
            self._send_params(index, version, host_params)
        if granted:
            self.actors[index].send(("credit", granted, self._oldest_unconsumed(index)))

    def _send_params(self, index: int, version: int, host_params) -> None:
        if self._sent_version[index] < version:
            self.actors[index].send(("params", version, *host_params))
            self._sent_version[index] = version

    def _finite_trajectories(self, taken: list, version: int, nonfinite, skipped: list) -> list:
        """The (actor, rollout) pairs in `taken` whose trajectory is finite. A non-finite one stops
        the run, or is dropped with a warning (with `skip` its actor has already reset its broken
        envs, before its next rollout began)."""
        from jaxrose.nonfinite import trajectory_stages

        good = []
        for i, rollout in taken:
            stages, kind = trajectory_stages(rollout.unrolls), f"trajectories from actor{i}"
            if not stages:
                nonfinite.healthy(kind)
                good.append((i, rollout))
                continue
            finding = (f"Update {version + 1} received NaN or Inf in: {', '.join(stages)} (actor{i}'s trajectory, "
                       f"collected with the parameters of update {rollout.version})")
            nonfinite.admit(version + 1, finding, kind)
            skipped.append({"update": version + 1, "stages": stages, "actor": i})
            nonfinite.warn(finding, f"that trajectory was dropped and actor{i}'s envs with a non-finite state are "
                                    f"reset before its next rollout", kind=kind)
        return good

    def _learn(self, learner, unrolls: dict, lag: int, version: int, nonfinite, skipped: list, used: list[int]):
        """(the learner after one update on `unrolls`, episode stats), or (None, stats) when the update
        produced NaN or Inf and is skipped (with `stop`, `nonfinite` raises instead)."""
        from jaxrose.nonfinite import bad_stages

        batch, stats = self._prepare(unrolls, learner)
        updated, metrics = self._update(learner, batch)
        if self._precompiler is not None and not self._precompiling:
            self._precompile_levels(unrolls, learner, batch)
        stages = bad_stages({k: float(v) for k, v in jax.device_get(metrics).items()})
        if self._learner_delay:
            time.sleep(self._learner_delay)  # fault injection for tests: a deliberately slow learner
        if not stages:
            nonfinite.healthy("updates")
            return updated, stats
        finding = f"Update {version + 1} produced NaN or Inf in: {', '.join(stages)}"
        nonfinite.admit(version + 1, finding, "updates")
        skipped.append({"update": version + 1, "stages": stages, "actors": used})
        nonfinite.warn(finding, f"it was skipped (the parameters stay those of update {version})", kind="updates")
        return None, stats

    def _precompiled_so_far(self) -> dict[str, list]:
        learner = {"learner": list(self._precompiler.compiled)} if self._precompiler is not None else {}
        return {**learner, **self.precompiled}

    def compiled_levels(self) -> tuple[tuple[int, ...], ...]:
        """Per actor, the batch sizes it may be resized to without a compile stall: its own size, and
        every managed level whose rollout and resize from its size the actor, and whose update the
        learner, compiled ahead (with grow_keeps='update_size' every update is on the starting batch,
        so the actor's programs alone). Empty where batch sizes are not compiled ahead."""
        if not self._actors_precompile:
            return ()
        learner = None if self._precompiler is None else {label for label, _ in self._precompiler.compiled}
        ready = []
        for i, groups in enumerate(self.groups):
            actor = {label for label, _ in self.precompiled.get(f"actor{i}", ())}
            ready.append(tuple(g for g in self.config.run.resources.group_levels if g == groups or (
                {rollout_label(g), resize_label(groups, g)} <= actor
                and (learner is None or set(_learner_labels(g)) <= learner))))
        return tuple(ready)

    def compiling_ahead(self) -> bool:
        """Whether a process has yet to compile (or fail to compile) every other batch size's programs
        ahead: its compile threads take the CPU and the actor's loop while they run, so the resource
        manager counts no interval that began before they were done."""
        if not self._actors_precompile:
            return False
        learner_busy = self._precompiler is not None and not (self._precompiling and self._precompiler.wait(0))
        return learner_busy or not all(self._precompile_finished)

    def _precompile_levels(self, unrolls: dict, learner, batch) -> None:
        """The learner's stages for a trajectory of every other batch size compiled in the background
        (`jaxrose.precompile`), from the first update's arrays: a resize then costs no stall. Batches
        that join several actors' trajectories (a lag bound of 0, or an urgent take) compile on first use."""
        from jaxrose.precompile import abstract, resized_axis

        self._precompiling = True
        groups = trajectory_groups(unrolls)
        learner_abs = jax.tree.map(abstract, learner)
        for size in (g for g in self.config.run.resources.group_levels if g != groups):
            scale = lambda n, size=size: n // groups * size  # noqa: E731
            unrolls_abs = {k: resized_axis(v, 1 if k == "last_obs" else 2, scale) for k, v in unrolls.items()}
            batch_abs = resized_axis(batch, 0, scale)
            prepare_label, update_label = _learner_labels(size)
            self._precompiler.submit(prepare_label, lambda u=unrolls_abs: self._prepare.lower(u, learner_abs).compile())
            self._precompiler.submit(update_label, lambda b=batch_abs: self._update.lower(learner_abs, b).compile())

    def _apply_resources(self, manager, take: list[int], version: int) -> None:
        """Quota restarts and batch sizes the manager decided, for the actors whose trajectories were
        just consumed. With `run.resources.warm_restarts` a restart starts a standby process and
        switches to it at a later step, once it has compiled (`_advance_standby`)."""
        warm = self.config.run.resources.warm_restarts
        for i in take:
            if i not in self._standby:
                env = manager.restart_env(i)
                if env is not None and not warm:
                    manager.restarted(i, self.restart_actor(i, env))
                elif env is not None:
                    self._standby[i] = {"worker": self._worker(i, env), "stage": "starting",
                                        "began": time.perf_counter()}
                    self._standby[i]["worker"].launch()
            if i in self._standby and self._advance_standby(i):
                standby = self._standby.pop(i)
                manager.restarted(i, self._replace_actor(i, standby["worker"], started=True),
                                  standby["warm_seconds"])
                continue  # its resize, if one is pending, goes out with its next parameters
            groups = manager.resize_to(i)
            if groups is not None:
                manager.resized(i, self.groups[i], groups, version)
                self.resize_actor(i, groups, version)

    def _updates_in(self, index: int, rollout: _Rollout) -> int:
        """Updates a rollout will be learned as: 1, or with grow_keeps='update_size' its groups over the
        starting batch (the actor's current size until it arrives)."""
        if self._update_groups is None:
            return 1
        groups = trajectory_groups(rollout.unrolls) if rollout.arrived else self.groups[index]
        return max(groups // self._update_groups, 1)

    def _choose(self, version: int) -> tuple[list, bool]:
        """The rollouts the next step consumes, and whether they must all arrive first: every
        rollout whose lag would pass the bound if this step went without it (urgent), else the
        arrived trajectory with the oldest parameters. That choice may be learned as several updates
        (grow_keeps='update_size'): a rollout that could not wait that many is taken first instead,
        so a small or slow actor's trajectory is waited for, never waited for and then dropped."""
        urgent = [(i, r) for i in range(self.num_actors) for r in self._rollouts[i]
                  if version + self._updates_in(i, r) - r.params_version > self.max_lag]
        if urgent:
            return urgent, True
        arrived = [(r.version, i, r.seq, r) for i in range(self.num_actors) for r in self._rollouts[i] if r.arrived]
        if not arrived:
            return [], False
        _, index, _, oldest = min(arrived)
        steps = self._updates_in(index, oldest)  # the versions this choice moves the learner on by
        due = [(i, r) for i in range(self.num_actors) for r in self._rollouts[i]
               if r is not oldest and version + steps + self._updates_in(i, r) - 1 - r.params_version > self.max_lag]
        return (due, True) if due else ([(index, oldest)], False)

    def run(self, updates: Optional[int] = None, env_steps: Optional[int] = None, timeout: Optional[float] = None,
            on_update=None, start: Optional[Snapshot] = None, snapshot_due=None, on_snapshot=None,
            manager=None, nonfinite=None, should_stop=None) -> AsyncResult:
        """Runs until `updates` learner updates or `env_steps` consumed env steps (counted from the
        start of the run, so a resumed run has the same budget), whichever is given.
        `timeout`: seconds to wait for an awaited rollout or state (default `run.actor_timeout`).
        `on_update(update, env_steps, learner, info)` is called after each update (logging, evaluation);
        `info` holds the update's lags, queue depth, training returns and the actors' batch sizes.
        `start`: a snapshot to continue from. `snapshot_due(update, env_steps)`: whether to take a
        snapshot after this update; each is handed to `on_snapshot` once all actors reported, and
        one more at the end. `manager`: a `jaxrose.resources.ResourceManager` fed with measurements.
        `nonfinite`: a `jaxrose.nonfinite.NonFinitePolicy` (default: `run.on_nonfinite`, no checkpoint
        to name). Trajectories dropped for NaN or Inf count as consumed env steps, as a skipped
        iteration does in the synchronous loop; a skipped update is not counted as an update.
        `should_stop()`: checked after each update; when true the run ends early, as at the end of
        its budget (with the final snapshot), e.g. on SIGTERM."""
        from jaxrose.nonfinite import NonFinitePolicy

        if (updates is None) == (env_steps is None):
            raise ValueError("Give exactly one of `updates` and `env_steps`.")
        timeout = self.config.run.actor_timeout if timeout is None else timeout
        if nonfinite is None:
            nonfinite = NonFinitePolicy(self.config.run, unit="update")
        if start is None:
            learner, version, consumed = self.executor.init(jax.random.PRNGKey(self.config.run.seed)).learner, 0, 0
        else:
            learner, version, consumed = start.learner, start.updates, start.env_steps
            for i, (actor, state) in enumerate(zip(self.actors, start.actors, strict=True)):
                actor.send(("restore", publish(state), self._next_seq[i]))
                self.groups[i] = groups_of(state[0])
        # Committed to the device, as every update's output is: a jitted learner stage sees one kind of
        # input from the first update on (an uncommitted one would compile it a second time).
        learner = jax.device_put(learner, jax.devices()[0])
        self._manager = manager
        self._sent_version = [-1] * self.num_actors  # a new run's versions start again
        if manager is not None:
            manager.start(self)
        host_params = self._host_params = jax.device_get((learner.params, learner.normalizer))
        for i in range(self.num_actors):
            self._grant(i, version, host_params)
        lags, depths, returns, shapes, skipped, batch_sizes = [], [], [], [], [], set()
        busy, waits = [], []  # the learner's time per step: working, and waiting for trajectories
        step_updates: list[int] = []
        lag_dropped: list[dict] = []
        self.actor_rollout_seconds = {i: [] for i in range(self.num_actors)}
        self.actor_timing = {i: [] for i in range(self.num_actors)}
        rollouts = {i: 0 for i in range(self.num_actors)}
        pending: dict = {}  # snapshots waiting for actors' states
        if on_snapshot is not None:
            nonfinite.before_stop = lambda: self._finish_snapshots(pending, on_snapshot, timeout)
        start_time, done = time.perf_counter(), version
        steps_per_group_rollout = self.config.env_steps_per_iteration // self.config.env.num_groups
        while ((done < updates) if updates is not None else (consumed < env_steps)) and not (
                should_stop is not None and should_stop()):
            # The queue the learner finds on becoming free: trajectories that arrived while it was busy.
            self._receive_pending()
            depths.append(sum(r.arrived for rs in self._rollouts for r in rs))
            take, urgent = self._choose(version)
            if urgent:  # arrivals only make parameter versions exact (newer): the set stays urgent
                waited = self._gather(lambda: all(r.arrived for _, r in take), timeout)
            else:
                waited = self._gather(lambda: any(r.arrived for rs in self._rollouts for r in rs), timeout)
                take, urgent = self._choose(version)
                if urgent:  # the trajectory that arrived takes several updates: one that cannot wait goes first
                    waited += self._gather(lambda: all(r.arrived for _, r in take), timeout)
            taken_at = time.perf_counter()
            take.sort(key=lambda pair: (pair[0], pair[1].seq))
            for i, rollout in take:
                self._rollouts[i].remove(rollout)
                rollouts[i] += 1
            used = self._finite_trajectories(take, version, nonfinite, skipped)
            if self._update_groups is None:  # one update on everything taken
                pieces = [(_concatenate([r.unrolls for _, r in used]), used)] if used else []
            else:  # grow_keeps='update_size': each trajectory as updates of the starting batch, in order
                pieces = [(p, [(i, r)]) for i, r in used for p in _pieces(r.unrolls, self._update_groups)]
            # Trajectories dropped for NaN or Inf count at once; the others as their pieces are consumed.
            dropped_groups = (sum(trajectory_groups(r.unrolls) for _, r in take)
                              - sum(trajectory_groups(p) for p, _ in pieces))
            consumed += dropped_groups * steps_per_group_rollout
            shapes.extend((i, trajectory_groups(r.unrolls)) for i, r in used)
            step_lags, reports, step_groups = [], [], 0
            for piece, sources in pieces:  # one update, or (grow_keeps='update_size') several, one after another
                consumed += trajectory_groups(piece) * steps_per_group_rollout
                batch_lags = [version - r.version for _, r in sources]
                if max(batch_lags) > self.max_lag:  # a later piece of a split trajectory: never past the bound
                    lag_dropped.append({"update": version + 1, "lag": max(batch_lags),
                                        "actors": [i for i, _ in sources], "groups": trajectory_groups(piece)})
                    continue
                batch_sizes.add(_segments(piece))
                updated, stats = self._learn(learner, piece, max(batch_lags), version, nonfinite, skipped,
                                             [i for i, _ in sources])
                if updated is None:
                    continue
                learner, version, done = updated, version + 1, done + 1
                step_groups += trajectory_groups(piece)
                lags.extend(batch_lags)
                step_lags.extend(batch_lags)
                if float(stats["episodes"]) > 0:
                    returns.append(float(stats["episode_return"]))
                reports.append((done, consumed, learner, {"lags": batch_lags, "queue_depth": depths[-1],
                                                          "episode_return": float(stats["episode_return"]),
                                                          "episodes": float(stats["episodes"])}))
            if reports and snapshot_due is not None and snapshot_due(version, consumed):
                pending[version] = self._snapshot_request(version, consumed, learner)
            actors_taken = sorted({i for i, _ in take})
            if manager is not None:
                manager.on_update(time.perf_counter(), step_lags, depths[-1], waited, step_groups)
                self._apply_resources(manager, actors_taken, version)
            host_params = self._host_params = jax.device_get((learner.params, learner.normalizer))
            for i in range(self.num_actors):
                self._grant(i, version, host_params)
            busy.append(time.perf_counter() - taken_at)
            waits.append(waited)
            step_updates.append(done - (start.updates if start else 0))
            if on_update is not None:
                for report in reports:
                    on_update(*report[:3], {**report[3], "groups_per_actor": list(self.groups),
                                            "skipped": len(skipped)})
            # After `on_update`: what it did with this step's learner (an evaluation) goes into its snapshot.
            self._deliver(pending, on_snapshot)
        wall = time.perf_counter() - start_time
        if on_snapshot is not None:
            if version not in pending:  # every actor's oldest unconsumed rollout starts from the state to save
                pending[version] = self._snapshot_request(version, consumed, learner)
            deadline = time.monotonic() + timeout
            while pending:
                self._pump(deadline, timeout)
                self._deliver(pending, on_snapshot)
        # Wait for every rollout granted, so the actors are idle and a later `run` starts clean.
        self._gather(lambda: all(r.arrived for rs in self._rollouts for r in rs), timeout)
        for rs in self._rollouts:
            rs.clear()
        return AsyncResult(learner, done - (start.updates if start else 0), lags, rollouts, depths, wall,
                           consumed - (start.env_steps if start else 0), returns,
                           list(manager.decisions) if manager is not None else [], shapes, list(self.groups),
                           sorted(batch_sizes), skipped, dict(self.hand_offs), self.run_ahead, self.transport,
                           {i: list(t) for i, t in self.actor_rollout_seconds.items()}, busy, waits,
                           learner_step_updates=step_updates, precompiled=self._precompiled_so_far(),
                           lag_dropped=lag_dropped,
                           actor_timing={i: list(t) for i, t in self.actor_timing.items()})

    def _finish_snapshots(self, pending: dict, on_snapshot, timeout: float) -> None:
        """Delivers the snapshots still waiting for actors' states (each holds states from before
        whatever stops the run), waiting up to `timeout` for the actors' answers."""
        deadline = time.monotonic() + timeout
        self._deliver(pending, on_snapshot)
        while pending and time.monotonic() < deadline:
            self._pump(deadline, timeout)
            self._deliver(pending, on_snapshot)

    def _snapshot_request(self, version: int, consumed: int, learner) -> tuple:
        """Asks every actor for the state its oldest unconsumed rollout starts from (see the module doc)."""
        self._request_states(("snapshot", version), {i: self._oldest_unconsumed(i) for i in range(self.num_actors)},
                             wait=False)
        return jax.device_get(learner), consumed

    def _deliver(self, pending: dict, on_snapshot) -> None:
        for version in [v for v in pending if len(self._states[("snapshot", v)]) == self.num_actors]:
            learner, consumed = pending.pop(version)
            states = self._states.pop(("snapshot", version))
            if on_snapshot is not None:
                on_snapshot(Snapshot(learner, [states[i] for i in range(self.num_actors)], version, consumed))

    def _pump(self, deadline: float, timeout: float) -> None:
        """Receives whatever the actors sent (trajectories, states), waiting up to 0.5 s for something;
        past `deadline` (`timeout` seconds after the wait began) the silent actors are named."""
        if not wait([a._conn for a in self.actors], timeout=0.5):
            for actor in self.actors:
                if not actor.process.is_alive():
                    raise actor.death_error("while rolling out")
            if time.monotonic() > deadline:
                awaited = [i for i in range(self.num_actors) if any(not r.arrived for r in self._rollouts[i])]
                silent = ", ".join(f"{self.actors[i].name} (pid {self.actors[i].process.pid})"
                                   for i in (awaited or range(self.num_actors)))
                raise WorkerError(f"{silent} sent nothing for {timeout:.0f} s (run.actor_timeout) while the learner "
                                  f"waited for its rollouts or states; it may be hung. The run stopped; the last "
                                  f"checkpoint is intact and `--run.resume` continues from it. If a rollout really "
                                  f"takes that long (a first compile counts), raise run.actor_timeout.")
            return
        self._receive_pending()

    def _receive_pending(self) -> None:
        """Receives every message the actors have sent so far, waiting for none."""
        for actor in self.actors:
            while actor.poll():
                message = actor.receive(60.0)
                if message[0] == "state":  # published through shared memory: copied out here, no pickling
                    _, index, tag, published = message
                    self._states[tag][index] = take(published)
                    continue
                if message[0] == "precompiled":  # (label, seconds) of each batch size compiled ahead
                    _, index, compiled, finished = message
                    self.precompiled[f"actor{index}"] = compiled
                    self._precompile_finished[index] = finished
                    continue
                self._receive_trajectory(*message[1:])

    def _receive_trajectory(self, index: int, seq: int, version: int, groups: int, payload: tuple,
                            seconds: float, timing: Optional[dict] = None) -> None:
        """Copies a trajectory out of its slot (freeing it for the actor) or takes it from the pipe;
        after a batch size's first trajectory, the actor gets buffers for that size."""
        from jaxrose.transport import make_buffers

        how, data = payload
        self.hand_offs[how] += 1
        self.actor_rollout_seconds.setdefault(index, []).append(seconds)
        self.actor_timing.setdefault(index, []).append(timing or {})
        # Committed to the learner's device whichever way they came, so every jitted learner program
        # sees one kind of input and compiles once.
        device = jax.devices()[0]
        if how == "slot":
            unrolls = jax.device_put(self._buffers[(index, groups)][data].read(), device)
        else:
            unrolls = jax.device_put(data, device)
            if (index, groups) not in self._buffers:
                shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), unrolls)
                self._buffers[(index, groups)] = [make_buffers(shapes, self.transport)
                                                  for _ in range(1 + self.run_ahead)]
            if groups not in self._sent_buffers[index]:
                slots = self._buffers[(index, groups)]
                self.actors[index].send(("buffers", groups, [b.describe() for b in slots]))
                self._sent_buffers[index].add(groups)
        rollout = next((r for r in self._rollouts[index] if r.seq == seq), None)
        if rollout is None:  # granted before a restart of its actor: dropped
            return
        rollout.version, rollout.unrolls = version, unrolls
        for later in self._rollouts[index]:  # they start after it, with its parameters or newer ones
            if later.seq > seq:
                later.lower_bound = max(later.lower_bound, version)
        if self._manager is not None and groups == self.groups[index]:  # not an old batch size's rollout
            self._manager.on_trajectory(index, seconds)

    def _gather(self, satisfied, timeout: float) -> float:
        """Receives until `satisfied()`; returns the seconds the learner waited."""
        start = time.perf_counter()
        deadline = time.monotonic() + timeout
        while not satisfied():
            self._pump(deadline, timeout)
        return time.perf_counter() - start

    def close(self) -> None:
        if self._precompiler is not None:
            self._precompiler.close()
        for actor in [*self.actors, *(s["worker"] for s in self._standby.values())]:
            actor.stop()
        self._standby.clear()
        for slots in self._buffers.values():
            for slot in slots:
                slot.close()
        self._buffers.clear()
