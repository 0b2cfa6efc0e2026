"""`jaxrose doctor`: what this machine offers jaxrose (GPUs, SMs, MPS, NVML GPM, JAX)."""

from __future__ import annotations

import importlib.metadata
import platform


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _gpus() -> list[dict]:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as error:  # no driver or library
        return [{"error": f"NVML unavailable: {error}"}]
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            try:
                gpm = bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
            except Exception:
                gpm = False
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
            gpus.append({"index": index, "name": name if isinstance(name, str) else name.decode(),
                         "memory_gib": round(memory, 1), "gpm_supported": gpm})
        return gpus
    finally:
        pynvml.nvmlShutdown()


def report() -> dict:
    import jax

    from jaxrose.mps import unavailable_reason

    gpus = _gpus()  # first: NVML answers even where JAX cannot start its GPU backend
    try:
        backend = jax.default_backend()
        devices = [{"kind": d.device_kind, "platform": d.platform, "sm_count": getattr(d, "core_count", None)}
                   for d in jax.devices()]
    except Exception as error:  # noqa: BLE001 - reported, with what to check
        backend = None
        devices = {"error": f"{type(error).__name__}: {error}".strip(),
                   "check": "JAX_PLATFORMS, the jax[cuda13] install and the NVIDIA driver (nvml_gpus below)"}
    return {
        "python": platform.python_version(),
        "versions": {p: _version(p) for p in ("jax", "jaxlib", "flax", "optax", "brax", "mujoco", "mujoco-mjx",
                                              "orbax-checkpoint", "nvidia-ml-py")},
        "jax_backend": backend,
        "jax_devices": devices,
        "nvml_gpus": gpus,
        "mps": unavailable_reason() or "available (private daemon per run)",
    }


def main(args: list[str]) -> None:
    import argparse
    import json

    argparse.ArgumentParser(prog="jaxrose doctor", description="Print, as JSON, what this machine offers jaxrose: "
                            "package versions, JAX devices, GPUs and SMs (NVML), NVML GPM and MPS.").parse_args(args)

    print(json.dumps(report(), indent=2))
