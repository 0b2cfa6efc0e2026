"""On a GPU machine: start jaxrose's private MPS daemon, start one worker per SM quota, and compare
the SM count each worker's JAX reports with `expected_sm_count`; then time the host shared-memory
transport for the sizes DESIGN.md names, and cross-process hand-offs through host memory and
through CUDA IPC buffers. Prints one JSON object."""

import json
import sys

import numpy as np

from jaxrose.mps import MpsDaemon, expected_sm_count, unavailable_reason
from jaxrose.transport import measure_round_trip
from jaxrose.workers import Worker


def report_devices(conn):
    import jax

    device = jax.devices()[0]
    conn.send(("ready", {"core_count": getattr(device, "core_count", None), "kind": device.device_kind}))
    conn.recv()


def main() -> None:
    result = {"mps": unavailable_reason() or "available", "workers": []}
    daemon = MpsDaemon()
    if daemon.start():
        try:
            for quota in (20, 40, 60, 100):
                worker = Worker(f"quota{quota}", report_devices, (), daemon.client_env(quota))
                info = worker.start(120)
                worker.stop()
                total = 132 if "H200" in info["kind"] or "H100" in info["kind"] else info["core_count"]
                result["workers"].append({"quota": quota, "sm_count": info["core_count"],
                                          "expected": expected_sm_count(total, quota),
                                          "start_seconds": info["start_seconds"]})
        finally:
            daemon.stop()
    for shape in ((4096, 87), (4096, 8), (8 * 1024 * 1024,)):
        result[f"shared_memory_round_trip_{'x'.join(map(str, shape))}"] = measure_round_trip(
            {"x": np.zeros(shape, np.float32)}, repeats=20)
    # Cross-process hand-offs (controller -> worker -> controller), host shared memory against CUDA
    # IPC buffers: one observation batch, and one ant iteration's unrolls (~133 MB).
    import jax.numpy as jnp

    from jaxrose.gpu_transport import unavailable_reason as ipc_unavailable
    from jaxrose.transport import measure_hand_off

    worker_env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    result["cuda_ipc"] = ipc_unavailable() or "available"
    trees = {"obs_4096x87": {"obs": jnp.ones((4096, 87), jnp.float32)},
             "ant_unrolls_133MB": {"obs": jnp.ones((16, 5, 4096, 87), jnp.float32),
                                   "rest": jnp.ones((16, 5, 4096, 14), jnp.float32)}}
    for name, tree in trees.items():
        for kind in ("host", "device"):
            try:
                result[f"hand_off_{kind}_{name}"] = measure_hand_off(tree, kind, repeats=10, env=worker_env)
            except Exception as error:  # record why, keep the other measurements
                result[f"hand_off_{kind}_{name}"] = f"{type(error).__name__}: {error}"
    json.dump(result, sys.stdout, indent=2)


if __name__ == "__main__":
    main()
