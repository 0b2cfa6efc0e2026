"""MPS control on a machine without a GPU: the documented fallback, and the quota arithmetic."""

import logging

import pytest

from jaxrose.mps import MpsDaemon, MpsError, expected_sm_count, unavailable_reason


def test_expected_sm_count_matches_h200_measurement():
    # Measured on an H200 (DESIGN.md): CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40 -> 52 of 132 SMs.
    assert expected_sm_count(132, 40) == 52
    assert expected_sm_count(132, 100) == 132


def test_daemon_falls_back_with_a_warning_without_gpu(caplog):
    assert unavailable_reason() is not None
    daemon = MpsDaemon()
    with caplog.at_level(logging.WARNING):
        assert daemon.start() is False
    assert "MPS unavailable" in caplog.text and "time slicing" in caplog.text
    assert daemon.client_env(40) == {}
    daemon.stop()


def test_quota_must_be_a_percentage():
    daemon = MpsDaemon()
    daemon.running, daemon.root = True, "/nonexistent"  # pretend it runs, to reach the quota check
    with pytest.raises(MpsError, match=r"\[1, 100\]"):
        daemon.client_env(150)
    daemon.running, daemon.root = False, None


def test_daemon_that_fails_to_start_falls_back_with_a_warning(caplog, monkeypatch, tmp_path):
    import jaxrose.mps as mps

    # Fault injection: a GPU is "present" and the control binary exits 1, as a refused start does.
    fake = tmp_path / "nvidia-cuda-mps-control"
    fake.write_text("#!/bin/sh\necho 'fault injection: refused' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(mps, "CONTROL_BINARY", str(fake))
    monkeypatch.setattr(mps, "gpu_count", lambda: 1)
    daemon = MpsDaemon()
    with caplog.at_level(logging.WARNING):
        assert daemon.start() is False
    assert "MPS daemon failed to start (fault injection: refused)" in caplog.text and "time slicing" in caplog.text
    assert daemon.root is None and daemon.client_env(40) == {}  # its private folders are gone
