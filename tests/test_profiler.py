"""The GPU activity sampler: graceful absence without a GPU, and the window averages by hand."""

import logging
import os
import sys

import pytest

from jaxrose.profiler import GpuActivitySampler, Sample, window_mean


def _nvml_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


@pytest.mark.skipif(_nvml_present(), reason="this machine has an NVIDIA driver; the test is for CPU machines")
def test_unavailable_on_a_cpu_machine(caplog):
    with caplog.at_level(logging.WARNING, logger="jaxrose.profiler"):
        with GpuActivitySampler() as sampler:
            sampler.mark("start")
            sampler.mark("end")
    assert sampler.available is False
    assert "NVML" in sampler.reason and sampler.reason.endswith(".")
    assert sampler.mean() is None
    assert sampler.mean(0.0, 1e9) is None
    assert sampler.samples() == []
    assert set(sampler.marks()) == {"start", "end"}
    assert len([r for r in caplog.records if "sampling is off" in r.message]) == 1


def test_missing_pynvml_is_reported_not_raised(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with GpuActivitySampler() as sampler:
        pass
    assert sampler.available is False
    assert "pynvml" in sampler.reason and "nvidia-ml-py" in sampler.reason
    assert sampler.mean() is None


def test_interval_below_gpm_minimum_is_refused():
    with pytest.raises(ValueError, match="interval_s must be >= 0.1"):
        GpuActivitySampler(interval_s=0.05)


class FakeSampler(GpuActivitySampler):
    """A sampler with injected samples instead of NVML readings."""

    def __init__(self, samples):
        super().__init__()
        self.available, self.reason = True, None
        self._samples = list(samples)


SAMPLES = [Sample(1.0, 10.0, 2.0), Sample(2.0, 20.0, 4.0), Sample(3.0, 60.0, 9.0), Sample(4.0, 90.0, 1.0)]


def test_window_mean_by_hand():
    sampler = FakeSampler(SAMPLES)
    # All four: activity (10 + 20 + 60 + 90) / 4 = 45, occupancy (2 + 4 + 9 + 1) / 4 = 4.
    assert sampler.mean() == {"sm_activity_pct": 45.0, "sm_occupancy_pct": 4.0, "num_samples": 4}
    # [1.5, 3.0] holds t = 2 and t = 3 (ends included): (20 + 60) / 2 = 40, (4 + 9) / 2 = 6.5.
    assert sampler.mean(1.5, 3.0) == {"sm_activity_pct": 40.0, "sm_occupancy_pct": 6.5, "num_samples": 2}
    # Open start up to 2.0: (10 + 20) / 2 = 15, (2 + 4) / 2 = 3.
    assert sampler.mean(t1=2.0) == {"sm_activity_pct": 15.0, "sm_occupancy_pct": 3.0, "num_samples": 2}
    # From 3.5 on: only t = 4.
    assert sampler.mean(t0=3.5) == {"sm_activity_pct": 90.0, "sm_occupancy_pct": 1.0, "num_samples": 1}
    # A window between samples holds none.
    assert sampler.mean(2.2, 2.8) is None


def test_window_mean_of_no_samples_is_none():
    assert window_mean([]) is None


def test_marks_return_their_time_and_keep_the_latest_per_label():
    sampler = GpuActivitySampler()
    first = sampler.mark("a")
    second = sampler.mark("a")
    assert second >= first
    assert sampler.marks() == {"a": second}


def test_window_mean_adds_the_device_state_by_hand():
    samples = [Sample(1.0, 10.0, 2.0, 1980.0, 50.0, 300.0, 0x0),
               Sample(2.0, 20.0, 4.0, 1755.0, 61.0, 700.0, 0x4),          # power cap
               Sample(3.0, 60.0, 9.0, 1980.0, 58.0, 650.0, 0x4 | 0x20),   # power cap and software thermal
               Sample(4.0, 90.0, 1.0, 1410.0, 55.0, 350.0, 0x1)]          # idle: not counted as held down
    summary = window_mean(samples)
    # Clocks sorted 1410, 1755, 1980, 1980: median (1755 + 1980) / 2 = 1867.5, min 1410; hottest 61 C;
    # power (300 + 700 + 650 + 350) / 4 = 500 W; power cap in 2 of 4 samples, software thermal in 1 of 4.
    assert summary == {"sm_activity_pct": 45.0, "sm_occupancy_pct": 4.0, "num_samples": 4,
                       "sm_clock_mhz_median": 1867.5, "sm_clock_mhz_min": 1410.0, "temperature_c_max": 61.0,
                       "power_w_mean": 500.0, "clock_limited_share": {"sw_power_cap": 0.5, "sw_thermal_slowdown": 0.25}}
    # A window of one sample: median and min are its clock; nothing held the clock down.
    assert window_mean(samples, 0.5, 1.5)["clock_limited_share"] == {}
    assert window_mean(samples, 0.5, 1.5)["sm_clock_mhz_median"] == 1980.0


class FakeNvml:
    """Models NVML's device queries for one GPU (no GPU here); `missing` names queries it refuses."""

    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0

    def __init__(self, missing=()):
        self.missing = set(missing)

    def _answer(self, query, value):
        if query in self.missing:
            raise RuntimeError(f"{query}: Not Supported")
        return value

    def nvmlDeviceGetClockInfo(self, handle, clock):
        assert clock == self.NVML_CLOCK_SM
        return self._answer("clock", 1755)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return self._answer("temperature", 63)

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._answer("power", 612_500)  # milliwatts

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):  # the older name, where EventReasons is absent
        return self._answer("reasons", 0x4)


