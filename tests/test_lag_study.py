"""The fixed-lag study: lag 0 is the sequential executor's training, each update's trajectory comes
from the parameters `lag` updates before, and the summary is the seeds' arithmetic."""

import json
import os

import jax
import numpy as np
import pytest

from jaxrose.config import ConfigError, replace
from jaxrose.lag_study import LagRun, main, render_markdown, summary_rows, train_with_lag
from jaxrose.sequential import SequentialExecutor


def test_lag_zero_is_the_sequential_executors_training(tiny_config):
    run = train_with_lag(tiny_config, lag=0, seed=3)
    executor = SequentialExecutor(replace(tiny_config, **{"run.seed": 3}))
    state, history = executor.run(executor.init(jax.random.PRNGKey(3)), tiny_config.num_iterations)
    for ours, reference in zip(jax.tree.leaves(run.learner.params), jax.tree.leaves(state.learner.params)):
        np.testing.assert_allclose(ours, reference, rtol=2e-5, atol=2e-6)
    assert run.behaviour_versions == list(range(tiny_config.num_iterations))
    assert run.off_policy_weight == [1.0] * tiny_config.num_iterations
    np.testing.assert_allclose(run.clip_fraction, [m["train/clip_fraction"] for m in history], atol=1e-6)
    assert run.env_steps == [0, 1024, 2048] and len(run.returns) == 3


@pytest.mark.parametrize("correction", ["decoupled", "vtrace", "behaviour"])
def test_each_update_learns_from_parameters_lag_updates_old(tiny_config, correction):
    config = replace(tiny_config, **{"run.total_env_steps": 6 * 512, "run.num_evals": 2})
    run = train_with_lag(config, lag=2, correction=correction)
    assert run.behaviour_versions == [0, 0, 0, 1, 2, 3]
    weights = np.array(run.off_policy_weight)
    if correction == "behaviour":  # no correction: the loss's weight stays one
        np.testing.assert_array_equal(weights, 1.0)
    else:  # the first update's data is its own policy's; afterwards the policies differ, min(ratio, 1) < 1
        np.testing.assert_allclose(weights[0], 1.0, rtol=1e-5)
        assert np.all(weights[1:] < 0.9999), weights


def test_corrections_differ_only_when_data_is_stale(tiny_config):
    learned = {c: train_with_lag(tiny_config, lag=1, correction=c).learner.params for c in ("decoupled", "behaviour")}
    a, b = (jax.tree.leaves(p) for p in learned.values())
    assert any(not np.array_equal(x, y) for x, y in zip(a, b))


def test_bad_settings_name_the_fix(tiny_config):
    with pytest.raises(ConfigError, match="lag must be >= 0"):
        train_with_lag(tiny_config, lag=-1)
    with pytest.raises(ConfigError, match="decoupled, vtrace, behaviour"):
        train_with_lag(tiny_config, lag=1, correction="impala")


def _run(lag, correction, seed, returns, clip_fraction=(0.0, 0.0)):
    return LagRun(lag, correction, seed, [0, 100, 200], returns, [], [], list(clip_fraction), 1.0)


def test_summary_by_hand():
    runs = [_run(0, "decoupled", 0, [0.0, 10.0, 30.0]), _run(0, "decoupled", 1, [0.0, 20.0, 50.0]),
            _run(4, "vtrace", 0, [0.0, 5.0, 10.0], (0.1, 0.3)), _run(4, "vtrace", 1, [0.0, 0.0, 40.0], (0.4, 0.4))]
    rows = summary_rows(runs, threshold=25.0)
    assert [(r["lag"], r["correction"]) for r in rows] == [(0, "any"), (4, "vtrace")]
    assert rows[0]["final_return"] == 40.0 and rows[0]["final_return_std"] == pytest.approx(np.std([30, 50], ddof=1))
    assert rows[0]["mean_return"] == pytest.approx(27.5)  # mean of (10 + 30) / 2 and (20 + 50) / 2
    assert rows[1]["mean_return_std"] == pytest.approx(np.std([7.5, 20.0], ddof=1))
    assert rows[0]["median_steps_to_threshold"] == 200 and rows[0]["seeds_reaching"] == 2
    assert rows[1]["median_steps_to_threshold"] == 200 and rows[1]["seeds_reaching"] == 1
    assert rows[1]["clip_fraction"] == pytest.approx(0.3)  # seeds' means 0.2 and 0.4
    # The evaluation before training never counts as reaching a threshold (it did: 0 env steps).
    assert _run(0, "decoupled", 0, [5.0, 4.0, 6.0]).steps_to(5.0) == 200
    table = render_markdown(rows, "toy", 200)
    assert "| 4 | vtrace | 2 | 25.0 ± 21.2 | 13.8 ± 8.8 | 0.300 | 200 (1/2) |" in table


def test_command_writes_results_table_and_plot(tmp_path):
    out = str(tmp_path / "study")
    main(["--preset", "point-mass", "--lags", "0", "1", "--corrections", "decoupled", "--env-steps", "10240",
          "--num-evals", "2", "--return-threshold", "1e9", "--out", out, "--", "--ppo.max-off-policy-weight", "2"])
    with open(os.path.join(out, "results.json")) as f:
        results = json.load(f)
    assert [(r["lag"], r["correction"]) for r in results["runs"]] == [(0, "decoupled"), (1, "decoupled")]
    assert results["summary"][1]["seeds_reaching"] == 0
    assert results["config"]["ppo"]["max_off_policy_weight"] == 2.0  # the setting after `--` reached the runs
    assert os.path.getsize(os.path.join(out, "lag_study.png")) > 10_000
    with open(os.path.join(out, "results.md")) as f:
        assert "| 1 | decoupled | 1 |" in f.read()
