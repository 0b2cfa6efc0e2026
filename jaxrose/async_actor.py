"""The actor side of the asynchronous mode (`jaxrose.async_mode`): a spawned process that owns some
env groups, rolls them out with the newest parameters it was sent whenever it holds a credit, and
hands each trajectory back through its transport buffers. The learner side, the credits and the lag
bound are `jaxrose.async_mode`'s."""

from __future__ import annotations

import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrose.config import TrainConfig
from jaxrose.precompile import Precompiler, abstract, resized_axis
from jaxrose.workers import Inbox


def run_actor(conn, config: TrainConfig, index: int, num_actors: int, delay_seconds: float, env=None) -> None:
    """Actor process: its env groups, the rollout stages, parameters in, trajectories out. `env`:
    the env to step (a fault injector in tests); None builds the config's.

    It rolls out whenever it holds a credit (the learner grants `1 + run_ahead` per actor, one more
    per trajectory consumed) with the newest parameters it has. Rollout `seq` starts from the state
    rollout `seq - 1` ended in (`starts[seq]`, kept until the learner reports it consumed, for
    snapshots). A trajectory goes back through this actor's transport buffers for its batch size
    (slot `seq % slots`; the learner copies it out on receipt) or, before the learner has sent
    buffers for that size, through the pipe. With `run.on_nonfinite='skip'` an actor whose
    trajectory holds NaN or Inf resets its broken envs before its next rollout, so no later rollout
    (one started ahead included) and no snapshot starts from them."""
    from envs.wrappers import wrap_for_training
    from jaxrose.networks import make_actor_critic
    from jaxrose.nonfinite import reset_broken_envs, trajectory_stages
    from jaxrose.ppo_program import rollout_nodes
    from jaxrose.program import Program, run_program
    from jaxrose.sequential import make_env
    from jaxrose.transport import attach, publish, take

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

    resizers: dict[tuple[int, int], object] = {}

    def resizer(have: int, size: int):
        """The jitted change of an env state from `have` to `size` groups; new groups' envs are reset
        from a key that depends only on the actor and the update of the change (an int32 argument)."""
        if (have, size) not in resizers:
            def resize(env_state, update):
                key = jax.random.fold_in(jax.random.fold_in(env_key, index), update)
                return resized(env_state, size, lambda count: layout(count).reset(key))
            resizers[(have, size)] = jax.jit(resize)
        return resizers[(have, size)]

    levels = config.run.resources.group_levels if config.run.resources.manager == "on" else ()
    precompiler = Precompiler(f"actor{index}") if len(levels) > 1 else None
    precompiling, reported = False, (0, False)  # compiles submitted; (finished, all done) as the learner knows

    def precompile_levels(params, normalizer, env_state, key):
        """Every other batch size's rollout, and the resizes between neighbouring levels, compiled
        in the background while this size runs (`jaxrose.precompile`), the moves open from this size first."""
        update = jax.ShapeDtypeStruct((), np.int32)
        weights = jax.tree.map(abstract, (params, normalizer))
        for have, size in precompile_order(levels, groups_of(env_state)):
            if have is None:
                args = (*weights, resized_axis(env_state, 0, lambda _, size=size: size), abstract(key))
                precompiler.submit(rollout_label(size), lambda args=args: collect.lower(*args).compile())
            else:
                state = resized_axis(env_state, 0, lambda _, have=have: have)
                precompiler.submit(resize_label(have, size), lambda have=have, size=size, state=state:
                                   resizer(have, size).lower(state, update).compile())

    @jax.jit
    def repair(env_state, key):
        return reset_broken_envs(layout(groups_of(env_state)), env_state, key)[0]

    skip_nonfinite = config.run.on_nonfinite == "skip"
    inbox = Inbox(conn)
    conn.send(("ready", {"platform": jax.devices()[0].platform, "groups": groups}))
    seq, credits, newest = 0, 0, None  # next rollout; rollouts granted; (version, params, normalizer)
    last_sent = None  # when the previous trajectory went out: the gap to the next rollout is idle time
    starts = {0: (env_state, key)}  # start state of every rollout not yet consumed, and of the next
    buffers: dict[int, list] = {}  # batch size (groups) -> transport slots
    try:
        while True:
            message = inbox.get(block=credits == 0 or newest is None)
            if message is not None:
                kind = message[0]
                if kind == "stop":
                    return
                if kind == "params":
                    newest = message[1:]
                elif kind == "credit":
                    _, granted, consumed = message
                    credits += granted
                    for done in [s for s in starts if s < consumed]:
                        del starts[done]
                elif kind == "state":  # the start of rollout `which`: the next one's if it has not begun
                    _, tag, which = message
                    conn.send(("state", index, tag, publish(starts[which])))
                elif kind == "restore":  # its group count is the restored state's
                    _, published, seq = message
                    starts, credits = {seq: jax.device_put(take(published))}, 0
                elif kind == "resize":
                    _, size, update = message
                    env_state, key = starts[seq]
                    starts[seq] = (resizer(groups_of(env_state), size)(env_state, np.int32(update)), key)
                elif kind == "warm":  # a standby process: compile the rollout it will run first, then say so
                    _, size = message
                    began = time.perf_counter()
                    state, state_key = starts[seq]
                    args = (*jax.tree.map(abstract, newest[1:]), resized_axis(state, 0, lambda _: size),
                            abstract(state_key))
                    collect.lower(*args).compile()
                    conn.send(("warmed", index, time.perf_counter() - began))
                elif kind == "buffers":
                    _, size, descriptions = message
                    buffers[size] = [attach(d) for d in descriptions]
                continue
            version, params, normalizer = newest
            began = time.perf_counter()
            env_state, key, unrolls = collect(params, normalizer, *starts[seq])
            jax.block_until_ready(unrolls)  # the hand-off below waits for them anyway: time the two apart
            collected = time.perf_counter()
            if precompiler is not None and not precompiling:  # the running size compiled: the others next
                precompile_levels(params, normalizer, *starts[seq])
                precompiling = True
            if precompiler is not None and precompiling and not reported[1]:  # the learner resizes only to these
                # All done (failed compiles included): the manager measures only after it (its threads take
                # the CPU, and the actor idled between rollouts, while they ran).
                finished = precompiler.wait(0)  # read first: a compile ending between the reads is then counted
                progress = (len(precompiler.compiled), finished)
                if progress != reported:
                    conn.send(("precompiled", index, list(precompiler.compiled)[:progress[0]], progress[1]))
                    reported = progress
            size = trajectory_groups(unrolls)
            if size in buffers:
                slot = seq % len(buffers[size])
                buffers[size][slot].write(unrolls)
                payload = ("slot", slot)
            else:
                payload = ("pipe", jax.device_get(unrolls))
            handed = time.perf_counter()
            if delay_seconds:
                time.sleep(delay_seconds)  # fault injection for tests: a deliberately slow group
            sent = time.perf_counter()
            timing = {"collect": collected - began, "hand_off": handed - collected,
                      "idle_before": began - last_sent if last_sent is not None else None}
            conn.send(("trajectory", index, seq, version, size, payload, sent - began, timing))
            last_sent = sent
            if skip_nonfinite and trajectory_stages(unrolls):  # after the send: the repair may compile
                key, repair_key = jax.random.split(key)
                env_state = repair(env_state, repair_key)
            seq, credits = seq + 1, credits - 1
            starts[seq] = (env_state, key)
    finally:
        if precompiler is not None:
            precompiler.close()
        for slots in buffers.values():
            for slot in slots:
                slot.close()


