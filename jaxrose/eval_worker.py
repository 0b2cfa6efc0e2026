"""Evaluation in its own process: episodes with the parameters of iteration k run while training
continues with iteration k+1 (a synchronous-semantics overlap: evaluation reads params k and writes
nothing training reads).

Parameters travel host-side through the worker's pipe: the policy, value net and normalizer of a
brax-sized MLP are ~300 KB, sent once per evaluation, which costs far less than one iteration.
The results equal inline evaluation exactly: same program, same params, same key.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Optional

import jax

from jaxrose.config import TrainConfig
from jaxrose.workers import Inbox, Worker, WorkerError

# How long a run stopping on a signal waits for the evaluations in flight, after its checkpoint is on disk:
# inside the usual grace period between a scheduler's SIGTERM and its SIGKILL (30 s for SLURM and Kubernetes).
STOP_DRAIN_SECONDS = 20.0


def _serve(conn, config: TrainConfig, env=None) -> None:
    """Worker side: build the evaluator once, then evaluate whatever parameters arrive. `env`: the
    trainer's own env when it was given one (pickled); None builds the config's."""
    from jaxrose.evaluation import evaluation_key, make_evaluate
    from jaxrose.networks import make_actor_critic
    from jaxrose.sequential import make_env

    env = env if env is not None else make_env(config)
    net = make_actor_critic(env.observation_size, env.action_size, config.network, config.ppo.normalize_observations)
    evaluate = make_evaluate(env, net, config.run.num_eval_envs, config.env.episode_length,
                             config.run.deterministic_eval)
    device = jax.devices()[0]
    inbox = Inbox(conn)  # the trainer's submit never waits for an evaluation in progress
    conn.send(("ready", {"platform": device.platform, "device_kind": device.device_kind,
                         "core_count": getattr(device, "core_count", None),
                         "visible_gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}))  # its trainer's pinned GPU
    while True:
        message = inbox.get(block=True)
        if message[0] == "stop":
            return
        _, iteration, params, normalizer = message
        start = time.perf_counter()
        metrics = jax.device_get(evaluate(params, normalizer, evaluation_key(config.run.seed, iteration)))
        conn.send(("result", iteration, {k: float(v) for k, v in metrics.items()}, time.perf_counter() - start))


class ProcessEvaluator:
    """Controller side: submit parameters without waiting; collect results as they finish."""

    def __init__(self, config: TrainConfig, env: Optional[dict[str, str]] = None, timeout: float = 600.0,
                 task=None):
        """`env`: the worker's environment variables (its MPS settings); `task`: the env to evaluate when
        the trainer was given its own (it must pickle), None for the config's."""
        self.worker = Worker("evaluator", _serve, (config, task), env, send_timeout=timeout)
        self.timeout = timeout
        self.outstanding: set[int] = set()

    def start(self) -> dict:
        return self.worker.start(self.timeout)

    def submit(self, iteration: int, learner) -> None:
        params, normalizer = jax.device_get((learner.params, learner.normalizer))
        self.worker.send(("evaluate", iteration, params, normalizer), timeout=self.timeout)
        self.outstanding.add(iteration)

    def _receive(self, timeout: float) -> tuple[int, dict]:
        _, iteration, metrics, seconds = self.worker.receive(timeout)
        self.outstanding.discard(iteration)
        return iteration, {**{f"eval/{k}": v for k, v in metrics.items()}, "eval/walltime": seconds}

    def finished(self) -> list[tuple[int, dict]]:
        """Results that have arrived, without waiting; raises if the worker died."""
        results = []
        while self.outstanding and self.worker.poll():
            results.append(self._receive(self.timeout))
        if self.outstanding and not self.worker.process.is_alive():
            raise self.worker.death_error("with evaluations outstanding")
        return results

    def drain(self) -> list[tuple[int, dict]]:
        return [self._receive(self.timeout) for _ in range(len(self.outstanding))]

    def drain_on_stop(self, seconds: float = STOP_DRAIN_SECONDS) -> list[tuple[int, dict]]:
        """The outstanding results that arrive within `seconds`, never raising: a run stopping on a signal
        records its evaluations in flight without outstaying a scheduler's grace period. What has not
        arrived by then (or comes from a dead worker) stays in `outstanding` and is named in a warning."""
        deadline = time.monotonic() + seconds
        results = []
        while self.outstanding and (left := deadline - time.monotonic()) > 0:
            try:
                results.append(self._receive(left))
            except WorkerError:
                break
        if self.outstanding:
            warnings.warn(f"Stopping: the evaluation of iteration(s) {sorted(self.outstanding)} did not finish "
                          f"within {seconds:.0f} s and is missing from the metrics.", stacklevel=3)
        return results

    def close(self) -> None:
        self.worker.stop()

