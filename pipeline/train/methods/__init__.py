"""The method registry: `loss.name` -> a `Method` (see base.py for the interface).

    @register
    class MyMethod(Method):
        name = "mine"
        config_cls = MyLossConfig
        loss_fn = staticmethod(my_batch_loss)
        ...

`get_method(name)` raises a ConfigError listing the registered names.
"""

from __future__ import annotations

from ...errors import ConfigError
from .base import Method, StepContext, check_frozen, freeze  # noqa: F401

METHODS: dict[str, Method] = {}


def register(cls):
    """Class decorator: register one instance of a Method subclass under `cls.name`."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in METHODS and type(METHODS[cls.name]) is not cls:
        raise ValueError(f"method {cls.name!r} is registered twice")
    METHODS[cls.name] = cls()
    return cls


def get_method(name: str) -> Method:
    _load_builtin()
    if name not in METHODS:
        raise ConfigError(f"loss.name={name!r} is not a registered method; registered: {', '.join(sorted(METHODS))}")
    return METHODS[name]


def method_names() -> list[str]:
    _load_builtin()
    return sorted(METHODS)


def _load_builtin() -> None:
    from . import ance, pairs  # noqa: F401
    from . import rcl  # noqa: F401
    from . import arr  # noqa: F401
