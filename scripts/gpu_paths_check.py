"""On a GPU machine: the GPU code paths that CPU tests can only model, each checked against what the
GPU itself reports. Prints one JSON object (each check: "ok", or why not, with what was seen).

- CUDA IPC hand-offs of every leaf dtype a run sends (bfloat16 travels as its bits: gpu_transport),
  controller -> worker -> controller, each leaf compared value for value and dtype for dtype;
- the NVML device the activity sampler opens (profiler.nvml_device) is the GPU this process's CUDA
  device 0 is, by PCI bus id, with CUDA_VISIBLE_DEVICES unset, set to an index and set to a UUID;
- `jaxrose.distributed.initialize` with two processes on this host: each joins, sees one local
  device of two, and computes on it (cross-process collectives need one GPU per process, so none
  is run here).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np


def check_ipc_dtypes() -> dict:
    import jax
    import jax.numpy as jnp

    from jaxrose.gpu_transport import unavailable_reason
    from jaxrose.transport import measure_hand_off

    reason = unavailable_reason()
    if reason:
        return {"ok": False, "why": reason}
    key = jax.random.key(3)
    tree = {"bfloat16": jax.random.normal(key, (4096, 87)).astype(jnp.bfloat16),
            "float16": jax.random.normal(key, (300, 7)).astype(jnp.float16),
            "float32": jax.random.normal(key, (16, 5, 128)),
            "int32": jax.random.randint(key, (1000,), -2**30, 2**30),
            "uint32": jax.random.bits(key, (33,)),
            "bool": jax.random.bernoulli(key, 0.5, (4096,)),
            "empty": jnp.zeros((0, 4), jnp.bfloat16)}
    # measure_hand_off compares every leaf that came back with what went out (np.testing.assert_array_equal):
    # a bfloat16 leaf read back as its uint16 bits would differ in value and fail there.
    result = measure_hand_off(tree, "device", repeats=3, env={"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    return {"ok": True, "leaves": {k: str(v.dtype) for k, v in tree.items()}, **result}


_NVML_PROBE = textwrap.dedent("""
    import json, os, cupy, pynvml
    from jaxrose.profiler import GpuActivitySampler
    cuda_bus = cupy.cuda.Device(0).pci_bus_id
    pynvml.nvmlInit()  # NVML counts its inits: the handle stays usable if the sampler shuts its own down
    sampler = GpuActivitySampler(0).start()
    reason = sampler.reason
    handle = getattr(sampler, "_handle", None)
    nvml_bus = pynvml.nvmlDeviceGetPciInfo(handle).busId if handle is not None else None
    if isinstance(nvml_bus, bytes):
        nvml_bus = nvml_bus.decode()
    samples = 0
    if reason is None:
        import time; time.sleep(0.5); samples = len(sampler.samples())
    sampler.stop()
    print(json.dumps({"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "cuda_bus": cuda_bus,
                      "nvml_bus": nvml_bus, "start_problem": reason, "samples": samples}))
""")


def _bus(bus_id) -> str:
    # NVML writes an 8-digit PCI domain (00000000:19:00.0), CUDA a 4-digit one (0000:19:00.0)
    domain, rest = str(bus_id).lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def check_nvml_device() -> dict:
    import pynvml

    pynvml.nvmlInit()
    try:
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    cases = {"unset": None, "index": str(count - 1), "uuid": uuid}
    out, ok = {"gpus": count}, True
    for name, visible in cases.items():
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        run = subprocess.run([sys.executable, "-c", _NVML_PROBE], env=env, capture_output=True, text=True,
                             timeout=120)
        if run.returncode != 0:
            out[name], ok = {"ok": False, "why": run.stderr[-1500:]}, False
            continue
        seen = json.loads(run.stdout.strip().splitlines()[-1])
        same = seen["nvml_bus"] is not None and _bus(seen["nvml_bus"]) == _bus(seen["cuda_bus"])
        # GPM (the sampler's counters) may be unsupported on a GPU; the device choice is checked either way
        out[name] = {"ok": same, **seen}
        ok = ok and same
    out["ok"] = ok
    return out


_DISTRIBUTED_PROBE = textwrap.dedent("""
    import json, sys
    from jaxrose.config import RunConfig
    from jaxrose.distributed import initialize
    run = RunConfig(coordinator_address=sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
    several = initialize(run)
    import jax, jax.numpy as jnp
    local = jax.local_devices()
    value = float(jax.jit(lambda x: (x * x).sum())(jnp.arange(10.0, device=local[0])))
    print(json.dumps({"several": several, "process_index": jax.process_index(), "process_count": jax.process_count(),
                      "local_devices": [str(d) for d in local], "global_devices": len(jax.devices()),
                      "platform": local[0].platform, "sum_of_squares": value}))
    jax.distributed.shutdown()
""")


def check_distributed() -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out, ok = {}, True
    for name, visible in (("pinned", "0"), ("unpinned", None)):
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        address = f"127.0.0.1:{port + (name == 'unpinned')}"
        procs = [subprocess.Popen([sys.executable, "-c", _DISTRIBUTED_PROBE, address, str(rank)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
        seen = []
        for proc in procs:
            try:
                stdout, stderr = proc.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate()
                seen.append({"ok": False, "why": "timed out after 180 s", "stderr": stderr[-1500:]})
                continue
            if proc.returncode != 0:
                seen.append({"ok": False, "why": f"exit {proc.returncode}", "stderr": stderr[-1500:]})
                continue
            report = json.loads(stdout.strip().splitlines()[-1])
            good = (report["several"] and report["process_count"] == 2 and len(report["local_devices"]) == 1
                    and report["global_devices"] == 2 and report["platform"] == "gpu"
                    and report["sum_of_squares"] == 285.0)
            seen.append({"ok": good, **report})
        ranks = sorted(r.get("process_index", -1) for r in seen)
        out[name] = {"ok": all(r["ok"] for r in seen) and ranks == [0, 1], "processes": seen}
        ok = ok and out[name]["ok"]
    out["ok"] = ok
    return out


def main() -> None:
    result = {}
    for name, check in (("cuda_ipc_dtypes", check_ipc_dtypes), ("nvml_device", check_nvml_device),
                        ("distributed_local_devices", check_distributed)):
        try:
            result[name] = check()
        except Exception as error:  # record why, run the other checks
            result[name] = {"ok": False, "why": f"{type(error).__name__}: {error}"}
    result["ok"] = all(r.get("ok") for r in result.values())
    json.dump(result, sys.stdout, indent=2, default=str)
    print()
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