def precompile_order(levels: tuple[int, ...], current: int) -> list[tuple[Optional[int], int]]:
    """The programs an actor at `current` groups compiles ahead, in order: (None, n) the rollout of n
    groups, (h, n) the resize from h to n. A move to a neighbouring level needs both its rollout and
    the resize from `current`, so those come first (growth first: the manager's move when the learner
    starves; a lag target's shrink next); then every other level's rollout and the resizes between
    the other neighbouring levels, nearest first. Each compile takes seconds to tens of seconds on the
    GPU, so an order that led with resizes into `current` left a run started at the top level
    unable to shrink for its whole length (BENCHMARKS.md, session 33)."""
    if current not in levels:
        levels = tuple(sorted({*levels, current}))
    position = levels.index(current)
    neighbours = [levels[j] for j in (position + 1, position - 1) if 0 <= j < len(levels)]
    order: list[tuple[Optional[int], int]] = []
    for size in neighbours:
        order += [(None, size), (current, size)]
    for size in sorted(levels, key=lambda g: (abs(g - current), g < current)):
        if size != current and (None, size) not in order:
            order.append((None, size))
        i = levels.index(size)
        for have in (levels[j] for j in (i - 1, i + 1) if 0 <= j < len(levels)):
            if (have, size) not in order:
                order.append((have, size))
    return order


def rollout_label(size: int) -> str:
    """What an actor reports once its rollout for `size` groups is compiled ahead."""
    return f"rollout of {size} groups"


def resize_label(have: int, size: int) -> str:
    """What an actor reports once its resize from `have` to `size` groups is compiled ahead."""
    return f"resize {have}->{size}"


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


def trajectory_groups(unrolls: dict) -> int:
    return unrolls["reward"].shape[2]  # [U, T, G, E]
