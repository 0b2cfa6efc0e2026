"""Faults: NaN from the env stops the run naming the stage, a lost GPU context stops it naming the
checkpoint to resume from, SIGTERM checkpoints and exits cleanly."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from fault_envs import NaNRewardAfter
from jaxrose import train
from jaxrose.config import replace
from jaxrose.sequential import SequentialExecutor
import jax

from jaxrose.train import DeviceLostError, NonFiniteError


def test_nan_reward_stops_the_run_and_keeps_the_last_good_checkpoint(tiny_config, tmp_path):
    # Episodes are 50 steps and an iteration is 2 unrolls of 8 steps: the NaN appears in iteration 3.
    config = replace(tiny_config, **{"run.out_dir": str(tmp_path), "run.total_env_steps": 512 * 8,
                                     "run.num_evals": 5, "run.checkpoint_every": 1})
    executor = SequentialExecutor(config, env=NaNRewardAfter(after=40))
    with pytest.raises(NonFiniteError, match=r"Iteration 3 produced NaN or Inf in: env_step_rewards.*iteration 2"):
        train(config, executor=executor)
    steps = sorted(int(p) for p in os.listdir(tmp_path / "checkpoints") if p.isdigit())
    assert steps and max(steps) == 2


class FailingDeviceExecutor(SequentialExecutor):
    """Fault injection: from iteration `after` on, a step fails as JAX does when the run's MPS server
    dies under it (measured on the H200: CUDA_ERROR_MPS_RPC_FAILURE from the next device call)."""

    def __init__(self, config, after: int):
        super().__init__(config)
        self.after = after

    def step(self, state):
        if int(state.iteration) >= self.after:
            raise jax.errors.JaxRuntimeError(
                "INTERNAL: CUDA error: Error querying CUDA stream status: CUDA_ERROR_MPS_RPC_FAILURE: the remote "
                "procedural call between the MPS server and the MPS client failed")
        return super().step(state)


def test_lost_gpu_context_stops_naming_the_checkpoint_to_resume_from(tiny_config, tmp_path):
    config = replace(tiny_config, **{"run.out_dir": str(tmp_path), "run.total_env_steps": 512 * 8,
                                     "run.num_evals": 2, "run.checkpoint_every": 2})
    with pytest.raises(DeviceLostError, match=r"MPS server or daemon of this run died.*last checkpoint is "
                                              r"iteration 2 in .*--run.resume"):
        train(config, executor=FailingDeviceExecutor(config, after=3))
    steps = sorted(int(p) for p in os.listdir(tmp_path / "checkpoints") if p.isdigit())
    assert steps and max(steps) == 2
    from jaxrose import manifest

    assert manifest.verify(str(tmp_path / "checkpoints" / "2")) is None


SYNC = ["--preset", "point-mass"]
ASYNC = SYNC + ["--run.mode", "async", "--run.actors", "2", "--env.num-groups", "2"]


@pytest.mark.parametrize("mode,signal_name,exit_code,progress,unit", [
    ("sync", "SIGTERM", 143, "perf/sps", "iteration"),
    ("sync", "SIGINT", 130, "perf/sps", "iteration"),
    # The asynchronous mode ends as at the end of its budget: the final snapshot (every actor's state).
    ("async", "SIGTERM", 143, "policy_lag_max", "update"),
])
def test_signal_saves_a_checkpoint_and_exits(tmp_path, mode, signal_name, exit_code, progress, unit):
    """SIGTERM (a scheduler) and Ctrl-C: the step in flight finishes, its state is saved, exit."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "jaxrose.cli", "train", *(ASYNC if mode == "async" else SYNC),
               "--run.total-env-steps", "100000000", "--run.num-evals", "2", "--run.no-progress-bar",
               "--run.no-tensorboard", "--run.out-dir", str(out)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait until training steps are being logged
            metrics = out / "metrics.jsonl"
            if metrics.exists() and sum(progress in line for line in metrics.read_text().splitlines()) >= 3:
                break
            time.sleep(0.2)
        process.send_signal(getattr(signal, signal_name))
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == exit_code, stderr
    saved = re.search(rf"stopped: {signal_name} received; checkpoint of {unit} (\d+) saved in .*--run.resume", stderr)
    assert saved, stderr
    steps = [int(p) for p in os.listdir(out / "checkpoints") if p.isdigit()]
    assert steps and max(steps) == int(saved.group(1)) >= 3
    from jaxrose import manifest

    assert manifest.verify(str(out / "checkpoints" / str(max(steps)))) is None


class StopAtStep:
    """A metrics sink that sends this process SIGTERM when the run logs `key` at env step `step`: the
    signal lands right before the evaluation of that step is handed to the evaluation process."""

    def __init__(self, step: int, key: str):
        self.step, self.key, self.sent = step, key, False

    def __call__(self, step, metrics):
        if not self.sent and step >= self.step and self.key in metrics:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_stop_signal_records_the_evaluation_in_flight(tiny_config, tmp_path, mode):
    """The checkpoint is of the evaluation's step, so a resumed run starts past it and would never redo it:
    the stopping run waits (bounded) for the evaluation process's result and logs it."""
    import json

    from jaxrose.train import TerminatedError

    settings = {"run.out_dir": str(tmp_path), "run.total_env_steps": 512 * 40, "run.num_evals": 11,
                "run.eval_mode": "process"}
    if mode == "async":
        settings.update({"run.mode": "async", "run.actors": 2, "run.max_policy_lag": 1})
    config = replace(tiny_config, **settings)
    eval_step = config.iterations_per_eval * config.env_steps_per_iteration * 2  # the second period
    stop = StopAtStep(eval_step, "perf/sps" if mode == "sync" else "train/policy_lag_max")
    with pytest.raises(TerminatedError, match="SIGTERM received; checkpoint of"):
        train(config, callbacks=[stop])
    assert stop.sent
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evaluated = sorted(r["step"] for r in records if "eval/episode_return" in r)
    assert evaluated == [0, eval_step // 2, eval_step], evaluated
    checkpoints = [int(p) for p in os.listdir(tmp_path / "checkpoints") if p.isdigit()]
    assert checkpoints  # the state of (or, async, just past) the evaluated step, saved before the wait
