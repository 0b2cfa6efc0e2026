"""Domain randomization: each env steps with its own physical parameter, checked by hand."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.wrappers import AutoResetWrapper, DomainRandomization, EpisodeWrapper, GroupWrapper


def uniform_torque(base, key):
    """A torque limit in [0.5, 2] instead of the base 2.0."""
    return jax.random.uniform(key, (), minval=0.5, maxval=2.0)


def test_each_env_uses_its_own_torque():
    base = envs.make("pendulum")
    env = GroupWrapper(AutoResetWrapper(EpisodeWrapper(DomainRandomization(base, "max_torque", uniform_torque), 50)),
                       2, 3)
    state = env.reset(jax.random.PRNGKey(0))
    torques = np.asarray(state.info["randomized"])
    assert torques.shape == (2, 3) and len(np.unique(torques)) == 6
    theta, theta_dot = (np.asarray(x) for x in jnp.moveaxis(state.pipeline_state, -1, 0))
    state = env.step(state, jnp.ones((2, 3, 1)))
    # Pendulum dynamics by hand (g=10, m=l=1, dt=0.05): each env's own torque enters.
    expected = theta_dot + (15.0 * np.sin(theta) + 3.0 * torques) * 0.05
    np.testing.assert_allclose(np.asarray(state.pipeline_state)[..., 1], np.clip(expected, -8, 8), rtol=1e-5)
    assert base.max_torque == 2.0  # the shared env object is left as it was


def test_randomization_survives_auto_reset_and_jit():
    env = GroupWrapper(AutoResetWrapper(EpisodeWrapper(
        DomainRandomization(envs.make("pendulum"), "max_torque", uniform_torque), 2)), 1, 4)
    state = jax.jit(env.reset)(jax.random.PRNGKey(1))
    before = np.asarray(state.info["randomized"])
    step = jax.jit(env.step)
    for _ in range(3):  # crosses an auto-reset at step 2
        state = step(state, jnp.zeros((1, 4, 1)))
    np.testing.assert_array_equal(state.info["randomized"], before)


def test_unknown_attribute_is_named():
    with pytest.raises(ValueError, match="Cannot randomize 'gravity': Pendulum has no such attribute"):
        DomainRandomization(envs.make("pendulum"), "gravity", uniform_torque)


# Standard randomizers for MJX tasks (envs.randomization), checked against mujoco.mjx itself.

def hand_randomized_model(values):
    """arm_push's MjModel with the drawn values written in by hand (numpy, in place)."""
    import mujoco

    from envs.arm_push import XML

    model = mujoco.MjModel.from_xml_path(str(XML))
    if "friction" in values:
        model.geom_friction[:, 0] *= values["friction"]
    if "mass" in values:
        model.body_mass[:] *= values["mass"]
        model.body_inertia[:] *= values["mass"][:, None]
    if "actuator_gain" in values:
        model.actuator_gainprm[:, 0] *= values["actuator_gain"]
        model.actuator_biasprm[:, :3] *= values["actuator_gain"][:, None]
    return model


# XLA's classic CPU fusion emitters compile MJX programs in about half the time of the newer ones; the
# MJX comparison below is to a tolerance, so either emitter serves.
FAST_COMPILE = {"xla_cpu_use_fusion_emitters": False}


