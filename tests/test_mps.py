"""MPS control on a machine without a GPU: the documented fallback, and the quota arithmetic."""

import logging

import pytest

from jaxrose import mps
from jaxrose.mps import MpsAttachWarning, MpsDaemon, MpsError, attachment_problem, expected_sm_count, unavailable_reason


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


QUOTA_30 = {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/pipe", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}


def test_attachment_check_compares_the_sm_count_with_the_quota():
    # H200, measured: 30% of 132 SMs gives 38; a client that missed the daemon sees all 132.
    assert attachment_problem(QUOTA_30, {"platform": "gpu", "core_count": 38}, total_sms=132) is None
    problem = attachment_problem(QUOTA_30, {"platform": "gpu", "core_count": 132}, total_sms=132)
    assert "132 of 132 SMs" in problem and "30% gives 38" in problem and "/tmp/pipe" in problem
    # Nothing to verify: no quota asked for, or a CPU worker.
    assert attachment_problem({}, {"platform": "gpu", "core_count": 132}, total_sms=132) is None
    assert attachment_problem(QUOTA_30, {"platform": "cpu", "core_count": None}, total_sms=132) is None


def _ready_as_unattached_gpu_worker(conn):
    """Fault injection, modelling the GPU: reports ready as a client that missed its MPS daemon."""
    conn.send(("ready", {"platform": "gpu", "core_count": 132}))
    conn.recv()


def test_worker_that_missed_its_quota_is_flagged_when_ready(monkeypatch):
    from jaxrose.workers import Worker

    monkeypatch.setattr(mps, "_own_sm_count", lambda env: 132)  # models the controller's H200
    worker = Worker("group0", _ready_as_unattached_gpu_worker, env=QUOTA_30)
    try:
        with pytest.warns(MpsAttachWarning, match="Worker group0: it sees 132 of 132 SMs"):
            info = worker.start(60)
        assert info["mps_attached"] is False
    finally:
        worker.stop()


def test_a_daemon_that_is_not_running_is_not_alive():
    assert MpsDaemon().alive() is False


def test_a_capped_controller_gives_uncapped_workers_100_percent_explicitly(monkeypatch, tmp_path):
    import os

    import jaxrose.mps as mps

    _fake_mps_present(monkeypatch, tmp_path)
    monkeypatch.setattr(mps.MpsDaemon, "stop_when_process_exits", lambda self, pid: None)  # no watcher left behind
    monkeypatch.setattr("jax._src.xla_bridge.backends_are_initialized", lambda: False)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    envs = mps.prepare_clients({"actor0": None, "evaluator": 30}, own_quota=40)
    # This process (the learner) is capped at 40%; a spawned worker copies os.environ, so the
    # uncapped actor must say 100% or it would run at the learner's 40%.
    assert os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
    assert envs["actor0"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    assert envs["evaluator"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
    assert envs["actor0"]["CUDA_MPS_PIPE_DIRECTORY"] == envs["evaluator"]["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    # Asking again for another quota cannot change this process's: a warning says what it runs at.
    with pytest.warns(UserWarning, match="runs at 40%"):
        mps.prepare_clients({"actor1": None}, own_quota=60)


def test_priorities_reach_each_client_and_a_below_normal_controller_leaves_workers_at_normal(monkeypatch, tmp_path):
    import os

    import jaxrose.mps as mps

    _fake_mps_present(monkeypatch, tmp_path)
    monkeypatch.setattr(mps.MpsDaemon, "stop_when_process_exits", lambda self, pid: None)
    monkeypatch.setattr("jax._src.xla_bridge.backends_are_initialized", lambda: False)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    envs = mps.prepare_clients({"actor0": None, "evaluator": 20}, priorities={"evaluator": "below-normal"},
                               own_priority="below-normal")
    # nvidia-cuda-mps-control's values: 0 normal, 1 below normal. The learner (this process) yields;
    # the actor, which a spawned child would otherwise give the learner's priority, says normal.
    assert os.environ["CUDA_MPS_CLIENT_PRIORITY"] == "1"
    assert envs["actor0"]["CUDA_MPS_CLIENT_PRIORITY"] == "0"
    assert envs["evaluator"]["CUDA_MPS_CLIENT_PRIORITY"] == "1"
    assert envs["evaluator"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
    with pytest.warns(UserWarning, match="runs at below-normal priority"):
        mps.prepare_clients({"actor1": None}, own_priority="normal")
    with pytest.raises(MpsError, match="below-normal"):
        mps.prepare_clients({"actor2": None}, priorities={"actor2": "low"})


def test_a_learner_quota_without_worker_processes_warns_that_it_has_no_effect(tiny_config, tmp_path):
    from jaxrose import train
    from jaxrose.config import replace

    config = replace(tiny_config, **{"run.learner_sm_percentage": 40, "run.out_dir": str(tmp_path),
                                     "run.total_env_steps": 512, "run.num_evals": 2})
    with pytest.warns(UserWarning, match=r"run.learner_sm_percentage=40 has no effect.*run.mode='async'"):
        train(config)
    config = replace(config, **{"run.learner_sm_percentage": None, "run.learner_priority": "below-normal",
                                "run.out_dir": str(tmp_path / "priority")})
    with pytest.warns(UserWarning, match=r"run.learner_priority=below-normal has no effect"):
        train(config)


def test_settings_a_synchronous_run_ignores_are_named(tiny_config, tmp_path):
    from jaxrose import train
    from jaxrose.config import replace

    config = replace(tiny_config, **{"run.out_dir": str(tmp_path), "run.total_env_steps": 512, "run.num_evals": 2,
                                     "run.max_policy_lag": 3, "ppo.off_policy_correction": "vtrace",
                                     "run.eval_sm_percentage": 30})
    with pytest.warns(UserWarning) as caught:
        train(config)
    messages = [str(w.message) for w in caught]
    assert any("run.max_policy_lag=3, ppo.off_policy_correction=vtrace has no effect in a synchronous run" in m
               for m in messages), messages
    assert any("run.eval_sm_percentage=30 has no effect: evaluation runs inline" in m for m in messages), messages


def _fake_mps_present(monkeypatch, tmp_path):
    """Fault injection: a GPU is "present" and a control binary that accepts every command stands in for
    the daemon (the real one is exercised on the GPU machine); no daemon of this process yet."""
    import jaxrose.mps as mps

    fake = tmp_path / "nvidia-cuda-mps-control"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setattr(mps, "CONTROL_BINARY", str(fake))
    monkeypatch.setattr(mps, "gpu_count", lambda: 1)
    monkeypatch.setattr(mps, "_controller_daemon", None)
    # prepare_clients writes these into os.environ; recorded here (set, then deleted) so that each test's
    # teardown removes them again instead of leaving them to later tests in the same process.
    for name in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                 "CUDA_MPS_CLIENT_PRIORITY"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return mps


def test_workers_cannot_get_quotas_from_a_process_whose_gpu_started_first(monkeypatch, tmp_path):
    mps = _fake_mps_present(monkeypatch, tmp_path)
    monkeypatch.setattr("jax._src.xla_bridge.backends_are_initialized", lambda: False)
    assert mps.clients_unavailable_reason() is None  # a daemon can still start before this GPU does
    assert mps.clients_unavailable_reason(enabled=False) == "MPS is switched off (run.use_mps)"
    monkeypatch.setattr("jax._src.xla_bridge.backends_are_initialized", lambda: True)
    assert "initialised its GPU before the MPS daemon" in mps.clients_unavailable_reason()


def test_tuning_skips_quota_trials_that_could_not_take_effect(monkeypatch, tmp_path, tiny_config):
    """`jaxrose ablate` on the H200 (2026-12-02) measured helper quotas although its process had started
    its GPU before any daemon, so the helpers were no MPS clients: those trials timed noise. Now
    tuning records why it skips them and measures nothing."""
    import jaxrose.tune as tune
    from jaxrose.graph import build_graph
    from jaxrose.plan import sequential_plan
    from jaxrose.planner import _overlap_tail
    from jaxrose.ppo_program import ITERATION_INPUTS
    from jaxrose.sequential import SequentialExecutor

    _fake_mps_present(monkeypatch, tmp_path)
    monkeypatch.setattr("jax._src.xla_bridge.backends_are_initialized", lambda: True)

    def measure(plan):
        pytest.fail("a quota trial was measured")

    program = SequentialExecutor(tiny_config).program
    plan = _overlap_tail(sequential_plan(program), program, build_graph(program, ITERATION_INPUTS), "reduce_metrics")
    trials = []
    kept, seconds = tune._tune_quotas(tiny_config, measure, plan, 0.5, 0.01, tune.Switches(), trials)
    assert kept is plan and seconds == 0.5
    assert [t.description for t in trials] == ["SM quotas"] and not trials[0].kept
    assert trials[0].reason.startswith("skipped: this process initialised its GPU before the MPS daemon")


def test_a_control_binary_that_cannot_run_falls_back_to_time_slicing(monkeypatch, tmp_path, caplog):
    """Fault injection: the control binary is on PATH but cannot execute (its interpreter is missing).
    start() keeps its promise (False, a warning, nothing left behind) instead of raising."""
    mps = _fake_mps_present(monkeypatch, tmp_path)
    broken = tmp_path / "broken-control"
    broken.write_text("#!/nonexistent/interpreter\n")
    broken.chmod(0o755)
    monkeypatch.setattr(mps, "CONTROL_BINARY", str(broken))
    daemon = mps.MpsDaemon()
    with caplog.at_level("WARNING", logger=mps.log.name):
        assert daemon.start() is False
    assert "falling back to time slicing" in caplog.text and "broken-control -d" in caplog.text
    assert daemon.root is None and not daemon.running
