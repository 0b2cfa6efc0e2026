"""Asynchronous training (EBRL-style): env groups roll out in actor processes, each on its own, and
the learner updates from whichever group's trajectory is ready, with a bounded policy lag.

Actors are spawned workers (MPS clients on a GPU); each owns `num_groups / num_actors` env groups
and runs the rollout stages of PPO's program on them. After every trajectory an actor receives the
learner's newest parameters; nothing waits for the other groups. The lag of a trajectory is the
number of updates between the parameters that collected it and the update that consumes it; it
never exceeds `max_lag`: when one more update would push an actor still rolling out past the bound,
the learner first waits for that actor (and for all such actors together, in one update). With
`max_lag=0` every update therefore consumes all groups at once: synchronous PPO, and with one actor
the same computation as the sequential executor. Stale batches are corrected by the decoupled loss
(`jaxrose.ppo`), which is PPO's own loss at lag 0.

A snapshot (for checkpoints, or to restart an actor with a new SM quota) is a cut that needs no
barrier: the learner after update v, and for each actor the env state and RNG key its next
unconsumed rollout starts from. An actor whose trajectory update v consumed reports its current
state; one still rolling out (or whose trajectory waits) reports the state its current rollout
started from, which it keeps for that purpose. Actors answer between rollouts, so none waits.
A snapshot holds each actor's env state at its current group count, and a restore adopts it.

An actor's batch (the env groups it steps) may change at run time (`resize_actor`, driven by
`jaxrose.resources`): the trajectories it sends then hold the new count, updates take whatever
trajectories are ready, and the learner compiles once per batch size it meets.

NaN or Inf (`run.on_nonfinite`, `jaxrose.nonfinite`): every trajectory taken is checked
(observations, rewards) before it reaches the learner, and every update (losses, parameters)
before its parameters go out or a snapshot is asked for. `stop` raises `NonFiniteError` naming the
stage; `skip` drops the trajectory (and has its actor reset its broken envs) or the update (the
parameters stay as they were), with a warning; more than `run.max_consecutive_skips` in a row, of
updates or of one actor's trajectories, stops the run.
"""

from __future__ import annotations

import dataclasses
import time
from multiprocessing.connection import wait
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrose import distribution
from jaxrose.config import ConfigError, TrainConfig
from jaxrose.workers import Worker


@dataclasses.dataclass
class AsyncResult:
    learner: object
    updates: int
    lags: list[int]
    rollouts_per_actor: dict[int, int]
    queue_depths: list[int]
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
    rollout starts from."""

    learner: object
    actors: list
    updates: int
    env_steps: int


def _actor(conn, config: TrainConfig, index: int, num_actors: int, delay_seconds: float, env=None) -> None:
    """Actor process: its env groups, the rollout stages, parameters in, trajectories out. `env`:
    the env to step (a fault injector in tests); None builds the config's."""
    from envs.wrappers import wrap_for_training
    from jaxrose.networks import make_actor_critic
    from jaxrose.nonfinite import reset_broken_envs
    from jaxrose.ppo_program import rollout_nodes
    from jaxrose.program import Program, run_program
    from jaxrose.sequential import make_env

    env = env if env is not None else make_env(config)
    episode, per_group = config.env.episode_length, config.env.envs_per_group
    groups = config.env.num_groups // num_actors
    layout = lambda count: wrap_for_training(env, episode, count, per_group)  # noqa: E731
    net = make_actor_critic(env.observation_size, env.action_size, config.network, config.ppo.normalize_observations)
    # Stepping does not depend on the group count (only reset does), so one program serves every batch size.
    program = Program("rollout", rollout_nodes(layout(groups), net, config))
    # The sequential executor's key layout: every env reset from one key, then this actor's groups.
    _, env_key, loop_key = jax.random.split(jax.random.PRNGKey(config.run.seed), 3)
    env_state = jax.tree.map(lambda x: x[index * groups:(index + 1) * groups],
                             jax.jit(layout(config.env.num_groups).reset)(env_key))
    key = loop_key if num_actors == 1 else jax.random.fold_in(loop_key, index)

    @jax.jit
    def collect(params, normalizer, env_state, key):
        out = run_program(program, {"params": params, "normalizer": normalizer, "env_state": env_state, "key": key})
        return out["env_state"], out["key"], out["unrolls"]

    def fresh_groups(count: int, update: int):
        # New groups' envs: a key that depends only on the actor and the update of the change.
        return jax.jit(layout(count).reset)(jax.random.fold_in(jax.random.fold_in(env_key, index), update))

    @jax.jit
    def repair(env_state, key):
        return reset_broken_envs(layout(groups_of(env_state)), env_state, key)[0]

    conn.send(("ready", {"platform": jax.devices()[0].platform, "groups": groups}))
    start = (env_state, key)  # where the rollout in progress (or the last one) began: a snapshot's "start"
    while True:
        message = conn.recv()
        if message[0] == "stop":
            return
        if message[0] == "state":
            _, tag, which = message
            conn.send(("state", index, tag, jax.device_get((env_state, key) if which == "current" else start)))
            continue
        if message[0] == "restore":  # its group count is the restored state's
            env_state, key = jax.device_put(message[1])
            start = (env_state, key)
            continue
        if message[0] == "resize":
            _, size, update = message
            env_state = resized(env_state, size, lambda count: fresh_groups(count, update))
            continue
        if message[0] == "repair":  # after a non-finite trajectory was skipped
            key, repair_key = jax.random.split(key)
            env_state = repair(env_state, repair_key)
            continue
        _, version, params, normalizer = message
        began, start = time.perf_counter(), (env_state, key)
        env_state, key, unrolls = collect(params, normalizer, env_state, key)
        unrolls = jax.device_get(unrolls)
        if delay_seconds:
            time.sleep(delay_seconds)  # fault injection for tests: a deliberately slow group
        conn.send(("trajectory", index, version, unrolls, time.perf_counter() - began))


