"""The methods: `loss.name` -> a `Method` (see base.py for the interface).

    @register                     # from .registry import register
    class MyMethod(Method):
        name = "mine"
        config_cls = MyLossConfig
        loss_fn = staticmethod(my_batch_loss)
        ...

Importing this package registers the built-in methods (pairs.py: DPR, DAR; ance.py; rcl.py;
arr.py). `get_method(name)` raises a ConfigError listing the registered names.
"""

from __future__ import annotations

from ...errors import ConfigError
from . import ance, arr, pairs, rcl  # noqa: F401  (each registers its methods)
from .base import Method, StepContext, check_frozen, freeze  # noqa: F401
from .registry import METHODS, register  # noqa: F401


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ConfigError(f"loss.name={name!r} is not a registered method; registered: {', '.join(sorted(METHODS))}")
    return METHODS[name]


def method_names() -> list[str]:
    return sorted(METHODS)