def test_device_state_reads_each_query_and_keeps_going_without_the_ones_not_supported():
    sampler = GpuActivitySampler()
    sampler._nvml, sampler._handle = FakeNvml(), object()
    assert sampler._device_state() == (1755.0, 63.0, 612.5, 0x4)
    sampler._nvml = FakeNvml(missing={"temperature", "reasons"})
    assert sampler._device_state() == (1755.0, None, 612.5, None)


def test_the_bench_report_names_the_clock_and_what_held_it_down():
    from jaxrose.bench_report import gpu_state_lines

    results = {"systems": {
        "brax": {"sm": window_mean([Sample(1.0, 40.0, 14.0, 1755.0, 70.0, 650.0, 0x4)])},
        "async": {"sm": window_mean([Sample(1.0, 70.0, 30.0, 1980.0, 60.0, 500.0, 0x0)])},
        "sim": {"sm": {"sm_activity_pct": 50.0, "sm_occupancy_pct": 20.0, "num_samples": 3}},  # no device state
    }}
    assert gpu_state_lines(results) == [
        "- GPU state over each system's measured window: brax PPO: SM clock 1755 MHz median (min 1755), up to 70 C, "
        "650 W mean; clock held down by sw_power_cap in 100% of samples; jaxrose asynchronous (actors, lag <= "
        "run.max_policy_lag): SM clock 1980 MHz median (min 1980), up to 60 C, 500 W mean."]
    assert gpu_state_lines({"systems": {"sim": {"sm": None}}}) == []


def test_the_bench_plot_draws_the_sm_clock_where_it_was_sampled(tmp_path):
    from jaxrose.bench_report import plot_results

    samples = [[0.1 * i, 50.0, 20.0, 1980.0 - i] for i in range(20)]
    results = {"meta": {"preset": "ant-mlp", "device_kind": "modelled GPU", "sm_sampling": {"reason": None}},
               "systems": {"sim": {"status": "ok", "steady_sps": 1e6, "window": [0.5, 1.5]}},
               "limits": {}, "gpu_activity": {"samples": samples, "marks": {}}}
    with_clock = plot_results(results, str(tmp_path / "with.png"))
    results["gpu_activity"]["samples"] = [s[:3] for s in samples]  # results from before the clock was sampled
    without = plot_results(results, str(tmp_path / "without.png"))
    assert os.path.getsize(with_clock) > 0 and os.path.getsize(without) > 0
    assert open(with_clock, "rb").read() != open(without, "rb").read()


def test_the_sampled_gpu_is_the_one_this_process_uses():
    """NVML counts the host's GPUs, CUDA the visible ones: a process pinned to GPU 3 samples GPU 3."""
    from jaxrose.profiler import nvml_device

    assert nvml_device(0, None) == 0 and nvml_device(1, "") == 1  # nothing pinned: the same index
    assert nvml_device(0, "3") == 3 and nvml_device(1, "2,5") == 5
    assert nvml_device(0, "GPU-8c1e0b5a-1111-2222-3333-444455556666") == "GPU-8c1e0b5a-1111-2222-3333-444455556666"
    with pytest.raises(ValueError, match="CUDA device 1 is not among CUDA_VISIBLE_DEVICES=3"):
        nvml_device(1, "3")
