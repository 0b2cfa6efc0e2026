"""The GPU activity sampler: graceful absence without a GPU, and the window averages by hand."""

import logging
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
