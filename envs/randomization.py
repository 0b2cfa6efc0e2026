"""Standard domain randomization for MJX tasks: friction, mass and actuator gain, per env.

Each randomizer draws a few numbers per env from its reset key and writes them into the MJX model
the env steps with (`env.sys`: brax's `System`, the `mjx.Model` of `arm_push`, or a Playground
task's model through `envs.playground`), on the fields brax's and Playground's own randomization
examples use. Only the drawn numbers live in the env state (`info['randomized']`), not a copy of
the model per env; the shared model is changed inside reset/step by `DomainRandomization`.

Like those examples, the model's derived constants (e.g. `body_subtreemass`, `dof_invweight0`)
are not recomputed: the simulation uses the new values wherever MJX reads the field itself.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from envs.core import Env
from envs.wrappers import DomainRandomization


class Randomizer(NamedTuple):
    sample: Callable  # (model, key) -> values
    apply: Callable  # (model, values) -> model


def _friction(model, key):
    """One scale in [0.6, 1.4] for every geom's sliding friction (torsional and rolling kept)."""
    return jax.random.uniform(key, (), minval=0.6, maxval=1.4)


def _scale_friction(model, scale):
    return model.replace(geom_friction=jnp.asarray(model.geom_friction).at[:, 0].multiply(scale))


def _mass(model, key):
    """A scale in [0.8, 1.2] per body."""
    return jax.random.uniform(key, model.body_mass.shape, minval=0.8, maxval=1.2)


def _scale_mass(model, scale):
    # Mass and rotational inertia together (a change of density), so a body stays a physical body.
    return model.replace(body_mass=model.body_mass * scale, body_inertia=model.body_inertia * scale[:, None])


def _gain(model, key):
    """A scale in [0.8, 1.2] per actuator."""
    return jax.random.uniform(key, model.actuator_gainprm.shape[:1], minval=0.8, maxval=1.2)


def _scale_gain(model, scale):
    # The gain and the position/velocity bias terms together: a motor's force and a servo's
    # stiffness and damping scale alike (biasprm is 0 for motors).
    return model.replace(actuator_gainprm=jnp.asarray(model.actuator_gainprm).at[:, 0].multiply(scale),
                         actuator_biasprm=jnp.asarray(model.actuator_biasprm).at[:, :3].multiply(scale[:, None]))


RANDOMIZERS: dict[str, Randomizer] = {
    "friction": Randomizer(_friction, _scale_friction),
    "mass": Randomizer(_mass, _scale_mass),
    "actuator_gain": Randomizer(_gain, _scale_gain),
}
NAMES = tuple(RANDOMIZERS)


def randomize(env: Env, names: Sequence[str]) -> Env:
    """`env` with the named randomizers, all drawn at reset into `info['randomized'][name]`."""
    if not names:
        return env
    unknown = [name for name in names if name not in RANDOMIZERS]
    if unknown:
        raise ValueError(f"Unknown randomization {unknown}; known: {', '.join(NAMES)}.")
    if not hasattr(env.unwrapped, "sys"):
        raise ValueError(f"Domain randomization works on MJX tasks, whose model is `sys` (brax, Playground, "
                         f"arm_push); {type(env.unwrapped).__name__} has none.")

    def sample(model, key):
        keys = jax.random.split(key, len(names))
        return {name: RANDOMIZERS[name].sample(model, k) for name, k in zip(names, keys)}

    def apply(model, values):
        for name in names:
            model = RANDOMIZERS[name].apply(model, values[name])
        return model

    return DomainRandomization(env, "sys", sample, apply)
