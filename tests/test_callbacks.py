"""The progress bar shows the latest returns, not an iteration's placeholder."""

from jaxrose.callbacks import ProgressBar


def test_progress_bar_keeps_the_last_train_return_through_iterations_where_no_episode_ended():
    bar = ProgressBar(total_env_steps=100)
    bar(10, {"train/episode_return": -200.0, "train/episodes": 3.0, "perf/sps": 1000.0})
    assert bar._postfix == {"train": "-200", "sps": "1000"}
    # No episode ended: the iteration's mean return is 0 by construction (sum over no episodes), not a return.
    bar(20, {"train/episode_return": 0.0, "train/episodes": 0.0, "eval/episode_return": -150.0, "perf/sps": 1100.0})
    assert bar._postfix == {"train": "-200", "eval": "-150", "sps": "1100"}
    bar(30, {"train/episode_return": -120.0, "train/episodes": 1.0})
    assert bar._postfix["train"] == "-120" and bar._bar.n == 30
    bar(40, {"train/episode_return": float("nan")})  # a non-finite value keeps the last one too
    assert bar._postfix["train"] == "-120"
    bar.close()
