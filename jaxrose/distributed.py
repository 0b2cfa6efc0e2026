"""Several processes (hosts) through `jax.distributed`: one call before anything touches a device.

Where the coordinates come from, first found wins: the `run.coordinator_address`, `run.num_processes`
and `run.process_id` settings; the environment variables JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID; JAX's own cluster detection under `srun` with several tasks (SLURM). Nothing set
means one process and no coordinator. Every process then sees all processes' devices
(`jax.devices()`), and XLA's collectives cross process boundaries (gloo on CPU, NCCL on GPU).

Several processes on one host: each is pinned to its own GPU (`run.local_gpu`, else the launcher's
local rank) before its GPU starts, so each has its own private MPS daemon and worker set there
(process 0's evaluator; a plan's helpers beside every process). Worker processes never join the run.

`run.devices` counts devices per process; the executor's mesh takes that many from each process,
process-major, so env groups split evenly over processes and devices. Nothing random is drawn per
process on the host: the env and learner keys come from `run.seed` inside the global jitted init, so
every group's key is distinct and the same as in a single-process run of the same global batch.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import jax

from jaxrose.config import ConfigError, RunConfig
from jaxrose.workers import WORKER_VARIABLE

ENV_VARS = {"coordinator_address": "JAX_COORDINATOR_ADDRESS", "num_processes": "JAX_NUM_PROCESSES",
            "process_id": "JAX_PROCESS_ID"}
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")  # torchrun, srun, mpirun


def coordinates(run: RunConfig) -> Optional[dict]:
    """`jax.distributed.initialize`'s arguments for this process, or None for a single process. A
    worker process (evaluator, helper, actor) is always a single process: it inherits its trainer's
    environment, coordinates included, but serves that trainer alone."""
    if os.environ.get(WORKER_VARIABLE):
        return None
    found = {}
    for field, variable in ENV_VARS.items():
        value = getattr(run, field)
        if value is None and os.environ.get(variable, "") != "":
            value = os.environ[variable]
            if field != "coordinator_address":
                try:
                    value = int(value)
                except ValueError:
                    raise ConfigError(f"{variable} must be an integer, got {value!r}.") from None
        found[field] = value
    if all(value is None for value in found.values()):
        if _slurm_tasks() > 1:
            return {}  # JAX reads the coordinator, count and rank from SLURM itself
        return None
    if found["num_processes"] == 1:
        return None
    missing = [f"run.{field} (or {ENV_VARS[field]})" for field, value in found.items() if value is None]
    if missing and _slurm_tasks() <= 1:
        raise ConfigError(f"Several processes need all three of run.coordinator_address, run.num_processes and "
                          f"run.process_id; missing {', '.join(missing)}.")
    n, rank = found["num_processes"], found["process_id"]
    if n is not None and rank is not None and not 0 <= rank < n:
        raise ConfigError(f"run.process_id (or JAX_PROCESS_ID) must lie in [0, {n}), got {rank}.")
    return {field: value for field, value in found.items() if value is not None}


def initialize(run: RunConfig) -> bool:
    """Joins the run's processes (idempotent) and says whether there are several; a no-op for a
    single process. Must come before this process's first JAX computation, which fixes its devices.
    Pins this process to its GPU first (`pin_gpu`). Touches no device itself, so MPS can still be
    set up after it."""
    if jax.distributed.is_initialized():
        return True
    arguments = coordinates(run)
    pinned = pin_gpu(run, several=arguments is not None)
    if arguments is None:
        return False
    # Named here, always: left unset, JAX's cluster detection (SLURM, Open MPI) names the local rank's index,
    # which does not exist where the launcher or `pin_gpu` left one GPU visible, and cuts run.devices to one.
    arguments["local_device_ids"] = local_device_ids(run, pinned is not None or _visible_gpus() == 1)
    platforms = os.environ.get("JAX_PLATFORMS", "") or str(jax.config.jax_platforms or "")
    if platforms in ("", "None") or platforms.startswith("cpu"):
        # CPU devices of different processes reduce through gloo; the default ("none") cannot. It
        # only concerns the CPU backend, so it is harmless where a GPU turns out to be the default.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(**arguments)
    except RuntimeError as error:
        if "before any JAX" in str(error):
            raise ConfigError("jax.distributed must start before this process's first JAX computation: call "
                              "jaxrose.distributed.initialize(config.run) (or train) before using JAX.") from error
        raise
    return True


def _visible_gpus() -> Optional[int]:
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip() != ""]
    return len(visible) if visible else None


def local_device_ids(run: RunConfig, one_visible: bool) -> list[int]:
    """The local devices this process of several uses: its one visible GPU (device 0), else its
    `run.devices` GPUs counted from its local rank (rank r: r * devices, ..., (r + 1) * devices - 1)."""
    if one_visible:
        return [0]
    rank = local_gpu(dataclasses.replace(run, local_gpu=None), several=True) or 0
    return list(range(rank * run.devices, (rank + 1) * run.devices))


def local_gpu(run: RunConfig, several: bool) -> Optional[int]:
    """The GPU (index among this host's visible GPUs) this process uses: `run.local_gpu`; else, in a run
    of several processes, the launcher's local rank (the first of LOCAL_RANK_VARS set); else None (all
    visible GPUs, as JAX sees them)."""
    if run.local_gpu is not None:
        return run.local_gpu
    if not several:
        return None
    for variable in LOCAL_RANK_VARS:
        value = os.environ.get(variable, "")
        if value != "":
            try:
                return int(value)
            except ValueError:
                raise ConfigError(f"{variable} must be an integer (this process's local rank), got {value!r}; "
                                  f"or set run.local_gpu.") from None
    return None


def pin_gpu(run: RunConfig, several: bool) -> Optional[str]:
    """Makes this process see only its GPU (`local_gpu`) by setting CUDA_VISIBLE_DEVICES before JAX
    starts a GPU. Everything this process starts next inherits it: its private MPS daemon then serves
    that GPU alone, and its worker processes run on it, so every GPU has its own daemon and worker set.
    A launcher that already pinned one GPU per process is left alone. Returns the GPU pinned, or None."""
    from jax._src import xla_bridge

    if run.devices > 1:
        return None  # several GPUs per process (run.devices): all of the host's stay visible
    gpu = local_gpu(run, several)
    if gpu is None:
        return None
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip() != ""]
    if run.local_gpu is None and len(visible) == 1:
        return None  # one GPU per process already: the launcher's choice stands
    if visible and gpu >= len(visible):
        source = "run.local_gpu" if run.local_gpu is not None else "the local rank"
        raise ConfigError(f"{source} is {gpu} but CUDA_VISIBLE_DEVICES lists {len(visible)} GPU(s) "
                          f"({','.join(visible)}); give a GPU index below {len(visible)}.")
    pinned = visible[gpu] if visible else str(gpu)
    if os.environ.get("CUDA_VISIBLE_DEVICES") == pinned:
        return pinned
    if xla_bridge.backends_are_initialized():
        raise ConfigError(f"run.local_gpu ({gpu}) must take effect before this process's first JAX computation "
                          f"(it sets CUDA_VISIBLE_DEVICES={pinned}): start training in a fresh process, e.g. "
                          f"`jaxrose train`.")
    os.environ["CUDA_VISIBLE_DEVICES"] = pinned
    return pinned


def is_main_process() -> bool:
    """Process 0 writes the logs, metrics, plots and checkpoint checksums. Read from `jax.distributed`'s
    state, not `jax.process_index()`, which starts this process's GPU: before MPS is set up that would
    leave every worker without MPS."""
    from jax._src.distributed import global_state

    return not jax.distributed.is_initialized() or global_state.process_id == 0


def barrier(name: str) -> None:
    """All processes reach `name` before any goes on (no-op for one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _slurm_tasks() -> int:
    # JAX's SLURM detection needs these; a batch script outside `srun` has no step node list.
    if "SLURM_STEP_NODELIST" not in os.environ:
        return 0
    try:
        return int(os.environ.get("SLURM_NTASKS", "0"))
    except ValueError:
        return 0


def local_copy(tree):
    """This process's copy of replicated arrays, e.g. parameters to evaluate without other processes."""
    return jax.tree.map(lambda x: x if getattr(x, "is_fully_addressable", True) else x.addressable_data(0), tree)
