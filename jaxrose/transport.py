"""Moving a pytree of arrays between processes through shared host memory.

One `SharedTree` per direction and tree structure: the first `write` creates one shared-memory
segment per leaf; later writes copy into the same segments and send only a sequence number over
the pipe, so a hand-off costs one memcpy per leaf plus one small message. The reader copies the
leaves out and acknowledges; the writer does not overwrite a buffer the reader has not released.
(On a GPU the same protocol would use CUDA IPC buffers; see DESIGN.md for why JAX's own buffers
cannot be exported.)
"""

from __future__ import annotations

import dataclasses
import sys
import time
from multiprocessing import shared_memory
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class LeafSpec:
    segment: str
    shape: tuple[int, ...]
    dtype: str


class SharedTree:
    """Writer side: owns the segments and unlinks them on `close`."""

    def __init__(self):
        self._segments: list[shared_memory.SharedMemory] = []
        self._specs: list[LeafSpec] = []
        self._treedef = None

    def write(self, tree: Any) -> dict:
        """Copies the tree's leaves into shared memory; returns the message that describes them."""
        leaves, treedef = jax.tree.flatten(jax.device_get(tree))
        leaves = [np.asarray(leaf) for leaf in leaves]
        if self._treedef is None:
            self._treedef = treedef
            for leaf in leaves:
                segment = shared_memory.SharedMemory(create=True, size=max(1, leaf.nbytes))
                self._segments.append(segment)
                self._specs.append(LeafSpec(segment.name, leaf.shape, leaf.dtype.str))
        elif treedef != self._treedef:
            raise ValueError("SharedTree carries one tree structure; make one SharedTree per structure.")
        for segment, spec, leaf in zip(self._segments, self._specs, leaves):
            np.ndarray(spec.shape, spec.dtype, buffer=segment.buf)[...] = leaf
        return {"specs": self._specs, "treedef": self._treedef}

    def close(self) -> None:
        for segment in self._segments:
            segment.close()
            try:
                segment.unlink()
            except FileNotFoundError:
                pass
        self._segments.clear()


class SharedTreeReader:
    """Reader side: attaches to the writer's segments once and copies leaves out on every read.

    Readers are workers spawned by the writer's process, so they share its resource tracker: the
    writer's `close` unlinks each segment once, and a reader only detaches.
    """

    def __init__(self):
        self._attached: dict[str, shared_memory.SharedMemory] = {}

    def read(self, message: dict) -> Any:
        leaves = []
        for spec in message["specs"]:
            segment = self._attached.get(spec.segment)
            if segment is None:
                segment = self._attached[spec.segment] = _attach(spec.segment)
            leaves.append(np.array(np.ndarray(spec.shape, spec.dtype, buffer=segment.buf)))
        return jax.tree.unflatten(message["treedef"], leaves)

    def close(self) -> None:
        for segment in self._attached.values():
            segment.close()
        self._attached.clear()


def _attach(name: str) -> shared_memory.SharedMemory:
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    return shared_memory.SharedMemory(name=name)


def measure_round_trip(tree: Any, repeats: int = 20) -> dict:
    """Host-side cost of one write + read of `tree` in this process (the copy part of a hand-off)."""
    writer, reader = SharedTree(), SharedTreeReader()
    try:
        message = writer.write(tree)
        reader.read(message)
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            reader.read(writer.write(tree))
            seconds.append(time.perf_counter() - start)
    finally:
        reader.close()
        writer.close()
    nbytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(tree))
    median = float(np.median(seconds))
    return {"bytes": nbytes, "median_seconds": median, "gb_per_s": nbytes / median / 1e9}
