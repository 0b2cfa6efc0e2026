"""Name → environment constructor. `make` gives one unbatched env; wrappers batch it.

Besides registered names, `make` accepts an import path, `"package.module:factory"`: the module is
imported and `factory(**kwargs)` builds the env. Worker processes are spawned and rebuild the env
from the config's name, so an env registered only in the parent's session is unknown to them; an
import path works everywhere the module can be imported.
"""

from __future__ import annotations

import importlib
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
    if name not in _REGISTRY and ":" in name:
        return _from_import_path(name)(**kwargs)
    try:
        constructor = _REGISTRY[name]
    except KeyError:
        raise UnknownEnvironmentError(
            f"Unknown environment {name!r}. Known environments: {', '.join(names())}; or give an import path, "
            f"'package.module:factory'.") from None
    return constructor(**kwargs)


def _from_import_path(path: str) -> Callable[..., Env]:
    module_name, _, attribute = path.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise UnknownEnvironmentError(f"Environment {path!r}: cannot load {attribute!r} from module "
                                      f"{module_name!r} ({error}).") from None