def groups_of(env_state) -> int:
    """Env groups in an env state (leading axis of every leaf)."""
    return jax.tree.leaves(env_state)[0].shape[0]


def resized(env_state, groups: int, fresh_groups):
    """`env_state` with `groups` env groups: the first ones kept (a shrink drops the last groups and
    their episodes in flight), new ones from `fresh_groups(count)`."""
    have = groups_of(env_state)
    if groups <= have:
        return jax.tree.map(lambda x: x[:groups], env_state)
    return jax.tree.map(lambda old, new: jnp.concatenate([old, new]), env_state, fresh_groups(groups - have))


def _trajectory_groups(unrolls: dict) -> int:
    return unrolls["reward"].shape[2]  # [U, T, G, E]


def _segments(unrolls: dict) -> int:
    """Unroll segments in a trajectory: the learner batch it makes."""
    u, _, g, e = unrolls["reward"].shape
    return u * g * e


def _concatenate(unrolls: list[dict]) -> dict:
    """Several actors' unrolls as one, groups in actor order ([U, T, G, E, ...]; last_obs [U, G, E, ...])."""
    return {k: np.concatenate([u[k] for u in unrolls], axis=1 if k == "last_obs" else 2) for k in unrolls[0]}


def _check_batch_sizes(config: TrainConfig, num_actors: int, max_lag: int) -> None:
    """Every batch an update may take splits into ppo.num_minibatches minibatches."""
    start = config.env.num_groups // num_actors
    resources = config.run.resources
    levels = resources.group_levels if resources.manager == "on" else ()
    if levels and start not in levels:
        raise ConfigError(f"run.resources.group_levels {levels} must include the actors' starting batch, "
                          f"env.num_groups / actors = {start} group(s).")
    per_group = config.unrolls_per_iteration * config.env.envs_per_group
    minibatches = config.ppo.num_minibatches
    if max_lag > 0 and (start * per_group) % minibatches:
        raise ConfigError(f"One actor's batch holds {start * per_group} segments, not a multiple of "
                          f"ppo.num_minibatches ({minibatches}); change the minibatch count or the actor count.")
    for groups in levels:
        if (groups * per_group) % minibatches:
            raise ConfigError(f"A batch of {groups} group(s) per actor (run.resources.group_levels) holds "
                              f"{groups * per_group} segments, not a multiple of ppo.num_minibatches ({minibatches}); "
                              f"change the levels or the minibatch count.")


def _with_params_health(update):
    """The learner's update, its metrics with the parameters' health flag (`jaxrose.nonfinite`)."""
    from jaxrose.nonfinite import params_health

    def checked(learner, batch):
        learner, metrics = update(learner, batch)
        return learner, {**metrics, **params_health(learner.params)}

    return checked


