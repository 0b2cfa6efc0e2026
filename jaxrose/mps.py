"""NVIDIA MPS control: a private daemon, client environments with SM quotas, and what a machine offers.

The daemon is private to this run: its pipe and log folders are fresh temporary folders, so it
neither needs nor touches the machine-wide MPS set-up, and the GPU's compute mode is never changed.
A client attaches only if `CUDA_MPS_PIPE_DIRECTORY` is set before it initialises CUDA; the quota
(`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`) is fixed for the client's life, and so is its scheduling priority
(`CUDA_MPS_CLIENT_PRIORITY`: the daemon runs a below-normal client's kernels only when no normal
client's are ready, so work with slack yields the SMs to the critical path instead of merely being
capped). A client that cannot reach the daemon silently runs without MPS, so attachment is verified
from the SM count its JAX reports.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
import tempfile
from typing import Optional

log = logging.getLogger(__name__)

CONTROL_BINARY = "nvidia-cuda-mps-control"
# `CUDA_MPS_CLIENT_PRIORITY` values (nvidia-cuda-mps-control accepts 0 or 1).
PRIORITIES = {"normal": "0", "below-normal": "1"}


class MpsError(RuntimeError):
    """The MPS daemon could not be started or a client did not attach as asked."""


class MpsAttachWarning(RuntimeWarning):
    """A worker asked for an SM quota runs without it (not attached to the run's MPS daemon)."""


def gpu_count() -> int:
    """GPUs visible through NVML (0 when NVML or a driver is missing)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no library, no driver, no GPU: all mean "none"
        return 0


def unavailable_reason() -> Optional[str]:
    """None when MPS can be used here, else one sentence saying why not."""
    if shutil.which(CONTROL_BINARY) is None:
        return f"`{CONTROL_BINARY}` is not on PATH (install the NVIDIA driver utilities)"
    if gpu_count() == 0:
        return "no NVIDIA GPU is visible through NVML"
    return None


def expected_sm_count(total_sms: int, percentage: int) -> int:
    """SMs a client should see at a quota: whole TPCs (2 SMs) below the exact share. Measured on the
    H200: 40% of 132 SMs gave 52."""
    return max(2, min(total_sms, math.floor(total_sms * percentage / 100) // 2 * 2))


class MpsDaemon:
    """A private MPS control daemon; use as a context manager or call start()/stop().

    `start()` returns False (and logs a warning) when MPS is unavailable, so callers fall back to
    plain processes, which share the GPU by time slicing.
    """

    def __init__(self):
        self.root: Optional[str] = None
        self.running = False
        self.stops_with_process = False

    @property
    def pipe_dir(self) -> str:
        return os.path.join(self.root, "pipe")

    @property
    def log_dir(self) -> str:
        return os.path.join(self.root, "log")

    def _env(self) -> dict[str, str]:
        return {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": self.log_dir}

    def start(self) -> bool:
        reason = unavailable_reason()
        if reason is not None:
            log.warning("MPS unavailable (%s); worker processes will share the GPU by time slicing.", reason)
            return False
        self.root = tempfile.mkdtemp(prefix="jaxrose-mps-")
        os.makedirs(self.pipe_dir)
        os.makedirs(self.log_dir)
        try:
            result = subprocess.run([CONTROL_BINARY, "-d"], env=self._env(), capture_output=True, text=True,
                                    timeout=30)
            problem = (result.stderr or result.stdout).strip() if result.returncode != 0 else None
        except (subprocess.TimeoutExpired, OSError) as error:  # a hung or unrunnable control binary
            problem = f"{CONTROL_BINARY} -d: {error}"
        if problem is not None:
            log.warning("MPS daemon failed to start (%s); falling back to time slicing.", problem)
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
            return False
        self.running = True
        return True

    def alive(self) -> bool:
        """Whether the control daemon still answers (a killed daemon leaves new clients unattached)."""
        if not self.running:
            return False
        try:
            result = subprocess.run([CONTROL_BINARY], input="get_server_list\n", env=self._env(),
                                    capture_output=True, text=True, timeout=10)
        except subprocess.TimeoutExpired:
            return False
        return result.returncode == 0

    def client_env(self, sm_percentage: Optional[int] = None, priority: Optional[str] = None) -> dict[str, str]:
        """Variables a client must have before CUDA starts (empty when the daemon is not running).
        `priority`: "normal" or "below-normal" (None: the daemon's default, normal)."""
        if priority is not None and priority not in PRIORITIES:
            raise MpsError(f"An MPS client priority is one of {sorted(PRIORITIES)}, got {priority!r}.")
        if not self.running:
            return {}
        env = {"CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": self.log_dir}
        if sm_percentage is not None:
            if not 1 <= sm_percentage <= 100:
                raise MpsError(f"An SM quota must be a percentage in [1, 100], got {sm_percentage}.")
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(sm_percentage)
        if priority is not None:
            env["CUDA_MPS_CLIENT_PRIORITY"] = PRIORITIES[priority]
        return env

    def stop(self) -> None:
        """Asks the daemon to quit (after its clients have exited) and removes its folders."""
        if self.stops_with_process:
            return
        if self.running:
            subprocess.run([CONTROL_BINARY], input="quit\n", env=self._env(), capture_output=True, text=True,
                           timeout=30)
            self.running = False
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def stop_when_process_exits(self, pid: int) -> None:
        """Stops the daemon once process `pid` has exited, from a detached watcher.

        `quit` waits for connected clients, so a daemon whose client is the calling process itself
        (the trainer) can only be stopped after that process ends.
        """
        if not self.running:
            return
        script = (f"while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; "
                  f"echo quit | {CONTROL_BINARY}; rm -rf '{self.root}'")
        subprocess.Popen(["sh", "-c", script], env=self._env(), start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.stops_with_process = True  # `stop` is the watcher's job now; clients can still be added

    def __enter__(self) -> "MpsDaemon":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


_controller_daemon: Optional[MpsDaemon] = None  # this process's private daemon, once started


def clients_unavailable_reason(enabled: bool = True) -> Optional[str]:
    """None when workers started from this process can be MPS clients with SM quotas (this run's
    daemon answers, or can still start since this process has not initialised its GPU), else why not.
    Without it a quota is an environment variable nobody reads: measuring one measures nothing."""
    from jax._src import xla_bridge

    if not enabled:
        return "MPS is switched off (run.use_mps)"
    reason = unavailable_reason()
    if reason is not None:
        return reason
    if _controller_daemon is None and xla_bridge.backends_are_initialized():
        return ("this process initialised its GPU before the MPS daemon could start; start training in a "
                "fresh process (e.g. the `jaxrose train` command)")
    if _controller_daemon is not None and not _controller_daemon.alive():
        return (f"this run's MPS control daemon ({_controller_daemon.pipe_dir}) no longer answers (killed or "
                f"crashed); its clients lost their GPU context. Restart the run in a fresh process "
                f"(`--run.resume` continues from the last checkpoint)")
    return None


def prepare_clients(quotas: dict[str, Optional[int]], enabled: bool = True,
                    compile_cache: Optional[str] = None, own_quota: Optional[int] = None,
                    priorities: Optional[dict[str, Optional[str]]] = None,
                    own_priority: Optional[str] = None) -> dict[str, dict[str, str]]:
    """Makes this process and the workers to come MPS clients of a private daemon, when possible.

    `quotas` maps each worker's name to its SM percentage (None: no cap). Returns each worker's
    environment. This process (the controller, which also trains) attaches only if it has not
    initialised its GPU yet, with the SM quota `own_quota` (None: no cap; fixed from then on);
    otherwise, or without MPS, everyone shares the GPU by time slicing and a warning says why. The
    daemon stops by itself once this process exits. A worker without a quota of its own beside a
    capped controller is given 100% explicitly, since it would otherwise inherit the controller's.
    `priorities` (worker name → "normal" / "below-normal") and `own_priority` set MPS scheduling
    priorities the same way: fixed at a client's start, a worker without one runs at normal priority.
    """
    import warnings

    envs = {name: {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"} for name in quotas}  # the trainer holds most memory
    if compile_cache:
        for env in envs.values():
            env.update(compile_cache_env(compile_cache))
    global _controller_daemon
    reason = clients_unavailable_reason(enabled)
    if reason is None and _controller_daemon is None:
        daemon = MpsDaemon()
        if daemon.start():
            os.environ.update(daemon.client_env(own_quota, own_priority))
            daemon.stop_when_process_exits(os.getpid())
            _controller_daemon = daemon
    if reason is None and _controller_daemon is not None:
        # Later calls (one per plan measured while tuning) add clients to the same daemon.
        for name, quota in quotas.items():
            envs[name].update(_controller_daemon.client_env(quota, (priorities or {}).get(name)))
            if "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in os.environ:  # a spawned child copies os.environ
                envs[name].setdefault("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100")
            if "CUDA_MPS_CLIENT_PRIORITY" in os.environ:
                envs[name].setdefault("CUDA_MPS_CLIENT_PRIORITY", PRIORITIES["normal"])
        if own_quota is not None and os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") != str(own_quota):
            warnings.warn(f"This process attached to MPS earlier without the SM quota of {own_quota}% asked for now "
                          f"(a quota is fixed for a process's life); it runs at "
                          f"{os.environ.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE', '100')}%.", stacklevel=3)
        own = os.environ.get("CUDA_MPS_CLIENT_PRIORITY", PRIORITIES["normal"])
        if own_priority is not None and own != PRIORITIES[own_priority]:
            warnings.warn(f"This process attached to MPS earlier without the {own_priority} priority asked for now "
                          f"(a priority is fixed for a process's life); it runs at "
                          f"{dict((v, k) for k, v in PRIORITIES.items()).get(own, own)} priority.", stacklevel=3)
    elif reason is not None and gpu_count() > 0:  # on a CPU-only machine there is nothing to warn about
        warnings.warn(f"Worker processes share the GPU without MPS: {reason}.", stacklevel=3)
    return envs


def attachment_problem(env: dict[str, str], info: dict, total_sms: Optional[int] = None) -> Optional[str]:
    """None when a worker started with `env` got the SM quota it asked for, else what went wrong.

    `info` is the worker's ready message (its JAX device's platform and `core_count`). `total_sms`
    is the GPU's full SM count; by default this process's own device count, read only where that is
    safe (this process is an uncapped client of the same daemon, or already runs its GPU)."""
    quota = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    if quota is None or info.get("platform") != "gpu" or info.get("core_count") is None:
        return None  # no quota asked for, or nothing to compare: a plain process is not checked
    total = total_sms if total_sms is not None else _own_sm_count(env)
    if total is None:
        return None
    expected = expected_sm_count(total, int(quota))
    if info["core_count"] == expected:
        return None
    return (f"it sees {info['core_count']} of {total} SMs, but its quota of {quota}% gives {expected}: it is not "
            f"attached to the MPS daemon at {env.get('CUDA_MPS_PIPE_DIRECTORY')} (did the daemon die? `jaxrose "
            f"doctor` checks MPS). It runs uncapped, sharing the GPU by time slicing: results stay exact, but "
            f"quotas and overlap do not take effect")


def _own_sm_count(env: dict[str, str]) -> Optional[int]:
    from jax._src import xla_bridge

    same_daemon = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") == env.get("CUDA_MPS_PIPE_DIRECTORY")
    uncapped = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in os.environ
    if not uncapped or not (same_daemon or xla_bridge.backends_are_initialized()):
        return None  # initialising this process's GPU here could bypass MPS or count a capped share
    import jax

    device = jax.devices()[0]
    return getattr(device, "core_count", None) if device.platform == "gpu" else None


def compile_cache_env(folder: str) -> dict[str, str]:
    """Environment that points a worker's JAX at the shared persistent compilation cache."""
    return {"JAX_COMPILATION_CACHE_DIR": os.path.abspath(os.path.expanduser(folder)),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
