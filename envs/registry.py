"""Name → environment constructor. `make` gives one unbatched env; wrappers batch it."""

from __future__ import annotations

from typing import Any, Callable

from envs.core import Env

class UnknownEnvironmentError(ValueError):
    """No environment is registered under the requested name."""


_REGISTRY: dict[str, Callable[..., Env]] = {}


def register(name: str, constructor: Callable[..., Env]) -> None:
    if name in _REGISTRY:
        raise ValueError(f"An environment named {name!r} is already registered.")
    _REGISTRY[name] = constructor


def names() -> list[str]:
    return sorted(_REGISTRY)


def make(name: str, **kwargs: Any) -> Env:
    try:
        constructor = _REGISTRY[name]
    except KeyError:
        raise UnknownEnvironmentError(f"Unknown environment {name!r}. Known environments: {', '.join(names())}.") from None
    return constructor(**kwargs)
