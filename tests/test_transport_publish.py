"""One-shot hand-offs through shared memory (`transport.publish` / `take`): exact, taken once, and
readable in another process (how an actor's env state reaches the learner and a restarted actor)."""

import multiprocessing

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrose.transport import HostBuffers, _attach, attach, publish, take


def _tree():
    return {"qpos": np.arange(24, dtype=np.float32).reshape(2, 3, 4), "done": np.array([True, False]),
            "empty": np.zeros((2, 0), np.float32), "half": jnp.ones((3,), jnp.bfloat16) * 1.5,
            "key": jax.random.PRNGKey(7)}


def _publish_in_child(conn):
    conn.send(publish(_tree()))
    conn.close()


def test_round_trip_is_exact_and_unlinks():
    message = publish(_tree())
    got = take(message)
    expected = jax.device_get(_tree())
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    for spec in message["specs"]:  # taken once: the segments are gone
        with pytest.raises(FileNotFoundError):
            _attach(spec.segment)


def test_host_buffers_keep_bfloat16():
    """The trajectory buffers (`HostBuffers`) carry a bfloat16 leaf as bfloat16, not as raw bytes."""
    tree = {"half": np.asarray(jnp.arange(4, dtype=jnp.bfloat16)), "f32": np.ones((2, 3), np.float32)}
    buffers = HostBuffers(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree))
    try:
        buffers.write(tree)
        view = attach(buffers.describe())
        got = view.read()
        view.close()
    finally:
        buffers.close()
    assert got["half"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(got["half"], tree["half"])
    np.testing.assert_array_equal(got["f32"], tree["f32"])


def test_published_by_a_process_that_has_exited():
    """A spawned process publishes and exits (as a stopped actor does); the parent still takes it."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_publish_in_child, args=(child,))
    process.start()
    message = parent.recv()
    process.join(60)
    assert process.exitcode == 0
    for a, b in zip(jax.tree.leaves(take(message)), jax.tree.leaves(jax.device_get(_tree()))):
        np.testing.assert_array_equal(a, b)


def test_device_buffers_carry_bfloat16_as_its_bits():
    """CUDA IPC buffers (CuPy, no bfloat16) keep a bfloat16 leaf as uint16 and give it back bit for bit;
    a dtype NumPy knows is kept as is. (The CuPy copy itself runs only on a GPU.)"""
    from jaxrose.gpu_transport import from_storage, storage_dtype, to_storage

    half = jnp.array([1.5, -0.0, jnp.inf, jnp.nan, 3.1e-5], jnp.bfloat16)
    assert storage_dtype(half.dtype) == np.dtype("uint16") and storage_dtype(np.float32) == np.float32
    stored = to_storage(half)
    assert stored.dtype == np.uint16
    back = from_storage(stored, np.dtype(half.dtype).name)
    assert back.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(back).view(np.uint16), np.asarray(half).view(np.uint16))
    ones = jnp.ones(3, jnp.float32)
    assert to_storage(ones) is ones and from_storage(ones, "float32") is ones
