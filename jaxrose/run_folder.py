"""A run's output folder never mixes two runs: a fresh run moves an earlier run's outputs aside, and a
run resumed in place drops the metrics the earlier run logged after its checkpoint.

Without this, a second `jaxrose train` into the same `run.out_dir` appended to the first run's
`metrics.jsonl` and then failed on its first save (orbax refuses a step number that exists), and a
later `--run.resume` took the first run's newer step.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from typing import Optional

# What `train` writes into run.out_dir; nothing else there is touched.
OUTPUTS = ("checkpoints", "metrics.jsonl", "config.json", "learning_curve.png", "tensorboard", "resources.jsonl")
EARLIER_RUNS = "earlier-runs"


class EarlierRunWarning(UserWarning):
    """run.out_dir held another run's outputs; they were moved aside, not overwritten."""


def resumes_in_place(out_dir: str, resume: Optional[str]) -> bool:
    return bool(resume) and os.path.realpath(os.path.abspath(resume)) == os.path.realpath(os.path.abspath(out_dir))


def set_aside_earlier_run(out_dir: str, resume: Optional[str]) -> Optional[str]:
    """For a run that does not resume `out_dir` itself: moves the outputs of an earlier run found there
    to `out_dir/earlier-runs/<UTC time>/` with a warning, and returns that folder (None if none)."""
    if resumes_in_place(out_dir, resume):
        return None
    return set_aside(out_dir, OUTPUTS, "run.out_dir", f"To continue that run instead, pass --run.resume {out_dir} "
                     f"(and move them back); to keep runs apart, give each its own --run.out-dir.")


def set_aside(out_dir: str, outputs, setting: str, advice: str = "") -> Optional[str]:
    """Moves the `outputs` (names in `out_dir`) an earlier run or study left there to
    `out_dir/earlier-runs/<UTC time>/` with a warning naming `setting`; returns that folder (None if none)."""
    present = [name for name in outputs if _holds_something(os.path.join(out_dir, name))]
    if not present:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    target, n = os.path.join(out_dir, EARLIER_RUNS, stamp), 1
    while os.path.exists(target):
        n += 1
        target = os.path.join(out_dir, EARLIER_RUNS, f"{stamp}-{n}")
    os.makedirs(target)
    for name in outputs:
        if os.path.lexists(os.path.join(out_dir, name)):
            os.replace(os.path.join(out_dir, name), os.path.join(target, name))
    warnings.warn(f"{setting} {out_dir} held an earlier run's outputs ({', '.join(present)}); they were moved to "
                  f"{target}, not overwritten. {advice}".rstrip(), EarlierRunWarning, stacklevel=3)
    return target


def write_atomically(path: str, text: str) -> None:
    """Writes `text` to `path` through a temporary file and a rename: a kill mid-write (a time limit's
    SIGTERM) leaves the previous file or the new one, never half of one."""
    temporary = f"{path}.tmp"
    with open(temporary, "w") as f:
        f.write(text)
    os.replace(temporary, path)


def drop_metrics_after(metrics_path: str, last_step: int) -> int:
    """Removes the records past env step `last_step` from a resumed run's metrics file (the earlier run
    logged them after its last checkpoint; the resumed run logs those steps again). Returns how many."""
    if not os.path.exists(metrics_path):
        return 0
    with open(metrics_path) as f:
        lines = f.readlines()
    kept = [line for line in lines if (step := _step(line)) is not None and step <= last_step]
    if len(kept) != len(lines):
        write_atomically(metrics_path, "".join(kept))  # a crash here leaves the old file whole
    return len(lines) - len(kept)


def unlogged_evaluations(run_folder: str, iterations, steps_per_iteration: int) -> list[int]:
    """Of `iterations` (whose evaluations a checkpoint's parameters were given), those the metrics in
    `run_folder` hold no evaluation of: a run killed with them in flight. None without a metrics file."""
    metrics = os.path.join(os.path.abspath(run_folder), "metrics.jsonl")
    if not os.path.exists(metrics):
        return []
    logged = set()
    with open(metrics) as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a torn last line from a killed run
            if "eval/episode_return" in record and "step" in record:
                logged.add(int(record["step"]))
    return [iteration for iteration in iterations if iteration * steps_per_iteration not in logged]


def _step(line: str) -> Optional[int]:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None  # a torn last line from a killed run: dropped, or the next record would join it


def _holds_something(path: str) -> bool:
    if os.path.isdir(path):
        with os.scandir(path) as entries:
            return any(True for _ in entries)
    return os.path.exists(path) and os.path.getsize(path) > 0
