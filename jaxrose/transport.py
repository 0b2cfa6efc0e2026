"""Moving a pytree of arrays between processes through buffers both sides map.

`HostBuffers` (shared host memory) and `jaxrose.gpu_transport.DeviceBuffers` (CUDA IPC memory)
hold one tree of fixed shapes, created and freed by the controller; a worker attaches with
`attach(buffers.describe())`. A hand-off is a copy in, a pipe message, a copy out; the messages
around it say when each side may read or overwrite. `SharedTree` / `SharedTreeReader` are the host
variant for trees whose shapes are known only at the first write.
"""

from __future__ import annotations

import dataclasses
import os
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
    dtype: np.dtype  # the dtype itself: a string form loses bfloat16 ('<V2', raw bytes)


class SharedTree:
    """Writer side, for trees whose shapes are known only at the first write: `HostBuffers` made
    from that first tree; every write returns the message a `SharedTreeReader` reads."""

    def __init__(self):
        self._buffers: HostBuffers | None = None

    def write(self, tree: Any) -> dict:
        """Copies the tree's leaves into shared memory; returns the message that describes them."""
        tree = jax.tree.map(np.asarray, jax.device_get(tree))
        if self._buffers is None:
            self._buffers = HostBuffers(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree))
        self._buffers.write(tree)
        return self._buffers.describe()

    def close(self) -> None:
        if self._buffers is not None:
            self._buffers.close()
            self._buffers = None


class SharedTreeReader:
    """Reader side: attaches to a writer's segments once and copies leaves out on every read.

    Readers are workers spawned by the writer's process, so they share its resource tracker: the
    writer's `close` unlinks each segment once, and a reader only detaches.
    """

    def __init__(self):
        self._views: dict[tuple[str, ...], HostBuffersView] = {}

    def read(self, message: dict) -> Any:
        key = tuple(spec.segment for spec in message["specs"])
        if key not in self._views:
            self._views[key] = HostBuffersView(message)
        return self._views[key].read()

    def close(self) -> None:
        for view in self._views.values():
            view.close()
        self._views.clear()


def publish(tree: Any) -> dict:
    """A one-shot hand-off of `tree` through fresh shared-memory segments, for large trees sent now
    and then (an actor's env state: hundreds of MB at 16,384 ant envs), which a pipe would pickle and
    copy twice. Returns the message `take` reads exactly once, in this process or another one spawned
    from the same parent (they share its resource tracker, which unlinks segments never taken when
    the run ends). The segments outlive the process that published them."""
    tree = jax.tree.map(np.asarray, jax.device_get(tree))
    buffers = HostBuffers(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree))
    buffers.write(tree)
    buffers.release(unlink=False)  # `take` unlinks
    return {**buffers.describe(), "kind": "published"}


def take(message: dict) -> Any:
    """The tree `publish` wrote: copied out, its segments unlinked."""
    view = HostBuffersView(message)
    tree = view.read()
    view.release(unlink=True)
    return tree


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


# -- fixed-shape buffers owned by the controller ------------------------------------------------------


class HostBuffers:
    """One shared-memory segment per leaf of a tree of fixed shapes, created (and unlinked) by the
    controller; a worker attaches with `attach(buffers.describe())`. Either side reads and writes;
    the pipe messages around each hand-off say when a side may (the runtime's protocol)."""

    kind = "host"

    def __init__(self, shapes: Any):
        leaves, self._treedef = jax.tree.flatten(shapes)
        self._segments = [shared_memory.SharedMemory(create=True, size=max(1, _nbytes(x))) for x in leaves]
        self._specs = [LeafSpec(s.name, tuple(x.shape), np.dtype(x.dtype)) for s, x in zip(self._segments, leaves)]
        self._arrays = [np.ndarray(spec.shape, spec.dtype, buffer=s.buf) for s, spec in zip(self._segments, self._specs)]

    def describe(self) -> dict:
        return {"kind": self.kind, "specs": self._specs, "treedef": self._treedef}

    def write(self, tree: Any) -> None:
        for array, leaf in zip(self._arrays, _leaves_like(tree, self._treedef)):
            array[...] = np.asarray(jax.device_get(leaf))

    def read(self) -> Any:
        return jax.tree.unflatten(self._treedef, [np.array(a) for a in self._arrays])

    def close(self) -> None:
        self.release(unlink=True)

    def release(self, unlink: bool) -> None:
        """Unmaps the segments; `unlink` also frees them (their owner's part)."""
        self._arrays.clear()  # a segment with a live view cannot close
        for segment in self._segments:
            segment.close()
            if unlink:
                try:
                    segment.unlink()
                except FileNotFoundError:
                    pass
        self._segments.clear()


