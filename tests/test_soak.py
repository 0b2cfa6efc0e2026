"""Soak: many short iterations on the multi-process runtime (a deferred chunk on a helper process),
then repeated start/close cycles: memory stays flat, results keep arriving, nothing is left behind.

What is watched, and why these bounds:
- controller RSS (/proc/self/status VmRSS) may grow by at most RSS_BOUND = 2 MiB from iteration
  WARM_UP = 100 (one-off allocations settle by then) to the end, 250 iterations later. Every
  iteration allocates the same buffers; what leaks in such a loop is per-iteration state kept alive
  by mistake (a result list, a retained RunState, a segment mapped per write). Keeping one RunState
  per iteration alone would add more than the bound (checked below). Measured here: 0.3-0.5 MiB.
- Python objects tracked by the garbage collector: at most 1 per 4 iterations more (measured: 0), which
  catches small leaks RSS cannot see.
- the shared-memory segments this process has mapped (/proc/self/maps) stay the same set;
  after close none is mapped or left in /dev/shm. Only our own segments are looked at, so other
  processes using /dev/shm at the same time don't disturb the test.
- child processes (from /proc, zombies included) and open file descriptors come back to what they
  were before.
"""

import gc
import multiprocessing as mp
import os
import time
from multiprocessing import resource_tracker

import jax
import numpy as np

from jaxrose.runtime import MultiProcessPlanExecutor
from test_runtime import metrics_on_helper_plan

ITERATIONS = 350
WARM_UP = 100
RSS_BOUND = 2 * 1024 * 1024
CYCLES = 4


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def our_segments() -> set[str]:
    """Shared-memory segments this process has mapped, by name ("NAME (deleted)" once unlinked)."""
    with open("/proc/self/maps") as f:  # address perms offset dev inode path[ (deleted)]
        paths = [line.split(maxsplit=5)[5].strip() for line in f if "/dev/shm/" in line]
    return {path.split("/dev/shm/", 1)[1] for path in paths}


def children() -> dict[int, str]:
    """Child processes of this one, with their state (Z: not reaped)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        if int(fields[1]) == os.getpid():
            found[int(pid)] = fields[0]
    return found


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def assert_nothing_left(before_children, segments, helper_pids):
    now = children()
    # Only children started since count: one an earlier test left (a zombie multiprocessing reaps
    # lazily, in the same pytest worker) may go away meanwhile without being ours.
    new = {pid: state for pid, state in now.items() if pid not in before_children}
    assert not {pid for pid, state in new.items() if state != "Z"}, f"a worker process was left behind: {new}"
    assert "Z" not in new.values(), f"a worker process was not reaped: {new}"
    assert not [p for p in mp.active_children() if p.pid in helper_pids]
    assert not our_segments() & segments, "a shared-memory segment is still mapped"
    assert not set(os.listdir("/dev/shm")) & segments, "a shared-memory segment was not unlinked"


def test_soak_memory_results_processes_and_segments(tiny_config):
    resource_tracker.ensure_running()  # started once per process by design; not a leak
    mp.active_children()  # reaps what earlier tests in this pytest worker left exiting
    before_children, before_fds = children(), open_fds()
    before_segments = our_segments()  # an earlier test's, in the same pytest worker: not this runtime's
    plan = metrics_on_helper_plan(tiny_config)

    runtime = MultiProcessPlanExecutor(tiny_config, plan, timeout=60)
    helper_pids = {w.process.pid for w in runtime.helpers.values()}
    received: list[int] = []
    try:
        state = runtime.init(jax.random.PRNGKey(0))
        state_bytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(state))
        assert RSS_BOUND < (ITERATIONS - WARM_UP) * state_bytes  # the bound would catch one kept RunState per iteration
        runtime.compile(state)
        start = time.perf_counter()
        for iteration in range(ITERATIONS):
            state, metrics = runtime.step(state)
            assert all(v == 1.0 for k, v in jax.device_get(metrics).items() if k.startswith("health/"))
            received += [k for _, k, outputs, _ in runtime.results() if np.isfinite(outputs["metrics"]["train/total_loss"])]
            # Double buffering: sending iteration k waits for k - 2, so results trail by at most 2
            # (the first two may still be in flight, e.g. while the helper compiles).
            if iteration >= 2:
                assert received and received[-1] >= iteration - 2, f"results stopped arriving at {iteration}"
            if iteration == WARM_UP:
                gc.collect()
                objects_warm = len(gc.get_objects())  # first: its ~1.5 MB list must be inside rss_warm
                rss_warm, segments = rss_bytes(), our_segments() - before_segments
                assert segments, "the runtime maps its transport buffers"
        received += [k for _, k, _, _ in runtime.drain()]
        gc.collect()
        growth = rss_bytes() - rss_warm
        objects = len(gc.get_objects()) - objects_warm
        assert our_segments() - before_segments == segments, "shared-memory segments changed during the run"
        seconds = time.perf_counter() - start
    finally:
        runtime.close()
    print(f"soak: {ITERATIONS} iterations in {seconds:.1f} s; after warm-up RSS {growth / 2**20:+.2f} MiB, "
          f"{objects:+d} Python objects, {len(segments)} segments")
    assert received == list(range(ITERATIONS))
    assert growth <= RSS_BOUND, f"RSS grew by {growth / 2**20:.1f} MiB over {ITERATIONS - WARM_UP} iterations"
    assert objects <= (ITERATIONS - WARM_UP) // 4, f"{objects} more Python objects after {ITERATIONS} iterations"
    assert seconds < 60
    assert_nothing_left(before_children, segments, helper_pids)
    assert open_fds() <= before_fds

    # Start/close cycles: each one spawns a helper, runs, and must leave nothing behind.
    fds = []
    for _ in range(CYCLES):
        runtime = MultiProcessPlanExecutor(tiny_config, plan, timeout=60)
        helper_pids = {w.process.pid for w in runtime.helpers.values()}
        try:
            state = runtime.init(jax.random.PRNGKey(1))
            for _ in range(2):
                state, _ = runtime.step(state)
            segments = our_segments() - before_segments
            assert [k for _, k, _, _ in runtime.drain()] == [0, 1]
        finally:
            runtime.close()
        assert_nothing_left(before_children, segments, helper_pids)
        fds.append(open_fds())
    assert fds[-1] <= fds[0] <= before_fds, f"file descriptors per cycle: {fds}"
