"""Learning outcomes: a tiny env learns, and jaxrose's PPO matches brax's PPO run for run."""

import numpy as np
import pytest

from jaxrose import get_preset, train
from jaxrose.bench_brax import brax_jax_compat, brax_kwargs
from jaxrose.config import replace

BUDGET = 150_000


def point_mass_config(seed: int, out_dir: str):
    return replace(get_preset("point-mass"), **{
        "run.total_env_steps": BUDGET, "run.num_evals": 6, "run.seed": seed, "run.out_dir": out_dir,
        "run.progress_bar": False, "run.tensorboard": False})


def brax_final_return(config) -> float:
    """brax's PPO on the same env object with the settings mapped by the benchmark harness."""
    import envs
    from brax.training.agents.ppo import train as brax_ppo

    evals = []
    kwargs, _ = brax_kwargs(config)
    with brax_jax_compat():
        brax_ppo.train(envs.make(config.env.name), **kwargs,
                       progress_fn=lambda step, metrics: evals.append(float(metrics["eval/episode_reward"])))
    return evals[-1]


@pytest.fixture(scope="module")
def our_runs(tmp_path_factory):
    """jaxrose's runs for seeds 0 and 1, trained once for both tests below (seed 0 writes its outputs)."""
    out = tmp_path_factory.mktemp("learning")
    return {seed: train(point_mass_config(seed, str(out / str(seed))), write_outputs=seed == 0) for seed in (0, 1)}


@pytest.mark.slow
def test_point_mass_learns(our_runs):
    result = our_runs[0]
    first, last = result.evaluations[0]["eval/episode_return"], result.final_return
    assert last > 120.0 and last > first + 80.0, (first, last)


@pytest.mark.slow
def test_final_return_matches_brax_ppo(our_runs):
    """Same env, settings, budget and eval protocol; two seeds each. The runs' random streams differ,
    so agreement is within seed noise: |mean difference| <= max(3 pooled std, 15% of brax's mean)."""
    ours = [our_runs[seed].final_return for seed in (0, 1)]
    theirs = [brax_final_return(point_mass_config(seed, "")) for seed in (0, 1)]
    pooled_std = np.sqrt((np.var(ours, ddof=1) + np.var(theirs, ddof=1)) / 2)
    tolerance = max(3 * pooled_std, 0.15 * abs(np.mean(theirs)))
    assert abs(np.mean(ours) - np.mean(theirs)) <= tolerance, (ours, theirs, tolerance)
    assert min(theirs) > 100.0 and min(ours) > 100.0, (ours, theirs)
