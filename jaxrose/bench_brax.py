"""brax's own PPO as `jaxrose bench`'s baseline: the JAX compatibility shim it needs (kept here, not
in the library), its env and settings from a jaxrose config, and its steady-state figures.

brax 0.14.2 calls `jax.device_put_replicated`, which JAX 0.10 removed; `brax_jax_compat` supplies
it while brax runs.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time

@contextlib.contextmanager
def brax_jax_compat():
    """Supplies `jax.device_put_replicated` (removed in JAX 0.10, still called by brax 0.14.2) while brax runs."""
    import jax

    if hasattr(jax, "device_put_replicated"):
        yield
        return
    jax.device_put_replicated = _device_put_replicated
    try:
        yield
    finally:
        del jax.device_put_replicated


def _device_put_replicated(tree, devices):
    """One copy per device, stacked on a new leading axis that is sharded over `devices`, as pmap expects."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from brax.training.agents.ppo import train as brax_ppo

    # The mesh axis must carry pmap's axis name: arrays placed here then have the same sharding as
    # pmap's outputs, and brax's epoch function is compiled once instead of twice.
    axis = getattr(brax_ppo, "_PMAP_AXIS_NAME", "i")
    sharding = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(devices), (axis,)),
                                          jax.sharding.PartitionSpec(axis))
    count = len(devices)
    return jax.tree.map(lambda x: jax.device_put(jnp.broadcast_to(jnp.asarray(x)[None], (count,) + jnp.shape(x)),
                                                 sharding), tree)


def make_brax_env(config):
    """The run's env as jaxrose builds it (the registry's task, randomized per env if the preset asks),
    passed to brax as it is; brax adds its own episode, vmap and auto-reset wrappers.

    brax's wrappers add keys to `state.metrics` in place (its EvalWrapper adds 'reward'), so an env
    must carry unknown metric keys through `step`, as brax's envs and jaxrose's envs do (tested).
    The registry's brax tasks trace their `observation_size` abstractly (`envs.brax_mjx`) where brax's
    runs a reset op by op; that shortens brax's start-up here too, not its steady state.
    """
    from jaxrose.sequential import make_env

    return make_env(config)


def brax_kwargs(config) -> tuple[dict, list[str]]:
    """brax `ppo.train` keyword arguments for a TrainConfig, and notes where the mapping is inexact."""
    from brax.training.agents.ppo import networks as ppo_networks

    from jaxrose.networks import ACTIVATIONS

    env, net, ppo, run = config.env, config.network, config.ppo, config.run
    notes = []
    if ppo.bootstrap_on_truncation:
        notes.append("ppo.bootstrap_on_truncation=True has no exact brax equivalent (brax's bootstrap_on_timeout "
                     "needs info['time_out'] from the env and bootstraps with the value of the pre-reset state); "
                     "brax ran without bootstrapping.")
    if env.num_groups != 1:
        notes.append(f"env.num_groups={env.num_groups} has no brax equivalent; brax ran one group of "
                     f"{env.num_envs} envs.")
    if net.compute_dtype != "float32":
        notes.append(f"network.compute_dtype={net.compute_dtype} has no brax equivalent; brax's networks ran in "
                     f"float32.")
    if ppo.minibatch_segments is not None:
        notes.append(f"ppo.minibatch_segments={ppo.minibatch_segments} has no brax equivalent; brax split each "
                     f"batch into ppo.num_minibatches={ppo.num_minibatches} minibatches.")
    network_factory = functools.partial(ppo_networks.make_ppo_networks,
                                        policy_hidden_layer_sizes=tuple(net.policy_hidden),
                                        value_hidden_layer_sizes=tuple(net.value_hidden),
                                        activation=ACTIVATIONS[net.activation])
    kwargs = dict(
        num_timesteps=run.total_env_steps, num_evals=run.num_evals, episode_length=env.episode_length,
        num_envs=env.num_envs, batch_size=ppo.batch_size, num_minibatches=ppo.num_minibatches,
        unroll_length=ppo.unroll_length, num_updates_per_batch=ppo.num_updates_per_batch,
        discounting=ppo.discounting, learning_rate=ppo.learning_rate, entropy_cost=ppo.entropy_cost,
        reward_scaling=ppo.reward_scaling, normalize_observations=ppo.normalize_observations,
        gae_lambda=ppo.gae_lambda, clipping_epsilon=ppo.clipping_epsilon, max_grad_norm=ppo.max_grad_norm,
        normalize_advantage=ppo.normalize_advantage, vf_loss_coefficient=ppo.vf_loss_coefficient,
        seed=run.seed, num_eval_envs=run.num_eval_envs, deterministic_eval=run.deterministic_eval,
        network_factory=network_factory,
        # One GPU, like jaxrose: brax would otherwise pmap over every local device.
        max_devices_per_host=1,
    )
    return kwargs, notes


