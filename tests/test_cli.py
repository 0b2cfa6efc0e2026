"""The command line: presets listing, a short training run end to end, and readable errors."""

import json

import pytest

from jaxrose.cli import main


def test_presets_lists_named_workloads(capsys):
    main(["presets"])
    out = capsys.readouterr().out
    for name in ("point-mass", "pendulum", "ant-mlp", "humanoid-mlp"):
        assert name in out


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
