"""Hand-offs between GPU processes through CUDA IPC memory (CuPy), without a trip through the host.

JAX's own device buffers cannot be exported through CUDA IPC (DESIGN.md), so each leaf gets a
dedicated `cudaMalloc` buffer that the controller exports once; a worker opens the handles once.
A write is a device-to-device copy of the JAX array (shared with CuPy through DLPack, no copy)
into the buffer, then a stream synchronization; a read copies the buffer into a fresh JAX array
and waits for that copy, so the other side may overwrite the buffer as soon as it is told to. The
pipe message around each hand-off is the cross-process handshake: nothing is read before it is
written, nothing is overwritten before it is read.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np


def unavailable_reason() -> Optional[str]:
    """Why this process cannot use CUDA IPC buffers, or None when it can."""
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # ImportError, or CUDA errors from a CuPy build for another CUDA
        return f"CuPy is not usable here ({type(error).__name__}: {error})"
    return None


def _cupy():
    import cupy

    return cupy


class DeviceBuffers:
    """Controller side: one exported CUDA IPC allocation per leaf of a tree of fixed shapes."""

    kind = "device"

    def __init__(self, shapes: Any):
        cp = _cupy()
        leaves, self._treedef = jax.tree.flatten(shapes)
        # (shape, storage dtype, the leaf's dtype): CuPy has no bfloat16, so such leaves travel as their bits.
        self._specs = [(tuple(x.shape), storage_dtype(x.dtype).str, np.dtype(x.dtype).name) for x in leaves]
        self._pointers = [cp.cuda.runtime.malloc(max(1, _nbytes(shape, dtype))) for shape, dtype, _ in self._specs]
        self._handles = [cp.cuda.runtime.ipcGetMemHandle(p) for p in self._pointers]
        self._arrays = [_wrap(p, shape, dtype) for p, (shape, dtype, _) in zip(self._pointers, self._specs)]

    def describe(self) -> dict:
        return {"kind": self.kind, "specs": self._specs, "handles": self._handles, "treedef": self._treedef}

    def write(self, tree: Any) -> None:
        cp = _cupy()
        leaves, structure = jax.tree.flatten(tree)
        if structure != self._treedef:
            raise ValueError(f"Tree structure {structure} does not match the buffers' {self._treedef}.")
        leaves = jax.block_until_ready([to_storage(jnp.asarray(x)) for x in leaves])
        for array, leaf in zip(self._arrays, leaves):
            if array.size:
                array[...] = cp.from_dlpack(leaf).reshape(array.shape)
        cp.cuda.get_current_stream().synchronize()

    def read(self) -> Any:
        leaves = [from_storage(jnp.array(jax.dlpack.from_dlpack(a), copy=True) if a.size else
                               jnp.zeros(a.shape, a.dtype), dtype) for a, (_, _, dtype) in zip(self._arrays, self._specs)]
        return jax.tree.unflatten(self._treedef, jax.block_until_ready(leaves))

    def close(self) -> None:
        _cupy().cuda.runtime.deviceSynchronize()  # no copy may still touch the memory
        self._arrays = []
        for pointer in self._pointers:
            self._release(pointer)
        self._pointers = []

    def _release(self, pointer: int) -> None:
        _cupy().cuda.runtime.free(pointer)


class DeviceBuffersView(DeviceBuffers):
    """Worker side: opens the controller's handles once; never frees the memory."""

    def __init__(self, description: dict):
        cp = _cupy()
        self._treedef, self._specs = description["treedef"], description["specs"]
        flags = cp.cuda.runtime.cudaIpcMemLazyEnablePeerAccess
        self._pointers = [cp.cuda.runtime.ipcOpenMemHandle(h, flags) for h in description["handles"]]
        self._arrays = [_wrap(p, shape, dtype) for p, (shape, dtype, _) in zip(self._pointers, self._specs)]

    def _release(self, pointer: int) -> None:
        _cupy().cuda.runtime.ipcCloseMemHandle(pointer)


def storage_dtype(dtype) -> np.dtype:
    """The dtype a leaf is kept as in CuPy memory: itself, or for the ML dtypes NumPy only knows as raw
    bytes (bfloat16, float8: kind 'V', which read back as '<V2' and lose their type) an unsigned
    integer of the same width."""
    dtype = np.dtype(dtype)
    return np.dtype(f"u{dtype.itemsize}") if dtype.kind == "V" else dtype


def to_storage(x: jax.Array) -> jax.Array:
    storage = storage_dtype(x.dtype)
    return x if storage == x.dtype else jax.lax.bitcast_convert_type(x, storage)


def from_storage(x: jax.Array, dtype_name: str) -> jax.Array:
    dtype = jnp.dtype(dtype_name)
    return x if x.dtype == dtype else jax.lax.bitcast_convert_type(x, dtype)


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _wrap(pointer: int, shape, dtype):
    cp = _cupy()
    memory = cp.cuda.UnownedMemory(pointer, max(1, _nbytes(shape, dtype)), None)
    return cp.ndarray(shape, np.dtype(dtype), memptr=cp.cuda.MemoryPointer(memory, 0))
