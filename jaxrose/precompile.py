"""Compiling a jitted program ahead, in a background thread, for input shapes it will meet later.

The asynchronous mode's resource manager resizes an actor's batch at run time; each new size is a
new input shape for the actor's rollout and the learner's update, and compiling them when the first
batch of that size arrives stalled the learner for 30-42 s per change on the H200 (BENCHMARKS.md,
session 20). Compiled here while the current size runs, the change costs no stall: jit shares its
compilation cache with `lower(...).compile()`, so the later call finds the program.

The abstract arguments mirror the arrays the real call will get, committed-ness included: jit keys
its cache on the argument's sharding, and an uncommitted array has none (`abstract`).
"""

from __future__ import annotations

import queue
import threading
import time
import warnings
from typing import Callable, Optional

import jax


def abstract(x, shape: Optional[tuple[int, ...]] = None) -> jax.ShapeDtypeStruct:
    """`x`'s shape (or `shape`), dtype and, where `x` is committed to a device, sharding."""
    committed = getattr(x, "committed", False)
    return jax.ShapeDtypeStruct(x.shape if shape is None else shape, x.dtype,
                                sharding=x.sharding if committed else None)


def resized_axis(tree, axis: int, size_of: Callable[[int], int]):
    """Abstract `tree` with each leaf's `axis` resized from n to `size_of(n)`."""
    def leaf(x):
        shape = list(x.shape)
        shape[axis] = size_of(shape[axis])
        return abstract(x, tuple(shape))

    return jax.tree.map(leaf, tree)


class Precompiler:
    """A daemon thread compiling submitted programs one after another. A failed compile only warns:
    the real call compiles the program itself, as it would have without this."""

    def __init__(self, name: str):
        self.name = name
        self.compiled: list[tuple[str, float]] = []  # (label, seconds) of each program compiled
        self._jobs: queue.Queue = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self._pending = 0  # submitted and not finished: idle exactly at zero (an empty queue can hide a job
        self._lock = threading.Lock()  # taken off it but still compiling, or one put just after the check)
        self._thread = threading.Thread(target=self._work, name=f"precompile-{name}", daemon=True)
        self._thread.start()

    def submit(self, label: str, compile_fn: Callable[[], object]) -> None:
        """Runs `compile_fn` (e.g. `lambda: jitted.lower(*abstract_args).compile()`) in the thread."""
        with self._lock:
            self._pending += 1
            self._idle.clear()
        self._jobs.put((label, compile_fn))

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Whether every submitted program was compiled (or failed) within `timeout` seconds."""
        return self._idle.wait(timeout)

    def close(self, timeout: float = 120.0) -> None:
        """Drops the programs not yet started and waits for the one compiling: a process exiting with
        the thread inside XLA's compiler aborts ("terminate called ... FATAL: exception not rethrown")."""
        while True:
            try:
                if self._jobs.get_nowait() is not None:
                    with self._lock:
                        self._pending -= 1
            except queue.Empty:
                break
        self._jobs.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                self._idle.set()
                return
            label, compile_fn = job
            start = time.perf_counter()
            try:
                compile_fn()
                self.compiled.append((label, time.perf_counter() - start))
            except Exception as error:  # noqa: BLE001 -- the real call compiles instead
                warnings.warn(f"{self.name}: compiling {label} ahead failed ({type(error).__name__}: {error}); "
                              f"it compiles on first use instead.", RuntimeWarning, stacklevel=1)
            with self._lock:
                self._pending -= 1
                if self._pending == 0:
                    self._idle.set()
