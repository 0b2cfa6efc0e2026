"""Several processes through `jax.distributed` (two on localhost, CPU collectives through gloo), and
checkpoints restored on a different device count."""

import os
import pickle
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxrose import distributed
from jaxrose.checkpoint import Checkpointer
from jaxrose.config import ConfigError, RunConfig, replace
from jaxrose.sequential import SequentialExecutor
from jaxrose.train import train

CHILD = os.path.join(os.path.dirname(__file__), "distributed_child.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _flat(tree) -> dict:
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _assert_close(expected: dict, got, **tolerance) -> None:
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, err_msg=name, **tolerance)


def _run_two_processes(tmp_path, config, devices_per_process: int, extra_env: dict) -> list:
    config_file = tmp_path / "config.pickle"
    config_file.write_bytes(pickle.dumps(config))
    port = _free_port()
    children = []
    for rank in range(2):
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(devices_per_process),
               "JAX_COORDINATOR_ADDRESS": f"localhost:{port}", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(rank),
               **{k: v.format(rank=rank) for k, v in extra_env.items()}}
        env.pop("CUDA_VISIBLE_DEVICES", None)
        children.append(subprocess.Popen([sys.executable, CHILD, str(config_file), str(tmp_path / f"p{rank}.npz")],
                                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [child.communicate(timeout=240)[0] for child in children]
    finally:
        for child in children:
            child.kill()
    for rank, child in enumerate(children):
        assert child.returncode == 0, f"process {rank} failed:\n{outputs[rank][-4000:]}"
    return [np.load(tmp_path / f"p{rank}.npz") for rank in range(2)]


def test_two_processes_equal_one(tmp_path, tiny_config):
    """Two processes x 2 CPU devices (4 groups, one per device) against one process on one device,
    same global batch and seed. Tolerance, not bit equality: the gradient and statistics sums are
    split over devices and processes, and the cross-process all-reduce (gloo) adds partial sums in
    its own order, which moves float32 rounding (as for several devices in one process)."""
    config = replace(tiny_config, **{"env.num_groups": 4, "run.num_evals": 2, "run.out_dir": str(tmp_path / "two")})
    results = _run_two_processes(tmp_path, replace(config, **{"run.devices": 2}), 2, {})
    single = train(replace(config, **{"run.out_dir": str(tmp_path / "one")}))
    expected = _flat(single.params)
    for result in results:
        assert int(result["process_count"]) == 2 and int(result["global_devices"]) == 4
        assert int(result["local_groups"]) == 1
        _assert_close(expected, result, rtol=2e-4, atol=2e-5)
    # Both processes hold the same replicated learner, bit for bit.
    for name in expected:
        np.testing.assert_array_equal(results[0][name], results[1][name])
    # Logs and plots come from process 0 alone, into the one shared folder.
    out = tmp_path / "two"
    assert (out / "metrics.jsonl").exists() and (out / "learning_curve.png").exists()
    assert len((out / "metrics.jsonl").read_text().splitlines()) == len(
        (tmp_path / "one" / "metrics.jsonl").read_text().splitlines())

    # The checkpoint the two processes wrote together (4 devices) restores into this 1-device process.
    executor = SequentialExecutor(config)
    target = executor.init(jax.random.PRNGKey(config.run.seed))
    restored = Checkpointer(str(out / "checkpoints")).restore(target, config)
    assert int(restored.iteration) == config.num_iterations
    _assert_close({k: results[0][k] for k in expected}, _flat(restored.learner.params), rtol=0, atol=0)
    executor.step(restored)  # and training goes on from it


def test_one_process_per_gpu_each_with_its_own_pin_and_the_evaluator_beside_process_0(tmp_path, tiny_config):
    """Two processes, one device each, pinned by the launcher's local rank (LOCAL_RANK, as torchrun sets
    it) before their GPU starts, evaluation in a worker process: process 0's evaluator is spawned
    beside it and inherits its pin (on a GPU: its GPU, under its own MPS daemon); process 1 evaluates
    nothing. Training and evaluation equal one process's inline run within float32 rounding (the
    gradient sum is split over the processes)."""
    config = replace(tiny_config, **{"env.num_groups": 2, "run.num_evals": 2, "run.eval_mode": "process",
                                     "run.out_dir": str(tmp_path / "two")})
    results = _run_two_processes(tmp_path, config, 1, {"LOCAL_RANK": "{rank}"})
    for rank, result in enumerate(results):
        assert int(result["process_count"]) == 2 and int(result["global_devices"]) == 2
        assert str(result["visible_gpus"]) == str(rank)  # pinned to its own GPU
    assert str(results[0]["evaluator_visible_gpus"]) == "0"  # the worker set of process 0's GPU
    assert len(results[1]["eval_returns"]) == 0 and str(results[1]["evaluator_visible_gpus"]) == ""

    single = train(replace(config, **{"run.eval_mode": "inline", "run.out_dir": str(tmp_path / "one")}))
    _assert_close(_flat(single.params), results[0], rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(results[0]["eval_returns"], [e["eval/episode_return"] for e in single.evaluations],
                               rtol=1e-3, atol=1e-3)


def test_a_plans_helpers_run_beside_each_process(tmp_path, tiny_config):
    """A plan with a deferred helper chunk (the H200 ablation's kept shape: reduce_metrics on a helper)
    over two pinned processes: each process sends its own helper, on its own GPU, its copy of the
    replicated inputs; parameters equal one process's sequential run within float32 rounding, and
    process 0 logs the helper's metrics for every iteration."""
    import json

    from jaxrose.graph import build_graph
    from jaxrose.plan import sequential_plan
    from jaxrose.planner import _overlap_tail
    from jaxrose.ppo_program import ITERATION_INPUTS

    config = replace(tiny_config, **{"env.num_groups": 2, "run.num_evals": 2, "run.out_dir": str(tmp_path / "two")})
    program = SequentialExecutor(config).program
    plan = _overlap_tail(sequential_plan(program), program, build_graph(program, ITERATION_INPUTS), "reduce_metrics")
    plan.save(str(tmp_path / "plan.json"))
    results = _run_two_processes(tmp_path, replace(config, **{"run.plan": str(tmp_path / "plan.json")}), 1,
                                 {"LOCAL_RANK": "{rank}"})
    single = train(replace(config, **{"run.out_dir": str(tmp_path / "one")}))
    for result in results:
        _assert_close(_flat(single.params), result, rtol=2e-4, atol=2e-5)
    logged = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    helper_steps = sorted(r["step"] for r in logged if "train/policy_loss" in r)
    steps = config.env_steps_per_iteration
    assert helper_steps == [i * steps for i in range(1, config.num_iterations + 1)]


def test_pinning_a_process_to_its_gpu(monkeypatch):
    for variable in (*distributed.LOCAL_RANK_VARS, "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr("jax._src.xla_bridge.backends_are_initialized", lambda: False)
    # One process and no setting: nothing pinned, whatever the launcher's variables say.
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed.pin_gpu(RunConfig(), several=False) is None and "CUDA_VISIBLE_DEVICES" not in os.environ
    # Several processes: the local rank picks the GPU.
    assert distributed.pin_gpu(RunConfig(), several=True) == "1" and os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    # Among GPUs the launcher made visible, the rank indexes that list.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    assert distributed.pin_gpu(RunConfig(), several=True) == "5"
    # A launcher that already gave each process one GPU is left alone; an explicit setting is not.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert distributed.pin_gpu(RunConfig(), several=True) is None and os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    # Several GPUs per process keep every GPU visible.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert distributed.pin_gpu(RunConfig(devices=2), several=True) is None
    # Bad input names the setting and the fix.
    with pytest.raises(ConfigError, match=r"run\.local_gpu is 2 but CUDA_VISIBLE_DEVICES lists 2 GPU\(s\) \(0,1\)"):
        distributed.pin_gpu(RunConfig(local_gpu=2), several=True)
    monkeypatch.setenv("LOCAL_RANK", "first")
    with pytest.raises(ConfigError, match="LOCAL_RANK must be an integer"):
        distributed.pin_gpu(RunConfig(), several=True)
    with pytest.raises(ConfigError, match=r"run\.local_gpu pins this process to one GPU, but run\.devices is 2"):
        RunConfig(local_gpu=0, devices=2)
    # Too late once this process's GPU has started.
    monkeypatch.setattr("jax._src.xla_bridge.backends_are_initialized", lambda: True)
    with pytest.raises(ConfigError, match="before this process's first JAX computation"):
        distributed.pin_gpu(RunConfig(local_gpu=0), several=False)


def test_checkpoint_from_two_devices_restores_on_one(tmp_path, tiny_config):
    two = SequentialExecutor(replace(tiny_config, **{"run.devices": 2}))
    state, _ = two.run(two.init(jax.random.PRNGKey(3)), 1)
    assert len(jax.tree.leaves(state.env_state)[0].sharding.device_set) == 2
    expected = _flat(state)
    Checkpointer(str(tmp_path)).save(1, state, tiny_config)

    one = SequentialExecutor(tiny_config)
    restored = Checkpointer(str(tmp_path)).restore(one.init(jax.random.PRNGKey(0)), tiny_config)
    assert len(jax.tree.leaves(restored.env_state)[0].sharding.device_set) == 1
    _assert_close(expected, _flat(restored), rtol=0, atol=0)
    continued, _ = one.step(restored)
    assert int(continued.iteration) == 2


def test_coordinates_from_settings_and_environment(monkeypatch):
    for variable in (*distributed.ENV_VARS.values(), "SLURM_STEP_NODELIST", "SLURM_NTASKS"):
        monkeypatch.delenv(variable, raising=False)
    assert distributed.coordinates(RunConfig()) is None
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
    monkeypatch.setenv("JAX_PROCESS_ID", "3")
    assert distributed.coordinates(RunConfig()) == {"coordinator_address": "10.0.0.1:1234", "num_processes": 4,
                                                    "process_id": 3}
    # Settings win over the environment.
    assert distributed.coordinates(RunConfig(process_id=1))["process_id"] == 1
    monkeypatch.setenv("JAX_PROCESS_ID", "4")
    with pytest.raises(ConfigError, match=r"must lie in \[0, 4\)"):
        distributed.coordinates(RunConfig())
    monkeypatch.delenv("JAX_PROCESS_ID")
    with pytest.raises(ConfigError, match=r"missing run\.process_id \(or JAX_PROCESS_ID\)"):
        distributed.coordinates(RunConfig())
    # Under srun with several tasks JAX reads everything from SLURM itself.
    for variable in distributed.ENV_VARS.values():
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("SLURM_STEP_NODELIST", "node[1-2]")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    assert distributed.coordinates(RunConfig()) == {}


def test_settings_are_validated(tiny_config):
    with pytest.raises(ConfigError, match="host:port"):
        RunConfig(coordinator_address="localhost")
    with pytest.raises(ConfigError, match=r"run\.process_id must lie in \[0, run\.num_processes\)"):
        RunConfig(num_processes=2, process_id=2)
    with pytest.raises(ConfigError, match="run.mode='sync'"):
        RunConfig(num_processes=2, mode="async")
    # The evaluator and a plan's helpers run beside each process, on its GPU.
    RunConfig(num_processes=2, eval_mode="process", plan="plan.json")
    with pytest.raises(ConfigError, match=r"multiple of run\.devices \(2\) times 2 processes"):
        replace(tiny_config, **{"run.devices": 2, "run.num_processes": 2})


def test_over_several_processes_a_helper_gets_whole_values_and_no_rollout_is_spread(monkeypatch, tiny_config):
    from jaxrose.graph import build_graph
    from jaxrose.plan import PlanError, sequential_plan, spread_rollout
    from jaxrose.ppo_program import ITERATION_INPUTS
    from jaxrose.runtime import executor_for, local_inputs

    class FakeProcessShardedArray:
        """A fake (named as such) of a jax.Array sharded over several processes: one process cannot make a
        real one (its other shards live in processes that do not exist here); these two flags are all
        `local_inputs` reads."""
        is_fully_addressable = False
        is_fully_replicated = False

    with pytest.raises(PlanError, match="Helper 'helper' reads 'batch', which is split over this run's processes"):
        local_inputs("helper", {"batch": FakeProcessShardedArray()})
    np.testing.assert_array_equal(local_inputs("helper", {"x": np.arange(3)})["x"], np.arange(3))
    program = SequentialExecutor(tiny_config).program
    spread = spread_rollout(sequential_plan(program), program, build_graph(program, ITERATION_INPUTS),
                            ("group0", "group1"), tiny_config.env.num_envs)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(PlanError, match="spreads the rollout over group processes runs on one process"):
        executor_for(tiny_config, spread)


def test_each_process_names_its_local_devices(monkeypatch):
    """Passed to jax.distributed always: left unset, JAX's SLURM / Open MPI detection named the local rank's
    index, which does not exist where one GPU is visible per task, and cut run.devices=2 to one GPU."""
    from jaxrose.config import RunConfig
    from jaxrose.distributed import LOCAL_RANK_VARS, local_device_ids

    for variable in LOCAL_RANK_VARS:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("SLURM_LOCALID", "1")
    assert local_device_ids(RunConfig(), one_visible=True) == [0]  # the launcher's (or pin_gpu's) one GPU
    assert local_device_ids(RunConfig(devices=2), one_visible=False) == [2, 3]  # rank 1 of 2 per host
    monkeypatch.delenv("SLURM_LOCALID")
    assert local_device_ids(RunConfig(devices=2), one_visible=False) == [0, 1]  # one process per host
