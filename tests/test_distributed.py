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


def test_two_processes_equal_one(tmp_path, tiny_config):
    """Two processes x 2 CPU devices (4 groups, one per device) against one process on one device,
    same global batch and seed. Tolerance, not bit equality: the gradient and statistics sums are
    split over devices and processes, and the cross-process all-reduce (gloo) adds partial sums in
    its own order, which moves float32 rounding (as for several devices in one process)."""
    config = replace(tiny_config, **{"env.num_groups": 4, "run.num_evals": 2, "run.out_dir": str(tmp_path / "two")})
    config_file = tmp_path / "config.pickle"
    config_file.write_bytes(pickle.dumps(replace(config, **{"run.devices": 2})))
    port = _free_port()
    children = []
    for rank in range(2):
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "2",
               "JAX_COORDINATOR_ADDRESS": f"localhost:{port}", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(rank)}
        children.append(subprocess.Popen([sys.executable, CHILD, str(config_file), str(tmp_path / f"p{rank}.npz")],
                                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [child.communicate(timeout=240)[0] for child in children]
    finally:
        for child in children:
            child.kill()
    for rank, child in enumerate(children):
        assert child.returncode == 0, f"process {rank} failed:\n{outputs[rank][-4000:]}"

    single = train(replace(config, **{"run.out_dir": str(tmp_path / "one")}))
    expected = _flat(single.params)
    results = [np.load(tmp_path / f"p{rank}.npz") for rank in range(2)]
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
    with pytest.raises(ConfigError, match=r"multiple of run\.devices \(2\) times 2 processes"):
        replace(tiny_config, **{"run.devices": 2, "run.num_processes": 2})