class HostBuffersView(HostBuffers):
    """A worker's side of `HostBuffers`: attaches to the segments, never unlinks them."""

    def __init__(self, description: dict):
        self._treedef, self._specs = description["treedef"], description["specs"]
        self._segments = [_attach(spec.segment) for spec in self._specs]
        self._arrays = [np.ndarray(spec.shape, spec.dtype, buffer=s.buf) for s, spec in zip(self._segments, self._specs)]

    def close(self) -> None:
        self.release(unlink=False)


def make_buffers(shapes: Any, kind: str = "host"):
    """Controller side: buffers for a tree of these shapes; `kind` "host" (shared memory) or
    "device" (CUDA IPC memory on the GPU, `jaxrose.gpu_transport`)."""
    if kind == "device":
        from jaxrose.gpu_transport import DeviceBuffers

        return DeviceBuffers(shapes)
    return HostBuffers(shapes)


def attach(description: dict):
    """Worker side: the buffers `description` (from `describe()`) names."""
    if description["kind"] == "device":
        from jaxrose.gpu_transport import DeviceBuffersView

        return DeviceBuffersView(description)
    return HostBuffersView(description)


def transport_kind(requested: str = "auto") -> str:
    """"device" on a GPU where CuPy can export IPC memory, else "host"; "auto" falls back with a
    warning. The environment variable JAXROSE_TRANSPORT overrides "auto"."""
    if requested == "auto":
        requested = os.environ.get("JAXROSE_TRANSPORT", "auto")
    if requested not in ("auto", "host", "device"):
        raise ValueError(f"The transport (JAXROSE_TRANSPORT) must be auto, host or device, got {requested!r}.")
    if requested == "host" or jax.default_backend() != "gpu":
        if requested == "device":
            raise ValueError("The transport (JAXROSE_TRANSPORT) is 'device' but JAX runs on "
                             f"{jax.default_backend()}; use 'host' or 'auto'.")
        return "host"
    from jaxrose.gpu_transport import unavailable_reason

    reason = unavailable_reason()
    if reason is None:
        return "device"
    if requested == "device":
        raise ValueError(f"The transport (JAXROSE_TRANSPORT) is 'device' but {reason}; install CuPy for your "
                         f"CUDA or set JAXROSE_TRANSPORT=host.")
    import warnings

    warnings.warn(f"Worker hand-offs go through host memory: {reason}.", stacklevel=2)
    return "host"


def _nbytes(x) -> int:
    return int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize


def _leaves_like(tree: Any, treedef) -> list:
    leaves, structure = jax.tree.flatten(tree)
    if structure != treedef:
        raise ValueError(f"Tree structure {structure} does not match the buffers' {treedef}.")
    return leaves


def _echo(conn, request: dict) -> None:
    requests, replies = attach(request), None
    device = jax.devices()[0]
    conn.send(("ready", {"platform": device.platform}))
    try:
        while True:
            message = conn.recv()
            if message[0] == "stop":
                return
            if replies is None:
                replies = attach(message[1])
            replies.write(requests.read())
            conn.send(("done",))
    finally:
        requests.close()
        if replies is not None:
            replies.close()


def measure_hand_off(tree: Any, kind: str = "host", repeats: int = 20, env: dict | None = None) -> dict:
    """Cross-process cost of handing `tree` to a worker and back (two hand-offs, each a copy into
    the buffers, a pipe message, and a copy out), timed in the controller after a warm-up trip."""
    from jaxrose.workers import Worker

    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), tree)
    requests, replies = make_buffers(shapes, kind), make_buffers(shapes, kind)
    worker = Worker("hand-off", _echo, (requests.describe(),), env or {})
    try:
        worker.start(120)
        seconds = []
        for trip in range(repeats + 1):
            start = time.perf_counter()
            requests.write(tree)
            worker.send(("run", replies.describe() if trip == 0 else None))
            worker.receive(60)
            out = replies.read()
            jax.block_until_ready(out)
            if trip:
                seconds.append(time.perf_counter() - start)
        for got, sent in zip(jax.tree.leaves(out), jax.tree.leaves(tree), strict=True):  # every leaf came back whole
            np.testing.assert_array_equal(np.asarray(got), np.asarray(sent))
    finally:
        worker.stop()
        requests.close()
        replies.close()
    nbytes = sum(_nbytes(x) for x in jax.tree.leaves(shapes))
    median = float(np.median(seconds))
    return {"kind": kind, "bytes": nbytes, "round_trip_median_seconds": median,
            "one_way_seconds": median / 2, "gb_per_s_one_way": nbytes / (median / 2) / 1e9}
