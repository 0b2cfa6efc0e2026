"""arm_push against hand computation: planar forward kinematics, the reward terms, the success
metric, and a scripted push (a Jacobian-transpose controller) that earns the reward the task
promises, which is the signal a policy has to find."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.arm_push import LINKS, SUCCESS_DISTANCE

pytestmark = pytest.mark.slow  # one MJX compile of reset and of step (about 20 s on a CPU), shared

# XLA's classic CPU fusion emitters compile these MJX programs in about half the time of the newer ones;
# the tests compare with hand computation to a tolerance, so either emitter serves.
FAST_COMPILE = {"xla_cpu_use_fusion_emitters": False}

L = np.array(LINKS)


def fingertip(q):
    """Planar forward kinematics: the sum of the links at their cumulative angles."""
    angles = np.cumsum(q)
    return np.array([L @ np.cos(angles), L @ np.sin(angles)])


def jacobian(q):
    angles = np.cumsum(q)
    return np.array([[-(L[j:] * np.sin(angles[j:])).sum() for j in range(3)],
                     [(L[j:] * np.cos(angles[j:])).sum() for j in range(3)]])


def inverse_kinematics(point, heading):
    """Joint angles that put the fingertip at `point` with the last link along `heading`."""
    wrist = point - L[2] * np.array([np.cos(heading), np.sin(heading)])
    elbow = np.arccos((wrist @ wrist - L[0] ** 2 - L[1] ** 2) / (2 * L[0] * L[1]))
    shoulder = np.arctan2(wrist[1], wrist[0]) - np.arctan2(L[1] * np.sin(elbow), L[0] + L[1] * np.cos(elbow))
    return np.array([shoulder, elbow, heading - shoulder - elbow])


@pytest.fixture(scope="module")
def arm():
    env = envs.make("arm_push")
    return env, jax.jit(env.reset, compiler_options=FAST_COMPILE), jax.jit(env.step, compiler_options=FAST_COMPILE)


def place(state, q, cube, target):
    """The same state with the arm, the cube (upright, at rest) and the target set by hand."""
    data = state.pipeline_state
    qpos = np.array(data.qpos)
    qpos[:3], qpos[3:5], qpos[5], qpos[6:10] = q, cube, 0.025, (1, 0, 0, 0)
    data = data.replace(qpos=jnp.asarray(qpos, jnp.float32), qvel=jnp.zeros_like(data.qvel),
                        mocap_pos=data.mocap_pos.at[0, :2].set(jnp.asarray(target, jnp.float32)))
    return state.replace(pipeline_state=data)


def test_reset_and_step_match_hand_computation(arm):
    env, reset, step = arm
    for seed in range(4):
        state = reset(jax.random.PRNGKey(seed))
        assert state.obs.shape == (env.observation_size,) and env.action_size == 3
        qpos, target = np.asarray(state.pipeline_state.qpos), np.asarray(state.pipeline_state.mocap_pos[0, :2])
        np.testing.assert_allclose(qpos[:3], [np.pi / 2, 0, 0], atol=0.1 + 1e-6)
        assert 0.2 <= qpos[3] <= 0.35 and -0.15 <= qpos[4] <= 0.15
        assert np.linalg.norm(target - qpos[3:5]) >= 0.1 - 1e-5
        np.testing.assert_allclose(state.obs[9:11], fingertip(qpos[:3]), atol=1e-5)

    shoulder = float(state.pipeline_state.qpos[0])
    state = step(state, jnp.array([2.0, -0.5, 0.3]))  # the first is clipped to 1
    qpos = np.asarray(state.pipeline_state.qpos)
    tip, cube, target = fingertip(qpos[:3]), qpos[3:5], np.asarray(state.pipeline_state.mocap_pos[0, :2])
    np.testing.assert_allclose(state.pipeline_state.ctrl, [1.0, -0.5, 0.3])
    near, dist, ctrl = -np.linalg.norm(tip - cube), -np.linalg.norm(cube - target), -(1.0 + 0.25 + 0.09)
    np.testing.assert_allclose(state.metrics["reward_near"], near, atol=1e-5)
    np.testing.assert_allclose(state.metrics["reward_dist"], dist, atol=1e-5)
    np.testing.assert_allclose(state.metrics["reward_ctrl"], ctrl, rtol=1e-6)
    np.testing.assert_allclose(state.reward, dist + 0.5 * near + 0.1 * ctrl, atol=1e-5)
    assert state.reward.shape == () and float(state.done) == 0.0 and float(state.metrics["success"]) == 0.0
    assert qpos[0] > shoulder  # the shoulder turned the way its torque pushed


def test_success_when_the_cube_is_placed_on_the_target(arm):
    env, reset, step = arm
    state = reset(jax.random.PRNGKey(0))
    away = np.array([np.pi / 2, 0.0, 0.0])  # the arm along +y, far from the cube
    target = np.array([0.3, 0.05])
    for offset, success in ((0.0, 1.0), (SUCCESS_DISTANCE - 0.01, 1.0), (SUCCESS_DISTANCE + 0.01, 0.0)):
        placed = step(place(state, away, target + [offset, 0.0], target), jnp.zeros(3))
        assert float(placed.metrics["success"]) == success, offset
        np.testing.assert_allclose(placed.metrics["reward_dist"], -offset, atol=1e-3)  # the cube stays put


def test_scripted_push_moves_the_cube_to_the_target(arm):
    """Fingertip behind the cube, then a Jacobian-transpose controller aims it just past the cube's
    centre, towards the target: the cube slides there, reward_dist rises, success turns on."""
    env, reset, step = arm
    cube, target = np.array([0.3, -0.05]), np.array([0.42, -0.05])
    state = place(reset(jax.random.PRNGKey(0)), inverse_kinematics(np.array([0.245, -0.05]), 0.0), cube, target)
    state = step(state, jnp.zeros(3))
    dists = [float(state.metrics["reward_dist"])]
    for _ in range(60):
        data = state.pipeline_state
        q, qd, at = np.asarray(data.qpos[:3]), np.asarray(data.qvel[:3]), np.asarray(data.qpos[3:5])
        direction = (target - at) / np.linalg.norm(target - at)
        force = 20.0 * (at + 0.01 * direction - fingertip(q)) - 2.0 * (jacobian(q) @ qd)
        state = step(state, jnp.asarray(np.clip(jacobian(q).T @ force, -1, 1), jnp.float32))
        dists.append(float(state.metrics["reward_dist"]))
    np.testing.assert_allclose(dists[0], -0.12, atol=1e-3)
    assert dists[-1] > -SUCCESS_DISTANCE and float(state.metrics["success"]) == 1.0
    assert all(later >= earlier - 2e-3 for earlier, later in zip(dists, dists[1:]))  # steady progress
    assert float(state.metrics["reward_near"]) > -0.06  # the fingertip stayed at the cube


def test_step_carries_metric_keys_a_wrapper_added(arm):
    # brax's EvalWrapper adds 'reward' to state.metrics at reset and scans over step: a step that
    # dropped the key broke brax PPO on arm_push (found by the H200 suite's CPU pre-check).
    _, reset, step = arm
    state = reset(jax.random.PRNGKey(0))
    state = state.replace(metrics={**state.metrics, "reward": jnp.zeros(())})
    stepped = step(state, jnp.zeros(3))
    assert set(stepped.metrics) == set(state.metrics)
    np.testing.assert_allclose(stepped.metrics["reward"], 0.0)


def test_a_diverged_state_ends_the_episode_with_a_finite_reward(arm):
    """A non-finite physics state terminates the episode; its reward and reward terms are 0, not NaN
    (a NaN reward reached the learner's batch and stopped the run through the non-finite guard)."""
    _, reset, step = arm
    state = reset(jax.random.PRNGKey(0))
    data = state.pipeline_state
    stepped = step(state.replace(pipeline_state=data.replace(qvel=data.qvel.at[0].set(jnp.nan))), jnp.zeros(3))
    assert float(stepped.done) == 1.0 and float(stepped.reward) == 0.0
    assert all(np.isfinite(float(stepped.metrics[k])) for k in ("reward_near", "reward_dist", "reward_ctrl"))
    healthy = step(state, jnp.zeros(3))  # the same step from a finite state: not done, its usual reward
    assert float(healthy.done) == 0.0 and float(healthy.reward) < 0.0
