"""scripts/gpu_xla_flags_probe.py on the CPU: every variant in its own process with its flags, the ratios by hand."""

import json
import os
import subprocess
import sys

import pytest

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


def test_each_variant_runs_with_its_flags_and_is_compared_with_the_default(tmp_path):
    out = tmp_path / "flags.json"
    result = subprocess.run(
        [sys.executable, os.path.join(SCRIPTS, "gpu_xla_flags_probe.py"), "point-mass", "3", "--groups=2",
         "--variants=default,no-command-buffers", f"--out={out}", "--", "--env.num-envs", "32",
         "--ppo.batch-size", "16", "--ppo.num-minibatches", "2", "--ppo.off-policy-correction", "vtrace"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert list(report["variants"]) == ["default", "no-command-buffers"]
    default, variant = report["variants"]["default"], report["variants"]["no-command-buffers"]
    # each child saw the caller's flags plus its own (conftest's optimisation level stays in front)
    assert default["xla_flags"] == report["base_xla_flags"]
    assert variant["xla_flags"].endswith("--xla_gpu_enable_command_buffer=")
    assert variant["xla_flags"].startswith(report["base_xla_flags"])
    assert default["env_steps"] == 64 * 10 * (16 * 2 // 32) and default["updates_per_rollout"] == 2
    for program in ("sim_flat_zero", "actor", "learner"):
        assert len(variant[program]["seconds"]) == 3 and variant["compile_s"][program] > 0
        assert variant["over_default"][program] == pytest.approx(
            variant[program]["median_s"] / default[program]["median_s"])
        assert default["over_default"][program] == 1.0


def test_only_the_named_programs_are_timed_and_a_learner_unroll_variant_keeps_the_callers_flags(tmp_path):
    out = tmp_path / "flags.json"
    result = subprocess.run(
        [sys.executable, os.path.join(SCRIPTS, "gpu_xla_flags_probe.py"), "point-mass", "2", "--groups=2",
         "--variants=default,loops-in-command-buffers,learner-unroll-4", "--programs=learner", f"--out={out}", "--",
         "--env.num-envs", "32", "--ppo.batch-size", "16", "--ppo.num-minibatches", "2"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    default, loops = report["variants"]["default"], report["variants"]["loops-in-command-buffers"]
    assert list(loops["compile_s"]) == ["learner"] and "actor" not in loops and "sim_flat_zero" not in loops
    assert list(loops["over_default"]) == ["learner"]
    assert loops["env_steps"] == 64 * 10 * (16 * 2 // 32)
    # the unroll variant trains with its setting; code, not flags, differs from the default
    unroll = report["variants"]["learner-unroll-4"]
    assert default["learner_unroll"] == 1 and default["variant_train_args"] == []
    assert unroll["learner_unroll"] == 4 and unroll["variant_train_args"] == ["--run.learner-unroll", "4"]
    assert unroll["xla_flags"] == report["base_xla_flags"]
    assert unroll["over_default"]["learner"] == pytest.approx(
        unroll["learner"]["median_s"] / default["learner"]["median_s"])


def test_an_unknown_variant_is_refused_naming_the_known_ones():
    result = subprocess.run([sys.executable, os.path.join(SCRIPTS, "gpu_xla_flags_probe.py"), "point-mass", "3",
                             "--variants=default,fast"], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "unknown fast" in result.stderr and "loops-in-command-buffers" in result.stderr
    result = subprocess.run([sys.executable, os.path.join(SCRIPTS, "gpu_xla_flags_probe.py"), "point-mass", "3",
                             "--programs=learner,evaluator"], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "unknown evaluator" in result.stderr and "sim_flat_zero" in result.stderr


def test_groups_that_do_not_divide_into_updates_are_refused_before_any_variant_runs(tmp_path):
    out = tmp_path / "flags.json"
    result = subprocess.run([sys.executable, os.path.join(SCRIPTS, "gpu_xla_flags_probe.py"), "point-mass", "3",
                             "--groups=3", f"--out={out}", "--", "--env.num-groups", "2", "--env.num-envs", "32"],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode != 0 and "env.num_groups (2)" in result.stderr and "--groups=4" in result.stderr
    assert not out.exists()


def test_a_variant_past_its_time_is_killed_and_recorded_and_the_next_one_runs(tmp_path):
    out = tmp_path / "flags.json"
    result = subprocess.run(
        [sys.executable, os.path.join(SCRIPTS, "gpu_xla_flags_probe.py"), "point-mass", "2", "--groups=2",
         "--variants=default,no-command-buffers", "--programs=learner", "--variant-seconds=0.5", f"--out={out}",
         "--", "--env.num-envs", "32", "--ppo.batch-size", "16", "--ppo.num-minibatches", "2"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr[-3000:]
    variants = json.loads(out.read_text())["variants"]
    assert list(variants) == ["default", "no-command-buffers"]  # the second ran after the first was killed
    assert all(v["error"] == "killed past --variant-seconds=0.5" for v in variants.values())
