"""The command line: presets listing, a short training run end to end, and readable errors."""

import json

import pytest

from jaxrose.cli import COMMANDS, main


def test_presets_lists_named_workloads(capsys):
    main(["presets"])
    out = capsys.readouterr().out
    for name in ("point-mass", "pendulum", "ant-mlp", "humanoid-mlp"):
        assert name in out


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_prints_its_help(command, capsys):
    # argparse formats help strings with %-interpolation: a stray "%" crashes --help.
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage" in capsys.readouterr().out.lower()


def test_train_writes_metrics_plot_and_checkpoint(tmp_path, capsys):
    main(["train", "--preset", "point-mass", "--run.total-env-steps", "10240", "--run.num-evals", "3",
          "--run.num-eval-envs", "8", "--env.num-envs", "64", "--ppo.batch-size", "32", "--ppo.num-minibatches", "4",
          "--run.out-dir", str(tmp_path), "--run.no-progress-bar"])
    assert "final evaluation return" in capsys.readouterr().out
    assert (tmp_path / "learning_curve.png").stat().st_size > 1000
    assert any((tmp_path / "tensorboard").iterdir())
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sum("eval/episode_return" in r for r in records) == 3
    assert all(r["perf/sps"] > 0 for r in records if "perf/sps" in r)
    assert json.loads((tmp_path / "config.json").read_text())["env"]["num_envs"] == 64
    assert (tmp_path / "checkpoints").is_dir()


@pytest.mark.parametrize("args, message", [
    (["train", "--preset", "nope"], "Unknown preset 'nope'. Known presets:"),
    (["train", "--preset", "point-mass", "--env.name", "antt", "--run.no-progress-bar"],
     "Unknown environment 'antt'. Known environments:"),
])
def test_bad_input_gives_one_line_error(args, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(args + ["--run.out-dir", str(tmp_path)] if "--env.name" in args else args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_unknown_command(capsys):
    with pytest.raises(SystemExit):
        main(["fly"])
    assert "Unknown command 'fly'" in capsys.readouterr().err


def test_doctor_reports_this_machine(capsys):
    main(["doctor"])
    report = json.loads(capsys.readouterr().out)
    assert report["jax_backend"] == "cpu"
    assert report["versions"]["brax"] == "0.14.2"
    assert "not on PATH" in report["mps"] or "no NVIDIA GPU" in report["mps"]
    assert report["nvml_gpus"] == [] or "error" in report["nvml_gpus"][0]


def test_doctor_reports_a_gpu_backend_that_cannot_start_instead_of_crashing():
    import os
    import subprocess
    import sys

    env = {**os.environ, "JAX_PLATFORMS": "cuda"}  # no CUDA here: the backend cannot start
    done = subprocess.run([sys.executable, "-c", "from jaxrose.cli import main; main(['doctor'])"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["jax_backend"] is None and "error" in report["jax_devices"]
    assert "JAX_PLATFORMS" in report["jax_devices"]["check"] and report["versions"]["jax"]


def test_lost_gpu_context_anywhere_is_a_one_line_error(monkeypatch, capsys):
    import jax

    from jaxrose import cli

    def lose_the_gpu(command, args):  # fault injection: JAX's error when the MPS server dies (H200)
        raise jax.errors.JaxRuntimeError("INTERNAL: CUDA error: CUDA_ERROR_MPS_RPC_FAILURE: the remote procedural "
                                         "call between the MPS server and the MPS client failed")

    monkeypatch.setattr(cli, "_dispatch", lose_the_gpu)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the GPU context of this process failed") and "--run.resume" in err

    def other_runtime_error(command, args):
        raise jax.errors.JaxRuntimeError("INVALID_ARGUMENT: something else")

    monkeypatch.setattr(cli, "_dispatch", other_runtime_error)
    with pytest.raises(jax.errors.JaxRuntimeError, match="something else"):
        cli.main(["train"])
