"""The learning-curve PNG written at the end of a run."""

from __future__ import annotations

import json


def plot_learning_curve(metrics_path: str, png_path: str, title: str = "") -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, returns, train_steps, train_returns, success_steps, successes = [], [], [], [], [], []
    with open(metrics_path) as f:
        for line in f:
            record = json.loads(line)
            if record.get("eval/episode_return") is not None:
                steps.append(record["step"])
                returns.append(record["eval/episode_return"])
            if record.get("eval/success_rate") is not None:
                success_steps.append(record["step"])
                successes.append(record["eval/success_rate"])
            if record.get("train/episode_return") is not None and record.get("train/episodes", 0):
                train_steps.append(record["step"])
                train_returns.append(record["train/episode_return"])
    # Tasks with a success metric (manipulation) get a second panel: the share of evaluation
    # episodes that end in success.
    fig, axes = plt.subplots(1, 2 if successes else 1, figsize=(11 if successes else 6, 4), squeeze=False)
    ax = axes[0][0]
    if successes:
        other = axes[0][1]
        other.plot(success_steps, successes, "o-", color="tab:green")
        other.set_xlabel("env steps")
        other.set_ylabel("evaluation success rate")
        other.set_ylim(-0.02, 1.02)
        other.grid(alpha=0.3)
    if train_steps:
        ax.plot(train_steps, train_returns, color="0.6", lw=1, label="training episodes")
    ax.plot(steps, returns, "o-", label="evaluation")
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return png_path
