"""The learning-curve PNG written at the end of a run."""

from __future__ import annotations

import json


def plot_learning_curve(metrics_path: str, png_path: str, title: str = "") -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, returns, train_steps, train_returns = [], [], [], []
    with open(metrics_path) as f:
        for line in f:
            record = json.loads(line)
            if record.get("eval/episode_return") is not None:
                steps.append(record["step"])
                returns.append(record["eval/episode_return"])
            if record.get("train/episode_return") is not None and record.get("train/episodes", 0):
                train_steps.append(record["step"])
                train_returns.append(record["train/episode_return"])
    fig, ax = plt.subplots(figsize=(6, 4))
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
