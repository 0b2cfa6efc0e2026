"""GPU activity over time, read from NVML's GPU Performance Monitoring (GPM) counters.

A background thread takes a GPM snapshot every `interval_s` and turns each pair of consecutive
snapshots into one sample: SM activity (the share of SMs busy, what the benchmark protocol calls
"SM activity") and SM occupancy (active warps against the theoretical maximum), with the device's
SM clock, temperature, power and clock-limit reasons at its end. `mark(label)`
records named instants, so the average over any window (a system's steady state, say) can be
read afterwards with `mean(t0, t1)`. All times are `time.perf_counter()` seconds.

Where NVML or GPM is missing (no GPU, no driver, a GPU older than Hopper, no permission), the
sampler still works as a context manager: `available` is False, `reason` says why, one warning is
logged, and `mean()` returns None, so a benchmark runs unchanged on a CPU machine.
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
from typing import NamedTuple, Optional, Union

logger = logging.getLogger(__name__)

# GPM derives every metric from two snapshots; NVIDIA asks for them to be at least 100 ms apart.
MIN_INTERVAL_S = 0.1


class Sample(NamedTuple):
    t: float
    """Midpoint (perf_counter seconds) of the interval the sample averages over."""
    sm_activity_pct: float
    sm_occupancy_pct: float
    # The device's state at the sample's end (None where NVML does not report it): a rate that differs
    # between two runs of the same program is often a clock held down by power or heat.
    sm_clock_mhz: Optional[float] = None
    temperature_c: Optional[float] = None
    power_w: Optional[float] = None
    clock_limits: Optional[int] = None
    """NVML's clocks event reasons bitmask: why the SM clock was below its maximum (CLOCK_LIMITS)."""


