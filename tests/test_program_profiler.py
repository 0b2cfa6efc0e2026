"""Profiling a real program on CPU, and `jaxrose plan` end to end."""

import json


from jaxrose.cli import main
from jaxrose.plan import Plan
from jaxrose.program_profiler import default_executor_factory, profile_program


def test_profile_covers_every_top_level_node(tiny_config):
    profile = profile_program(default_executor_factory, tiny_config, iterations=2)
    assert set(profile.stages) == {"split_iteration_key", "unroll", "prepare_batch", "update_normalizer",
                                   "split_learner_key", "epoch", "reduce_metrics"}
    assert all(stage.seconds >= 0 for stage in profile.stages.values())
    assert profile.dispatch_seconds > 0
    # The epochs (4 minibatch SGD steps x 2) cost more than splitting a key.
    assert profile.stages["epoch"].seconds > profile.stages["split_learner_key"].seconds
    assert "no SM activity" in profile.source


def test_plan_command_saves_a_loadable_plan_and_timelines(tmp_path, capsys):
    main(["plan", "--preset", "point-mass", "--iterations", "2", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "candidates, by predicted gain" in out and "chosen:" in out
    plan = Plan.load(str(tmp_path / "plan.json"))
    assert plan.program == "ppo"
    assert json.loads((tmp_path / "profile.json").read_text())["stages"]["epoch"]["seconds"] > 0
    for name in ("timeline_before.png", "timeline_after.png"):
        assert (tmp_path / name).stat().st_size > 5000
