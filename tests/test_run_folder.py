"""Two runs never share an output folder's files: a fresh run sets an earlier run aside, a resumed run
drops what the earlier run logged after its checkpoint, and a resume with other shapes says which
setting differs instead of calling the checkpoint damaged."""

import json

import jax
import numpy as np
import pytest

from jaxrose import train
from jaxrose.checkpoint import CheckpointError, Checkpointer
from jaxrose.config import replace
from jaxrose.run_folder import EarlierRunWarning, drop_metrics_after
from jaxrose.sequential import SequentialExecutor


def _records(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def _restore(folder, config):
    template = SequentialExecutor(config).init(jax.random.PRNGKey(0))
    checkpointer = Checkpointer(str(folder / "checkpoints"))
    try:
        return checkpointer.restore(template, config)
    finally:
        checkpointer.close()


def _same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def test_a_second_fresh_run_sets_the_first_aside(tiny_config, tmp_path):
    folder = tmp_path / "run"
    config = replace(tiny_config, **{"run.out_dir": str(folder), "run.num_evals": 2})
    first = train(config)
    with pytest.warns(EarlierRunWarning, match="were moved to .*earlier-runs"):
        second = train(replace(config, **{"run.seed": 1}))  # before the fix: orbax refused step 2 again
    (earlier,) = (folder / "earlier-runs").iterdir()
    for run_folder in (folder, earlier):  # one run's records each: one compile, 4 iterations
        records = _records(run_folder)
        assert sum("perf/compile_seconds" in r for r in records) == 1
        assert [r["step"] for r in records if "perf/sps" in r] == [512, 1024, 1536, 2048]
        assert (run_folder / "learning_curve.png").exists()
    # Each folder's checkpoint is its own run's final state.
    assert not _same(first.state.learner.params, second.state.learner.params)
    assert _same(_restore(folder, config).learner.params, second.state.learner.params)
    assert _same(_restore(earlier, config).learner.params, first.state.learner.params)


def test_a_resume_in_place_drops_records_logged_after_the_checkpoint(tiny_config, tmp_path):
    folder = tmp_path / "run"
    half = replace(tiny_config, **{"run.out_dir": str(folder), "run.total_env_steps": 1024, "run.num_evals": 2})
    train(half)
    with open(folder / "metrics.jsonl", "a") as f:  # what a run killed after iteration 3 left behind
        f.write(json.dumps({"step": 1536, "perf/sps": 1.0}) + "\n")
        f.write('{"step": 2048, "perf/s')  # torn by the kill
    train(replace(tiny_config, **{"run.out_dir": str(folder), "run.resume": str(folder)}))
    records = _records(folder)
    assert [r["step"] for r in records if "perf/sps" in r] == [512, 1024, 1536, 2048]
    assert all(r["perf/sps"] != 1.0 for r in records if "perf/sps" in r)
    assert not (folder / "earlier-runs").exists()


def test_drop_metrics_after_keeps_order_and_earlier_records(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"step": 0, "eval/x": 1}, {"step": 512, "a": 2}, {"step": 1024, "a": 3}, {"step": 512, "eval/x": 4}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert drop_metrics_after(str(path), 512) == 1
    assert _records(tmp_path) == [lines[0], lines[1], lines[3]]
    assert drop_metrics_after(str(tmp_path / "missing.jsonl"), 0) == 0


def test_a_resume_with_other_shapes_names_the_setting_and_keeps_the_step(tiny_config, tmp_path):
    folder = tmp_path / "run"
    train(replace(tiny_config, **{"run.out_dir": str(folder), "run.num_evals": 2}))
    steps = sorted(p.name for p in (folder / "checkpoints").iterdir())
    bigger = replace(tiny_config, **{"env.num_envs": 64, "run.out_dir": str(tmp_path / "b"), "run.resume": str(folder)})
    with pytest.raises(CheckpointError, match=r"different env settings \(env\.num_envs: 32 saved, 64 now\)"):
        train(bigger)
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == steps  # nothing set aside as damaged


def test_a_study_folder_keeps_an_earlier_studys_files_and_writes_whole_files(tmp_path):
    """What bench, lag-study, ablate and compare call before writing: earlier outputs move aside (other
    files stay), and each JSON file is replaced whole through a temporary file."""
    from jaxrose.run_folder import set_aside, write_atomically

    (tmp_path / "results.json").write_text('{"old": 1}')
    (tmp_path / "notes.txt").write_text("the user's own file")
    with pytest.warns(EarlierRunWarning, match=r"--out .* held an earlier run's outputs \(results.json\)"):
        moved = set_aside(str(tmp_path), ("results.json", "results.md"), "--out", "Give each its own --out.")
    assert json.loads(open(f"{moved}/results.json").read()) == {"old": 1}
    assert (tmp_path / "notes.txt").exists() and not (tmp_path / "results.json").exists()
    assert set_aside(str(tmp_path), ("results.json",), "--out") is None  # nothing left to move
    write_atomically(str(tmp_path / "results.json"), '{"new": 2}')
    assert json.loads((tmp_path / "results.json").read_text()) == {"new": 2}
    assert not (tmp_path / "results.json.tmp").exists()


@pytest.mark.parametrize("eval_mode", ["inline", "process"])
def test_a_resume_evaluates_its_starting_step_only_where_the_killed_run_lost_that_evaluation(tiny_config, tmp_path,
                                                                                            eval_mode):
    folder = tmp_path / "run"

    def run(iterations, resume):
        config = replace(tiny_config, **{"run.out_dir": str(folder), "run.total_env_steps": 512 * iterations,
                                         "run.num_evals": iterations // 2 + 1, "run.eval_mode": eval_mode,
                                         **({"run.resume": str(folder)} if resume else {})})
        assert config.iterations_per_eval == 2  # one schedule: an evaluation every 1024 steps
        train(config)

    def evaluations():
        return [(r["step"], r["eval/episode_return"]) for r in _records(folder) if "eval/episode_return" in r]

    run(4, resume=False)
    run(6, resume=True)  # starts at step 2048, whose evaluation was logged: not evaluated again
    assert [step for step, _ in evaluations()] == [0, 1024, 2048, 3072]
    # What a run killed with its last evaluation in flight leaves: the checkpoint of step 3072, no evaluation of it.
    (lost,) = [value for step, value in evaluations() if step == 3072]
    text = (folder / "metrics.jsonl").read_text().splitlines()
    (folder / "metrics.jsonl").write_text("".join(line + "\n" for line in text
                                                  if not ('"eval/episode_return"' in line and '"step": 3072' in line)))
    assert [step for step, _ in evaluations()] == [0, 1024, 2048]
    run(8, resume=True)
    assert [step for step, _ in evaluations()] == [0, 1024, 2048, 3072, 4096]
    # Same parameters (the checkpoint's), same key (the step's): the evaluation the killed run would have logged.
    assert dict(evaluations())[3072] == lost