# NVML's clocks event reasons (nvmlClocksEventReason*), the bits of Sample.clock_limits.
CLOCK_LIMITS = {0x1: "idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}


def nvml_device(device_index: int, visible: Optional[str]) -> Union[int, str]:
    """NVML's name for this process's CUDA device `device_index`: NVML counts every GPU of the host,
    CUDA only those in CUDA_VISIBLE_DEVICES (a process pinned to GPU 3 calls it device 0). Returns an
    NVML index, or a UUID where the variable lists UUIDs."""
    entries = [v.strip() for v in (visible or "").split(",") if v.strip() != ""]
    if not entries:
        return device_index
    if device_index >= len(entries):
        raise ValueError(f"CUDA device {device_index} is not among CUDA_VISIBLE_DEVICES={visible}.")
    entry = entries[device_index]
    return int(entry) if entry.isdigit() else entry


class GpuActivitySampler:
    """Samples SM activity and occupancy of one GPU in a background thread.

    with GpuActivitySampler() as sampler:
        t0 = sampler.mark("steady_start"); work(); t1 = sampler.mark("steady_end")
    sampler.mean(t0, t1)  # {"sm_activity_pct": ..., "sm_occupancy_pct": ..., "num_samples": ...} or None
    """

    def __init__(self, device_index: int = 0, interval_s: float = MIN_INTERVAL_S):
        if interval_s < MIN_INTERVAL_S:
            raise ValueError(f"interval_s must be >= {MIN_INTERVAL_S} s (GPM needs snapshots at least 100 ms "
                             f"apart), got {interval_s}; raise interval_s.")
        self.device_index = device_index
        self.interval_s = interval_s
        self.available = False
        self.reason: Optional[str] = "The sampler has not been started; use it as a context manager or call start()."
        self._samples: list[Sample] = []
        self._marks: list[tuple[str, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._nvml = None
        self._handle = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> "GpuActivitySampler":
        self.reason = self._open()
        self.available = self.reason is None
        if not self.available:
            logger.warning("GPU activity sampling is off: %s", self.reason)
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-activity-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # shutting down must never mask the caller's own exception
                pass
            self._nvml = None

    def __enter__(self) -> "GpuActivitySampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- reading ---------------------------------------------------------------------------------

    def mark(self, label: str) -> float:
        """Records `label` at the current time and returns that time."""
        t = time.perf_counter()
        with self._lock:
            self._marks.append((label, t))
        return t

    def marks(self) -> dict[str, float]:
        """Label -> time of its latest mark."""
        with self._lock:
            return dict(self._marks)

    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)

    def mean(self, t0: Optional[float] = None, t1: Optional[float] = None) -> Optional[dict]:
        """Averages of the samples whose time lies in [t0, t1] (open ends: all), or None.

        None when sampling is unavailable or no sample falls in the window (a window shorter than
        `interval_s` may hold none).
        """
        if not self.available:
            return None
        return window_mean(self.samples(), t0, t1)

    # -- NVML ------------------------------------------------------------------------------------

    def _open(self) -> Optional[str]:
        """Initialises NVML and checks GPM support; returns why sampling is impossible, or None."""
        try:
            import pynvml
        except ImportError as e:
            return f"pynvml is not importable ({e}); install nvidia-ml-py."
        try:
            pynvml.nvmlInit()
        except Exception as e:
            return f"NVML could not be initialised ({_describe(e)}): no NVIDIA GPU or driver on this machine."
        self._nvml = pynvml
        try:
            where = nvml_device(self.device_index, os.environ.get("CUDA_VISIBLE_DEVICES"))
            self._handle = (pynvml.nvmlDeviceGetHandleByUUID(where) if isinstance(where, str)
                            else pynvml.nvmlDeviceGetHandleByIndex(where))
            supported = pynvml.nvmlGpmQueryDeviceSupport(self._handle).isSupportedDevice
        except Exception as e:
            self.stop()
            return f"GPM could not be queried on GPU {self.device_index} ({_describe(e)})."
        if not supported:
            self.stop()
            return f"GPU {self.device_index} does not support GPM metrics (they need a Hopper or newer GPU)."
        return None

    def _run(self) -> None:
        nvml = self._nvml
        previous, current = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
        try:
            nvml.nvmlGpmSampleGet(self._handle, previous)
            t_previous = time.perf_counter()
            while not self._stop.wait(self.interval_s):
                nvml.nvmlGpmSampleGet(self._handle, current)
                t_current = time.perf_counter()
                activity, occupancy = self._metrics(previous, current)
                state = self._device_state()
                with self._lock:
                    self._samples.append(Sample(0.5 * (t_previous + t_current), activity, occupancy, *state))
                previous, current, t_previous = current, previous, t_current
        except Exception as e:  # a sampler failure must not kill the benchmark; it says so once
            self.reason = f"GPM sampling stopped after {len(self._samples)} samples ({_describe(e)})."
            logger.warning("GPU activity sampling stopped: %s", self.reason)
        finally:
            nvml.nvmlGpmSampleFree(previous)
            nvml.nvmlGpmSampleFree(current)

    def _device_state(self) -> tuple:
        """SM clock (MHz), temperature (C), power (W) and the clock-limit reasons, each None where
        this driver or GPU does not report it (the GPM counters go on regardless)."""
        nvml, handle = self._nvml, self._handle
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        reads = (lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
                 lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
                 lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,  # milliwatts
                 lambda: int(reasons(handle)))
        values = []
        for read in reads:
            try:
                values.append(read())
            except Exception:
                values.append(None)
        return tuple(values)

    def _metrics(self, sample1, sample2) -> tuple[float, float]:
        nvml = self._nvml
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.sample1, request.sample2 = sample1, sample2
        metric_ids = (nvml.NVML_GPM_METRIC_SM_UTIL, nvml.NVML_GPM_METRIC_SM_OCCUPANCY)
        request.numMetrics = len(metric_ids)
        for slot, metric_id in enumerate(metric_ids):
            request.metrics[slot].metricId = metric_id
        nvml.nvmlGpmMetricsGet(request)
        values = []
        for slot in range(len(metric_ids)):
            metric = request.metrics[slot]
            if metric.nvmlReturn != nvml.NVML_SUCCESS:
                raise RuntimeError(f"GPM metric {metric.metricId} returned NVML error {metric.nvmlReturn}")
            values.append(float(metric.value))
        return values[0], values[1]


def window_mean(samples: list[Sample], t0: Optional[float] = None, t1: Optional[float] = None) -> Optional[dict]:
    """Plain average of the samples with t0 <= t <= t1; samples are equally spaced, so no weights."""
    inside = [s for s in samples if (t0 is None or s.t >= t0) and (t1 is None or s.t <= t1)]
    if not inside:
        return None
    n = len(inside)
    summary = {"sm_activity_pct": sum(s.sm_activity_pct for s in inside) / n,
               "sm_occupancy_pct": sum(s.sm_occupancy_pct for s in inside) / n,
               "num_samples": n}
    return {**summary, **device_state_summary(inside)}


def device_state_summary(samples: list[Sample]) -> dict:
    """The window's SM clock (median, min), peak temperature, mean power and the share of samples
    each clock-limit reason held the clock down (idle excluded: an idle GPU is not held back); only
    what NVML reported."""
    summary = {}
    clocks = [s.sm_clock_mhz for s in samples if s.sm_clock_mhz is not None]
    if clocks:
        summary["sm_clock_mhz_median"], summary["sm_clock_mhz_min"] = statistics.median(clocks), min(clocks)
    temperatures = [s.temperature_c for s in samples if s.temperature_c is not None]
    if temperatures:
        summary["temperature_c_max"] = max(temperatures)
    powers = [s.power_w for s in samples if s.power_w is not None]
    if powers:
        summary["power_w_mean"] = statistics.fmean(powers)
    limits = [s.clock_limits for s in samples if s.clock_limits is not None]
    if limits:
        summary["clock_limited_share"] = {name: sum(bool(mask & bit) for mask in limits) / len(limits)
                                          for bit, name in CLOCK_LIMITS.items()
                                          if name != "idle" and any(mask & bit for mask in limits)}
    return summary


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}".rstrip(": ")
