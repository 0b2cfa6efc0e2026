"""jaxrose environments: a registry of pure-function envs in brax's `State` convention."""

from envs.brax_mjx import constructors as _brax_constructors
from envs.core import Env, State
from envs.pendulum import Pendulum
from envs.playground import constructors as _playground_constructors
from envs.point_mass import PointMass
from envs.registry import make, names, register
from envs.wrappers import (AutoResetWrapper, DomainRandomization, EpisodeWrapper, GroupWrapper, HistoryWrapper,
                           wrap_for_training)

register("pendulum", Pendulum)
register("point_mass", PointMass)


def _arm_push(**kwargs) -> Env:
    from envs.arm_push import ArmPush  # MuJoCo takes a second to import: only when the task is built

    return ArmPush(**kwargs)


register("arm_push", _arm_push)
for _name, _constructor in {**_brax_constructors(), **_playground_constructors()}.items():
    register(_name, _constructor)

__all__ = ["Env", "State", "make", "names", "register", "EpisodeWrapper", "AutoResetWrapper",
           "GroupWrapper", "HistoryWrapper", "DomainRandomization", "wrap_for_training", "Pendulum", "PointMass"]
