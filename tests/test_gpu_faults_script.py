"""scripts/gpu_faults.py on the CPU: it says no GPU is present, and its dry run (plain processes, no
MPS) exercises the machinery the GPU cases use: workers busy with JAX work, a kill mid-work, bounded
watching, fallback when the MPS control binary is missing or fails."""

import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "gpu_faults.py")


def run(*args, timeout=180) -> dict:
    result = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_without_a_gpu_it_says_so():
    report = run()
    assert report["gpus"] == 0 and "no NVIDIA GPU is present" in report["skipped"]
    assert report["cases"] == {} and report["verdicts"] == {}


def test_dry_run_on_cpu():
    report = run("--dry-run", "--cases", "mps_missing,client_killed", "--watch", "3")
    verdicts = report["verdicts"]
    assert verdicts["mps_missing"] == "fallback with a warning, work runs without MPS", report["cases"]["mps_missing"]
    assert verdicts["client_killed"].startswith("killed client reported after"), report["cases"]["client_killed"]
    assert "the other clients kept running; a new client ran" in verdicts["client_killed"]
