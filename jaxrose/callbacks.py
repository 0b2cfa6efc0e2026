"""Metric sinks hanging off one hook, `callback(step, metrics)` (brax's `progress_fn` idea).

Metric names are namespaced: `train/...`, `eval/...`, `perf/...`. TensorBoard is imported only
when its sink is created.
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable, Mapping

Callback = Callable[[int, Mapping[str, float]], None]


class JsonlWriter:
    """Appends one JSON record per call. The file opens at the first record, so a resumed run can drop
    the records past its checkpoint first (`run_folder.drop_metrics_after`)."""

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.path = path
        self._file = None

    def __call__(self, step: int, metrics: Mapping[str, float]) -> None:
        if self._file is None:
            self._file = open(self.path, "a", buffering=1)
        record = {"step": int(step), **{k: _jsonable(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TensorBoardWriter:
    def __init__(self, log_dir: str):
        from tensorboardX import SummaryWriter  # optional dependency, imported where used

        self._writer = SummaryWriter(log_dir)

    def __call__(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self._writer.add_scalar(name, value, step)

    def close(self) -> None:
        self._writer.close()


class ProgressBar:
    """A tqdm bar over env steps showing steps/s and the latest returns."""

    def __init__(self, total_env_steps: int, initial: int = 0):
        from tqdm.auto import tqdm

        self._bar = tqdm(total=total_env_steps, initial=initial, unit="step", unit_scale=True,
                         dynamic_ncols=True, desc="train")
        self._postfix: dict[str, str] = {}

    def __call__(self, step: int, metrics: Mapping[str, float]) -> None:
        self._bar.update(max(0, step - self._bar.n))
        for name, label in (("eval/episode_return", "eval"), ("train/episode_return", "train"),
                            ("perf/sps", "sps")):
            if label == "train" and metrics.get("train/episodes", 1) == 0:
                continue  # no episode ended in this iteration: its mean return of 0 is no return; keep the last
            if name in metrics and isinstance(metrics[name], (int, float)) and math.isfinite(metrics[name]):
                self._postfix[label] = f"{metrics[name]:.4g}"
        self._bar.set_postfix(self._postfix, refresh=False)

    def close(self) -> None:
        self._bar.close()


class WandbWriter:
    """Optional: logs to Weights & Biases if `wandb` is installed."""

    def __init__(self, **init_kwargs):
        import wandb  # optional dependency, imported where used

        self._run = wandb.init(**init_kwargs)

    def __call__(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
