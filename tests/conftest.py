"""A strict harness: tests run on CPU, with several virtual CPU devices for multi-device code.

Settings go through the environment, before JAX is imported, so that worker processes the tests
spawn run with the same devices and flags and compute bit for bit the same.
"""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "4")
# CPU compile time dominates this suite; the lowest backend optimisation level halves it and does not
# change what the tests compare (both sides of every comparison run under the same flags).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

# Identical programs built by different executors compile once per test session, in this process and in
# every worker process the tests spawn (actors, evaluation workers, group processes, bench children):
# they inherit the cache through the environment, as `run.compile_cache` hands it to workers.
# pytest-xdist's workers inherit the controller's environment: one cache for the whole run.
if "JAXROSE_TEST_COMPILE_CACHE" not in os.environ:
    os.environ["JAXROSE_TEST_COMPILE_CACHE"] = tempfile.mkdtemp(prefix="jaxrose-test-cache-")
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["JAXROSE_TEST_COMPILE_CACHE"]
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


@pytest.fixture(autouse=True)
def mps_variables_unchanged():
    """Every test leaves the MPS client variables of this process as it found them: a spawned worker or
    script copies os.environ, so one left behind would make later tests' children MPS clients."""
    before = {k: v for k, v in os.environ.items() if k.startswith("CUDA_MPS")}
    yield
    after = {k: v for k, v in os.environ.items() if k.startswith("CUDA_MPS")}
    assert after == before, f"this test left MPS variables changed: {before} -> {after}"


@pytest.fixture
def tiny_config():
    """A point-mass run small enough for many tests: 32 envs, 2 groups, tiny networks."""
    from jaxrose.config import EnvConfig, NetworkConfig, PPOConfig, RunConfig, TrainConfig

    return TrainConfig(
        env=EnvConfig(name="point_mass", num_envs=32, num_groups=2, episode_length=50),
        network=NetworkConfig(policy_hidden=(16, 16), value_hidden=(16, 16)),
        ppo=PPOConfig(unroll_length=8, batch_size=16, num_minibatches=4, num_updates_per_batch=2,
                      learning_rate=1e-3),
        run=RunConfig(total_env_steps=4 * 512, num_evals=3, num_eval_envs=8, progress_bar=False,
                      tensorboard=False),
    )


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` run only where JAX has a GPU (run them there with JAX_PLATFORMS=cuda)."""
    if jax.default_backend() == "gpu":
        return
    skip = pytest.mark.skip(reason="needs a GPU (marked gpu); run on the GPU machine with JAX_PLATFORMS=cuda")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
