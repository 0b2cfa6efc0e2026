"""The programmable interface: PPO written as a Program runs exactly as the hand-written iteration,
a new algorithm is a few stages away, and malformed programs are refused with a clear message."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrose.program import Loop, Program, ProgramError, Stage, run_program
from jaxrose.ppo_program import ITERATION_INPUTS
from jaxrose.sequential import SequentialExecutor

from reference_iteration import make_reference_iteration


def test_ppo_program_equals_hand_written_iteration(tiny_config):
    executor = SequentialExecutor(tiny_config)
    reference = jax.jit(make_reference_iteration(executor))
    state_a = executor.init(jax.random.PRNGKey(3))
    state_b = executor.init(jax.random.PRNGKey(3))
    for _ in range(3):
        state_a, metrics_a = executor.step(state_a)
        state_b, metrics_b = reference(state_b)
    for a, b in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b), strict=True):
        np.testing.assert_array_equal(a, b)
    metrics_a = jax.device_get(metrics_a)
    health = {k: metrics_a.pop(k) for k in list(metrics_a) if k.startswith("health/")}
    assert metrics_a == jax.device_get(metrics_b)
    assert all(float(v) == 1.0 for v in health.values())


def test_unrolled_rollout_steps_compute_the_same_iteration(tiny_config):
    """`run.unroll_rollout_steps`: the per-step loop as straight-line code gives the same training
    state as the nested loops, bit for bit (on the CPU), iteration after iteration."""
    from jaxrose.config import replace

    unrolled = SequentialExecutor(replace(tiny_config, **{"run.unroll_rollout_steps": True}))
    looped = SequentialExecutor(tiny_config)
    step_loop = [n for n in unrolled.program.body if isinstance(n, Loop)][0].body[1]
    assert step_loop.name == "rollout_step" and step_loop.unroll == tiny_config.ppo.unroll_length
    state_a, state_b = unrolled.init(jax.random.PRNGKey(3)), looped.init(jax.random.PRNGKey(3))
    for _ in range(3):
        state_a, _ = unrolled.step(state_a)
        state_b, _ = looped.step(state_b)
    for a, b in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("unroll", [2, 64])
def test_unrolled_learner_minibatch_loop_computes_the_same_iteration(tiny_config, unroll):
    """`run.learner_unroll`: several SGD steps per device-loop iteration (64: more than the minibatches,
    so no loop at all) give the training state of one step per iteration, iteration after iteration."""
    from jaxrose.config import replace

    unrolled = SequentialExecutor(replace(tiny_config, **{"run.learner_unroll": unroll}))
    looped = SequentialExecutor(tiny_config)
    assert tiny_config.ppo.num_minibatches % 2 == 0 and tiny_config.ppo.num_minibatches < 64
    epoch = [n for n in unrolled.program.body if isinstance(n, Loop) and n.name == "epoch"][0]
    assert epoch.body[1].name == "minibatch" and epoch.body[1].unroll == unroll
    state_a, state_b = unrolled.init(jax.random.PRNGKey(3)), looped.init(jax.random.PRNGKey(3))
    for _ in range(3):
        state_a, _ = unrolled.step(state_a)
        state_b, _ = looped.step(state_b)
    for a, b in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_asynchronous_learners_update_unrolls_its_minibatch_loop(tiny_config):
    """The learner the asynchronous mode calls (`executor.learner.update`) takes `run.learner_unroll` too:
    unrolled past the minibatch count, its compiled update loses the device loop that runs once per minibatch
    (the epochs' loop stays) and gives the same learner state on a real rollout's batch."""
    import re

    from jaxrose.config import replace
    from jaxrose.ppo_program import rollout_nodes, to_batch

    looped = SequentialExecutor(tiny_config)
    unrolled = SequentialExecutor(replace(tiny_config, **{"run.learner_unroll": 64}))
    learner = looped.learner.init(jax.random.PRNGKey(0))
    rollout = Program("rollout", rollout_nodes(looped.train_env, looped.net, tiny_config))
    unrolls = jax.jit(lambda s: run_program(rollout, {"params": learner.params, "normalizer": learner.normalizer,
                                                      "env_state": s, "key": jax.random.PRNGKey(2)})["unrolls"])(
        looped.train_env.reset(jax.random.PRNGKey(1)))
    batch = to_batch(unrolls)[0]
    compiled = {name: jax.jit(executor.learner.update).lower(learner, batch).compile()
                for name, executor in (("looped", looped), ("unrolled", unrolled))}
    trips = {name: re.findall(r'known_trip_count":\{"n":"(\d+)"', c.as_text()) for name, c in compiled.items()}
    minibatches, epochs = str(tiny_config.ppo.num_minibatches), str(tiny_config.ppo.num_updates_per_batch)
    assert trips["looped"].count(minibatches) == 1 and minibatches not in trips["unrolled"], trips
    assert trips["looped"].count(epochs) == trips["unrolled"].count(epochs) == 1, trips
    state_a, state_b = compiled["unrolled"](learner, batch)[0], compiled["looped"](learner, batch)[0]
    for a, b in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not np.allclose(jax.tree.leaves(state_a.params)[0], jax.tree.leaves(learner.params)[0])  # it learned


def test_ppo_program_validates_and_lists_components(tiny_config):
    program = SequentialExecutor(tiny_config).program
    program.validate(set(ITERATION_INPUTS))
    components = {stage.name: (stage.component, path) for stage, path in program.stages()}
    assert components["policy_inference"] == ("policy", ("unroll", "rollout_step"))
    assert components["env_step"] == ("env", ("unroll", "rollout_step"))
    assert components["sgd_step"] == ("learner", ("epoch", "minibatch"))


def test_loops_scan_and_collect_like_a_python_loop():
    # sum over steps with a carried accumulator, and per-step values stacked: checked by hand.
    program = Program("toy", (
        Loop("outer", length=3, collect={"trace": "acc"}, body=(
            Stage("add", lambda acc, x: {"acc": acc + x}, ("acc", "x"), ("acc",)),
        )),
        Loop("each", over={"row": "rows"}, collect={"doubled": "twice"}, body=(
            Stage("double", lambda row: {"twice": 2 * row}, ("row",), ("twice",)),
        )),
    ))
    out = run_program(program, {"acc": jnp.array(1.0), "x": jnp.array(2.0), "rows": jnp.arange(4.0)})
    assert float(out["acc"]) == 7.0
    np.testing.assert_array_equal(out["trace"], [3.0, 5.0, 7.0])
    np.testing.assert_array_equal(out["doubled"], [0.0, 2.0, 4.0, 6.0])


def test_a_new_algorithm_is_a_few_stages(tiny_config):
    """PPO with an extra auxiliary stage: an L2 penalty step on the value network after the epochs,
    written by adding one Stage; the rest of the iteration is untouched."""
    executor = SequentialExecutor(tiny_config)
    decay = 0.5

    def shrink_value_params(params):
        value = jax.tree.map(lambda w: w * decay, params.value)
        return {"params": params._replace(value=value)}

    body = list(executor.program.body)
    reduce_at = [n.name for n in body].index("reduce_metrics")
    body.insert(reduce_at, Stage("aux_value_decay", shrink_value_params, ("params",), ("params",), "learner"))
    aux_program = dataclasses.replace(executor.program, name="ppo+aux", body=tuple(body))
    aux_program.validate(set(ITERATION_INPUTS))
    aux = SequentialExecutor(tiny_config, program=aux_program)
    plain_state, _ = executor.step(executor.init(jax.random.PRNGKey(0)))
    aux_state, _ = aux.step(aux.init(jax.random.PRNGKey(0)))
    for a, b in zip(jax.tree.leaves(plain_state.learner.params.value), jax.tree.leaves(aux_state.learner.params.value)):
        np.testing.assert_allclose(b, decay * a, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(plain_state.learner.params.policy),
                    jax.tree.leaves(aux_state.learner.params.policy)):
        np.testing.assert_array_equal(a, b)


def test_read_before_write_is_refused():
    program = Program("bad", (Stage("use", lambda y: {"z": y}, ("y",), ("z",)),
                              Stage("make", lambda: {"y": 1}, (), ("y",))))
    with pytest.raises(ProgramError, match=r"Stage 'use' in the iteration reads \['y'\] before anything writes it"):
        program.validate(set())


def test_undeclared_writes_are_refused():
    stage = Stage("liar", lambda x: {"x": x, "extra": x}, ("x",), ("x",))
    with pytest.raises(ProgramError, match="declares writes \\['x'\\] but returned \\['extra', 'x'\\]"):
        run_program(Program("p", (stage,)), {"x": 1})


def test_loop_needs_a_trip_count():
    with pytest.raises(ProgramError, match="needs a length"):
        Loop("forever", body=())
    with pytest.raises(ProgramError, match="unroll 0"):
        Loop("nowhere", length=3, unroll=0, body=())


def test_a_learner_unroll_below_one_is_refused_naming_the_setting(tiny_config):
    from jaxrose.config import ConfigError, replace

    with pytest.raises(ConfigError, match=r"run\.learner_unroll must be >= 1, got 0"):
        replace(tiny_config, **{"run.learner_unroll": 0})