class AsyncTrainer:
    def __init__(self, config: TrainConfig, num_actors: int, max_lag: int,
                 actor_delays: Optional[dict[int, float]] = None, worker_env: Optional[dict] = None,
                 actor_envs: Optional[list[dict]] = None, env=None):
        """`env`: the env the actors step (pickled to them; e.g. a fault injector); None builds the config's."""
        if num_actors < 1 or config.env.num_groups % num_actors:
            raise ConfigError(f"env.num_groups ({config.env.num_groups}) must be a multiple of the number of actors "
                              f"({num_actors}): each actor owns whole env groups.")
        if max_lag < 0:
            raise ConfigError(f"The largest policy lag must be >= 0, got {max_lag}.")
        _check_batch_sizes(config, num_actors, max_lag)
        from jaxrose.sequential import SequentialExecutor

        self.config, self.num_actors, self.max_lag = config, num_actors, max_lag
        self.executor = SequentialExecutor(config, env=env)  # the learner, network and key layout
        self._custom_env = env
        self._update = jax.jit(_with_params_health(self.executor.learner.update))
        self._delays = actor_delays or {}
        self.groups = [config.env.num_groups // num_actors] * num_actors  # each actor's batch size
        envs = actor_envs or [worker_env] * num_actors
        self.actors = [self._worker(i, envs[i]) for i in range(num_actors)]
        self._states: dict = {}  # snapshot tag -> {actor: (env_state, key)}
        self._ready: dict[int, tuple[int, dict]] = {}  # actor -> (params version, unrolls) not yet consumed
        self._manager = None
        try:
            for actor in self.actors:
                actor.launch()
            for actor in self.actors:
                actor.wait_ready()
        except BaseException:
            self.close()
            raise

    def _worker(self, index: int, env: Optional[dict]) -> Worker:
        args = (self.config, index, self.num_actors, self._delays.get(index, 0.0), self._custom_env)
        return Worker(f"actor{index}", _actor, args, env)

    def template(self) -> Snapshot:
        """A snapshot of the initial state (the shapes a checkpoint restores into)."""
        state = self.executor.init(jax.random.PRNGKey(self.config.run.seed))
        actors = self._request_states("template", {i: "current" for i in range(self.num_actors)}, wait=True)
        return Snapshot(jax.device_get(state.learner), actors, 0, 0)

    def restart_actor(self, index: int, env: Optional[dict]) -> float:
        """Replaces actor `index` (between its rollouts, its trajectory consumed) by a new process
        with environment `env` (e.g. another SM quota), carrying its env state and key over.
        Returns the seconds it took."""
        start = time.perf_counter()
        state = self._request_states(f"restart{index}", {index: "current"}, wait=True)[0]
        self.actors[index].stop()
        self.actors[index] = self._worker(index, env)
        self.actors[index].start()
        self.actors[index].send(("restore", state))
        return time.perf_counter() - start

    def resize_actor(self, index: int, groups: int, update: int) -> None:
        """Gives actor `index` (between its rollouts) a batch of `groups` env groups from its next
        rollout on: a shrink drops its last groups, a growth adds groups reset from a key folded from
        the actor and `update` (the update the change goes out with), so a run is reproducible."""
        self.actors[index].send(("resize", groups, update))
        self.groups[index] = groups

    def _request_states(self, tag, which: dict[int, str], wait: bool) -> Optional[list]:
        self._states[tag] = {}
        for i, kind in which.items():
            self.actors[i].send(("state", tag, kind))
        if not wait:
            return None
        deadline = time.monotonic() + 300.0
        while len(self._states[tag]) < len(which):
            self._pump(deadline)
        states = self._states.pop(tag)
        return [states[i] for i in sorted(states)]

    def _batch(self, unrolls: dict, learner, lag: int):
        from jaxrose.ppo_program import to_batch

        batch, stats = to_batch(jax.tree.map(jnp.asarray, unrolls))
        if lag > 0:
            logits = self.executor.net.policy_logits(learner.params, learner.normalizer, batch.obs)
            batch = batch.replace(proximal_log_prob=distribution.log_prob(logits, batch.raw_action))
        return batch, stats

    def _finite_trajectories(self, taken: dict, version: int, nonfinite, skipped: list) -> list[int]:
        """The actors in `taken` whose trajectory is finite. A non-finite one stops the run, or is
        dropped with a warning and its actor told to reset its broken envs (before any snapshot
        asks for its state, so no checkpoint holds them)."""
        from jaxrose.nonfinite import trajectory_stages

        good = []
        for i, (collected, unrolls) in taken.items():
            stages, kind = trajectory_stages(unrolls), f"trajectories from actor{i}"
            if not stages:
                nonfinite.healthy(kind)
                good.append(i)
                continue
            finding = (f"Update {version + 1} received NaN or Inf in: {', '.join(stages)} (actor{i}'s trajectory, "
                       f"collected with the parameters of update {collected})")
            nonfinite.admit(version + 1, finding, kind)
            self.actors[i].send(("repair",))
            skipped.append({"update": version + 1, "stages": stages, "actor": i})
            nonfinite.warn(finding, f"that trajectory was dropped and actor{i}'s envs with a non-finite state are "
                                    f"reset before its next rollout", kind=kind)
        return good

    def _learn(self, learner, unrolls: dict, lag: int, version: int, nonfinite, skipped: list, used: list[int]):
        """(the learner after one update on `unrolls`, episode stats), or (None, stats) when the update
        produced NaN or Inf and is skipped (with `stop`, `nonfinite` raises instead)."""
        from jaxrose.nonfinite import bad_stages

        batch, stats = self._batch(unrolls, learner, lag)
        updated, metrics = self._update(learner, batch)
        stages = bad_stages({k: float(v) for k, v in jax.device_get(metrics).items()})
        if not stages:
            nonfinite.healthy("updates")
            return updated, stats
        finding = f"Update {version + 1} produced NaN or Inf in: {', '.join(stages)}"
        nonfinite.admit(version + 1, finding, "updates")
        skipped.append({"update": version + 1, "stages": stages, "actors": used})
        nonfinite.warn(finding, f"it was skipped (the parameters stay those of update {version})", kind="updates")
        return None, stats

    def _apply_resources(self, manager, take: list[int], version: int) -> None:
        """Quota restarts and batch sizes the manager decided, for the actors now between rollouts."""
        for i in take:
            env = manager.restart_env(i)
            if env is not None:
                manager.restarted(i, self.restart_actor(i, env))
            groups = manager.resize_to(i)
            if groups is not None:
                manager.resized(i, self.groups[i], groups, version)
                self.resize_actor(i, groups, version)

    def run(self, updates: Optional[int] = None, env_steps: Optional[int] = None, timeout: float = 300.0,
            on_update=None, start: Optional[Snapshot] = None, snapshot_due=None, on_snapshot=None,
            manager=None, nonfinite=None, should_stop=None) -> AsyncResult:
        """Runs until `updates` learner updates or `env_steps` consumed env steps (counted from the
        start of the run, so a resumed run has the same budget), whichever is given.
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
        if nonfinite is None:
            nonfinite = NonFinitePolicy(self.config.run, unit="update")
        if start is None:
            learner, version, consumed = self.executor.init(jax.random.PRNGKey(self.config.run.seed)).learner, 0, 0
        else:
            learner, version, consumed = jax.device_put(start.learner), start.updates, start.env_steps
            for i, (actor, state) in enumerate(zip(self.actors, start.actors, strict=True)):
                actor.send(("restore", state))
                self.groups[i] = groups_of(state[0])
        self._manager, self._ready = manager, {}
        if manager is not None:
            manager.start(self)
        params_sent = {}
        host_params = jax.device_get((learner.params, learner.normalizer))
        for i, actor in enumerate(self.actors):
            actor.send(("params", version, *host_params))
            params_sent[i] = version
        lags, depths, returns, shapes, skipped, batch_sizes = [], [], [], [], [], set()
        rollouts = {i: 0 for i in range(self.num_actors)}
        ready = self._ready
        pending: dict = {}  # snapshots waiting for actors' states
        start_time, done = time.perf_counter(), version
        steps_per_group_rollout = self.config.env_steps_per_iteration // self.config.env.num_groups
        while ((done < updates) if updates is not None else (consumed < env_steps)) and not (
                should_stop is not None and should_stop()):
            urgent = [i for i in range(self.num_actors) if version + 1 - params_sent[i] > self.max_lag]
            waited = self._gather(urgent or None, timeout)
            take = urgent if urgent else [min(ready, key=lambda i: ready[i][0])]
            depths.append(len(ready))
            taken = {i: ready.pop(i) for i in take}
            consumed += sum(_trajectory_groups(u) for _, u in taken.values()) * steps_per_group_rollout
            used = self._finite_trajectories(taken, version, nonfinite, skipped)
            batch_lags = [version - taken[i][0] for i in used]
            updated, stats = None, None
            if used:
                trajectory = _concatenate([taken[i][1] for i in used])
                batch_sizes.add(_segments(trajectory))
                updated, stats = self._learn(learner, trajectory, max(batch_lags), version, nonfinite, skipped, used)
            if updated is not None:
                learner, version, done = updated, version + 1, done + 1
                lags.extend(batch_lags)
                shapes.extend((i, _trajectory_groups(taken[i][1])) for i in used)
                if float(stats["episodes"]) > 0:
                    returns.append(float(stats["episode_return"]))
                if snapshot_due is not None and snapshot_due(version, consumed):
                    pending[version] = self._snapshot_request(version, consumed, learner, take)
            if manager is not None:
                manager.on_update(time.perf_counter(), batch_lags, depths[-1], waited)
                self._apply_resources(manager, take, version)
            host_params = jax.device_get((learner.params, learner.normalizer))
            for i in take:
                rollouts[i] += 1
                self.actors[i].send(("params", version, *host_params))
                params_sent[i] = version
            self._deliver(pending, on_snapshot)
            if on_update is not None and updated is not None:
                on_update(done, consumed, learner, {"lags": batch_lags, "queue_depth": depths[-1],
                                                 "episode_return": float(stats["episode_return"]),
                                                 "episodes": float(stats["episodes"]),
                                                 "groups_per_actor": list(self.groups),
                                                 "skipped": len(skipped)})
        wall = time.perf_counter() - start_time
        if on_snapshot is not None:
            if version not in pending:  # every actor is rolling out from the state to save by now
                pending[version] = self._snapshot_request(version, consumed, learner, [])
            deadline = time.monotonic() + timeout
            while pending:
                self._pump(deadline)
                self._deliver(pending, on_snapshot)
        # Every actor has one rollout out: wait for it, so the actors are idle and a later `run` starts clean.
        deadline = time.monotonic() + timeout
        while len(ready) < self.num_actors:
            self._pump(deadline)
        ready.clear()
        return AsyncResult(learner, done - (start.updates if start else 0), lags, rollouts, depths, wall,
                           consumed - (start.env_steps if start else 0), returns,
                           list(manager.decisions) if manager is not None else [], shapes, list(self.groups),
                           sorted(batch_sizes), skipped)

    def _snapshot_request(self, version: int, consumed: int, learner, take: list[int]) -> tuple:
        """Asks every actor for the state its next unconsumed rollout starts from (see the module doc)."""
        self._request_states(("snapshot", version), {i: "current" if i in take else "start"
                                                     for i in range(self.num_actors)}, wait=False)
        return jax.device_get(learner), consumed

    def _deliver(self, pending: dict, on_snapshot) -> None:
        for version in [v for v in pending if len(self._states[("snapshot", v)]) == self.num_actors]:
            learner, consumed = pending.pop(version)
            states = self._states.pop(("snapshot", version))
            if on_snapshot is not None:
                on_snapshot(Snapshot(learner, [states[i] for i in range(self.num_actors)], version, consumed))

    def _pump(self, deadline: float) -> None:
        """Receives whatever the actors sent (trajectories, states), waiting up to 0.5 s for something."""
        if not wait([a._conn for a in self.actors], timeout=0.5):
            for actor in self.actors:
                if not actor.process.is_alive():
                    raise actor.death_error("while rolling out")
            if time.monotonic() > deadline:
                raise TimeoutError("No trajectory arrived within the timeout.")
            return
        for actor in self.actors:
            while actor.poll():
                message = actor.receive(60.0)
                if message[0] == "state":
                    _, index, tag, state = message
                    self._states[tag][index] = state
                    continue
                _, index, version, unrolls, seconds = message
                self._ready[index] = (version, unrolls)
                if self._manager is not None:
                    self._manager.on_trajectory(index, seconds)

    def _gather(self, needed: Optional[list[int]], timeout: float) -> float:
        """Receives trajectories: at least one if `needed` is None, else one from each needed actor.
        Returns the seconds the learner waited."""
        start, ready = time.perf_counter(), self._ready
        deadline = time.monotonic() + timeout
        while (needed is None and not ready) or (needed and any(i not in ready for i in needed)):
            self._pump(deadline)
        return time.perf_counter() - start

    def close(self) -> None:
        for actor in self.actors:
            actor.stop()