def run_brax(config, sampler) -> dict:
    """brax PPO on the preset; throughput from its per-epoch `training/sps` and its progress calls."""
    from brax.training.agents.ppo import train as brax_ppo

    if config.network.policy != "mlp" or config.network.history > 1:
        # brax's PPO has no such policy: a brax run would measure a different workload.
        return {"status": "skipped", "reason": f"brax PPO has no {config.network.policy} policy over an "
                                               f"observation history; compare jaxrose schedules for this preset."}
    calls: list[tuple[float, int, dict]] = []  # (host time, env steps, metrics) per progress_fn call

    def progress(step, metrics):
        t = sampler.mark(f"brax/progress_{len(calls)}")
        calls.append((t, int(step), {k: float(v) for k, v in metrics.items()}))

    kwargs, notes = brax_kwargs(config)
    start = time.perf_counter()
    env = make_brax_env(config)
    with brax_jax_compat():
        brax_ppo.train(env, progress_fn=progress, **kwargs)
    total = time.perf_counter() - start

    # calls[0]: the evaluation before training; calls[k >= 1]: epoch k then its evaluation.
    epoch_sps = [m["training/sps"] for _, _, m in calls[1:]]
    steps_per_epoch = calls[1][1] - calls[0][1]
    epoch_seconds = [steps_per_epoch / sps for sps in epoch_sps]
    result = _steady_summary(epoch_sps[1:], calls[1], calls[-1], sampler)
    result.update(
        status="ok", notes=notes, total_wall_seconds=total, seconds_to_steady=calls[1][0] - start,
        steps_per_epoch=steps_per_epoch, epoch_sps=epoch_sps, epoch_seconds=epoch_seconds,
        first_epoch_seconds=epoch_seconds[0],
        # Compilation happens inside brax's first epoch: its time beyond a steady epoch's.
        compile_seconds=epoch_seconds[0] - statistics.median(epoch_seconds[1:]),
        eval_seconds=[m["eval/epoch_eval_time"] for _, _, m in calls],
        eval_returns=[m["eval/episode_reward"] for _, _, m in calls],
        eval_env_steps=[step for _, step, _ in calls],
        final_return=calls[-1][2]["eval/episode_reward"],
        eval_done_seconds=[t - start for t, _, _ in calls],  # wall clock from the call's start
    )
    return result


def _steady_summary(steady_sps: list[float], first_call, last_call, sampler) -> dict:
    """Steady numbers shared by brax and jaxrose, from the per-epoch or per-iteration steps/s of the
    steady part and the (time, env steps) of the progress calls that open and close the steady window."""
    (t0, steps0, _), (t1, steps1, _) = first_call, last_call
    wall = t1 - t0
    return {
        "steady_sps": statistics.median(steady_sps) if steady_sps else float("nan"),
        "steady_env_steps": steps1 - steps0,
        "steady_wall_seconds": wall,
        "steady_sps_with_evals": (steps1 - steps0) / wall if wall > 0 else float("nan"),
        "window": [t0, t1],
        "sm": sampler.mean(t0, t1),
    }
