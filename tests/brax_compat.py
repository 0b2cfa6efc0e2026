"""Test-only shim: brax 0.14.2's PPO calls `jax.device_put_replicated`, which JAX >= 0.10 removed.

Kept out of the library on purpose; the benchmark harness carries its own copy for the same reason.
"""

import contextlib

import jax
import jax.numpy as jnp


def _device_put_replicated(tree, devices):
    return jax.tree.map(lambda x: jnp.stack([jnp.asarray(x)] * len(devices)), tree)


@contextlib.contextmanager
def brax_compat():
    missing = not hasattr(jax, "device_put_replicated")
    if missing:
        jax.device_put_replicated = _device_put_replicated
    try:
        yield
    finally:
        if missing:
            del jax.device_put_replicated
