"""scripts/gpu_overlap_probe.py: its arithmetic by hand, and a whole run on the CPU (real processes, no MPS)
whose summary is recomputed from the raw times it recorded."""

import json
import os
import subprocess
import sys

import pytest

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
sys.path.insert(0, SCRIPTS)

from gpu_overlap_probe import best_mix, split_args, summarize, synchronous_limit, window_rate  # noqa: E402


def test_window_rate_counts_intervals_between_completions_inside_the_window():
    completions = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0]
    # inside [1.2, 3.5]: 1.5, 2.0, 2.5, 3.0 -> 3 intervals over 1.5 s
    assert window_rate(completions, 1.2, 3.5) == pytest.approx(2.0)
    assert window_rate(completions, 3.5, 3.9) is None  # none inside
    assert window_rate(completions, 3.9, 5.0) is None  # one inside


def test_summary_by_hand():
    # 655,360 steps; the rollout 0.33 s alone and 0.45 s beside; the learner 10 updates/s alone at 100%,
    # 6 beside the actor; 2 updates per rollout; the ceiling 0.3 s.
    row = summarize(655_360, 2, 0.3, 0.33, 10.0, {"actor_beside_s": 0.45, "learner_rate_beside": 6.0,
                                                  "learner_rate_alone": 10.0})
    assert row["actor_share"] == pytest.approx(0.33 / 0.45)
    assert row["learner_share"] == pytest.approx(0.6)
    assert row["overlap"] == pytest.approx(0.33 / 0.45 + 0.6)
    assert row["paced_by"] == "actor" and row["pace_s"] == pytest.approx(0.45)  # 2 / 6 = 0.333 < 0.45
    assert row["both_busy_steps_per_s"] == pytest.approx(655_360 / 0.45)
    assert row["both_busy_over_ceiling"] == pytest.approx(0.3 / 0.45)
    best = best_mix(2, 0.33, 10.0, 0.33 / 0.45, 0.6, 1.0)
    assert row["best_mix_steps_per_s"] == pytest.approx(655_360 / 0.33 * best)
    assert row["best_mix_over_ceiling"] == pytest.approx(0.3 / 0.33 * best)
    slow = summarize(655_360, 2, 0.3, 0.33, 10.0, {"actor_beside_s": 0.35, "learner_rate_beside": 4.0,
                                                   "learner_rate_alone": 10.0})
    assert slow["paced_by"] == "learner" and slow["pace_s"] == pytest.approx(0.5)
    assert synchronous_limit(655_360, 2, 0.33, 10.0) == pytest.approx(655_360 / 0.53)


def brute_force_best_mix(need, actor_share, learner_share, learner_alone_share, steps=200_000):
    """The reference: every mix of both busy with each process alone on a fine grid; the largest actor share
    whose learner share keeps up (learner share >= need x actor share)."""
    best = 0.0
    for alone in ((1.0, 0.0), (0.0, learner_alone_share)):
        for i in range(steps + 1):
            t = i / steps
            actor = (1 - t) * actor_share + t * alone[0]
            learner = (1 - t) * learner_share + t * alone[1]
            if learner >= need * actor - 1e-12:
                best = max(best, actor)
    return best


@pytest.mark.parametrize("actor_share, learner_share, learner_alone_share", [
    (0.6, 0.6, 1.0),  # the learner has room when both are busy: mix in the actor alone
    (0.9, 0.3, 0.8),  # it falls behind: mix in the learner alone, at its quota's rate
    (0.5709754, 0.6296363, 1.0),  # session 40's H100 figures at the learner's 100%
])
def test_best_mix_against_a_search_over_every_mix(actor_share, learner_share, learner_alone_share):
    # 2 updates per rollout, the learner 10 updates/s alone, the rollout 0.33 s alone: need = 0.2 / 0.33
    need = (2 / 10.0) / 0.33
    expected = brute_force_best_mix(need, actor_share, learner_share, learner_alone_share)
    assert best_mix(2, 0.33, 10.0, actor_share, learner_share, learner_alone_share) == pytest.approx(expected, abs=1e-4)


def test_arguments_split_at_the_double_dash():
    positional, options, train = split_args(["ant-mlp", "9", "--groups=4", "--", "--ppo.x", "1", "--quotas=5"])
    assert positional == ["ant-mlp", "9"] and options == {"groups": "4"} and train == ["--ppo.x", "1", "--quotas=5"]


def test_a_whole_run_on_the_cpu(tmp_path):
    out = tmp_path / "overlap.json"
    result = subprocess.run(
        [sys.executable, os.path.join(SCRIPTS, "gpu_overlap_probe.py"), "point-mass", "3", "--groups=2",
         "--quotas=100,50", "--window=0.5", f"--out={out}", "--", "--env.num-envs", "32", "--ppo.batch-size", "16",
         "--ppo.num-minibatches", "2", "--ppo.off-policy-correction", "vtrace"],
        capture_output=True, text=True, timeout=300,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS")}, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["mps"] is False and report["envs"] == 64 and report["updates_per_rollout"] == 2
    assert "cpu" in report["device"].lower()
    assert report["env_steps"] == 64 * 10 * (16 * 2 // 32)  # envs x unroll_length x unrolls per iteration
    reference = report["quotas"]["100"]["learner_rate_alone"]
    assert report["learner_reference"] == {"quota": 100, "updates_per_s": reference}
    for quota in ("100", "50"):
        entry = report["quotas"][quota]
        assert entry["learner_rate_alone"] > 0 and entry["learner_rate_beside"] > 0
        assert len(entry["actor_beside"]) >= 3
        expected = summarize(report["env_steps"], 2, report["ceiling"]["median_s"],
                             report["actor_alone"]["median_s"], reference, entry)
        assert entry["summary"] == pytest.approx(expected)
        assert entry["summary"]["actor_share"] == pytest.approx(
            report["actor_alone"]["median_s"] / entry["actor_beside_s"])
    # --summarize recomputes the same summaries from the raw times alone
    stripped = tmp_path / "stripped.json"
    for entry in report["quotas"].values():
        entry.pop("summary")
    stripped.write_text(json.dumps(report))
    again = tmp_path / "again.json"
    subprocess.run([sys.executable, os.path.join(SCRIPTS, "gpu_overlap_probe.py"), f"--summarize={stripped}",
                    f"--out={again}"], check=True, capture_output=True, timeout=60)
    assert json.loads(again.read_text())["quotas"] == json.loads(out.read_text())["quotas"]


def test_groups_that_do_not_divide_into_updates_are_refused():
    result = subprocess.run(
        [sys.executable, os.path.join(SCRIPTS, "gpu_overlap_probe.py"), "point-mass", "3", "--groups=3", "--",
         "--env.num-groups", "2", "--env.num-envs", "32"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode != 0
    assert "--groups=3" in result.stderr and "env.num_groups (2)" in result.stderr and "--groups=4" in result.stderr