@pytest.mark.slow
def test_mjx_randomization_each_env_steps_its_own_model():
    """Three arm_push envs draw their own friction, masses and gains; one step of each equals
    mujoco.mjx stepping a model with those values set by hand, and each value matters."""
    from mujoco import mjx

    from envs.randomization import NAMES, randomize

    base = envs.make("arm_push")
    base_friction = np.asarray(base.sys.geom_friction)
    env = GroupWrapper(randomize(base, NAMES), 1, 3)
    state = jax.jit(env.reset, compiler_options=FAST_COMPILE)(jax.random.PRNGKey(0))
    values = {name: np.asarray(value)[0] for name, value in state.info["randomized"].items()}
    assert values["friction"].shape == (3,) and len(np.unique(values["friction"])) == 3
    assert values["mass"].shape == (3, base.mj_model.nbody) and values["actuator_gain"].shape == (3, 3)
    assert np.all((values["mass"] >= 0.8) & (values["mass"] <= 1.2))
    # A cube sliding at 0.5 m/s (friction matters) and full torque on every joint (masses and gains do).
    data = state.pipeline_state
    state = state.replace(pipeline_state=data.replace(qvel=data.qvel.at[..., 3].set(0.5)))
    action = jnp.ones((1, 3, 3))
    stepped = jax.jit(env.step, compiler_options=FAST_COMPILE)(state, action)

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def reference_step(model, data, ctrl):  # ArmPush.step's physics on a model given by hand
        data = jax.lax.scan(lambda d, _: (mjx.step(model, d.replace(ctrl=ctrl)), None), data, (), base.n_frames)[0]
        return mjx.kinematics(model, data)

    for i in range(3):
        mine = {name: value[i] for name, value in values.items()}
        start = jax.tree.map(lambda x: x[0, i], state.pipeline_state)
        expected = reference_step(mjx.put_model(hand_randomized_model(mine), impl="jax"), start, action[0, i])
        # float32 contact solves, batched or not, agree to about 1e-4 in velocity.
        np.testing.assert_allclose(stepped.pipeline_state.qpos[0, i], expected.qpos, atol=1e-5)
        np.testing.assert_allclose(stepped.pipeline_state.qvel[0, i], expected.qvel, atol=2e-4)
        error = np.abs(np.asarray(stepped.pipeline_state.qvel[0, i]) - np.asarray(expected.qvel)).max()
        for left_out in NAMES:  # without any one of the values the step comes out far more different
            others = {name: value for name, value in mine.items() if name != left_out}
            other = reference_step(mjx.put_model(hand_randomized_model(others), impl="jax"), start, action[0, i])
            assert np.abs(np.asarray(other.qvel) - np.asarray(expected.qvel)).max() > max(10 * error, 1e-4), \
                (i, left_out)
    np.testing.assert_array_equal(base.sys.geom_friction, base_friction)  # the shared model is untouched


def test_randomize_setting_is_validated_and_wired():
    from jaxrose.config import ConfigError, EnvConfig, TrainConfig
    from jaxrose.sequential import make_env

    with pytest.raises(ConfigError, match="unknown randomization.*gravity; known: friction, mass, actuator_gain"):
        EnvConfig(randomize=("friction", "gravity"))
    with pytest.raises(ConfigError, match="twice"):
        EnvConfig(randomize=("mass", "mass"))
    with pytest.raises(ConfigError, match="env.randomize: .*MJX tasks.*Pendulum has none"):
        make_env(TrainConfig(env=EnvConfig(name="pendulum", randomize=("mass",))))
    env = make_env(TrainConfig(env=EnvConfig(name="arm_push", randomize=("friction", "mass"))))
    assert isinstance(env, DomainRandomization) and env.attribute == "sys"
    assert isinstance(make_env(TrainConfig(env=EnvConfig(name="arm_push"))), envs.Env)  # off by default
    assert not isinstance(make_env(TrainConfig(env=EnvConfig(name="arm_push"))), DomainRandomization)


def test_randomize_from_the_command_line():
    import tyro

    from jaxrose.config import TrainConfig

    config = tyro.cli(TrainConfig, args=["--env.name", "arm_push", "--env.randomize", "friction", "actuator_gain"])
    assert config.env.randomize == ("friction", "actuator_gain")


class SlowPendulum(type(envs.make("pendulum"))):
    """The pendulum whose step reads `max_torque` only after a pause, so a second thread tracing at
    the same time (as train.py's compile of the evaluation beside the iteration does) swaps its own
    value in before this one reads it unless the swap is serialized."""

    def step(self, state, action):
        import time
        time.sleep(0.3)
        return super().step(state, action)


def test_two_threads_tracing_at_once_each_see_their_own_value():
    import threading
    env = GroupWrapper(DomainRandomization(SlowPendulum(), "max_torque", uniform_torque), 1, 4)
    state = jax.jit(env.reset)(jax.random.PRNGKey(2))
    action = jnp.ones((1, 4, 1))
    expected = env.step(state, action)  # one thread: the reference
    results, errors = {}, []

    def trace(name):
        try:  # a fresh jit per thread, so each traces
            results[name] = jax.jit(lambda s, a: env.step(s, a))(state, action)
        except Exception as error:  # noqa: BLE001 - the leaked tracer is what this test looks for
            errors.append(error)

    threads = [threading.Thread(target=trace, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    for name in ("a", "b"):
        np.testing.assert_allclose(results[name].pipeline_state, expected.pipeline_state, rtol=1e-6)
    assert env.unwrapped.max_torque == 2.0


def test_stacking_two_randomizations_is_refused():
    """Both would keep their value in info['randomized']: the outer one's value reached the inner attribute
    (found in review: a pendulum stepped with dt = 2.0, the torque drawn for the outer wrapper)."""
    inner = DomainRandomization(envs.make("pendulum"), "max_torque", uniform_torque)
    with pytest.raises(ValueError, match=r"already randomizes 'max_torque'.*one wrapper"):
        DomainRandomization(EpisodeWrapper(inner, 50), "dt", lambda base, key: base)
