"""The methods: `loss.name` -> a `Method` (see base.py for the interface).

    @register                     # from .registry import register
    class MyMethod(Method):
        name = "mine"
        config_cls = MyLossConfig
        loss_fn = staticmethod(my_batch_loss)
        ...

The built-in methods (pairs.py: DPR, DAR; ance.py; rcl.py; arr.py) register themselves when their
modules are imported, which `get_method` and `method_names` do on first use (they import torch).
What a method reads from the config is in configs.py, without torch (a new method adds its line
there too: `register` checks the two agree). `get_method(name)` raises a ConfigError listing the
registered names.
"""

from __future__ import annotations

from ...errors import ConfigError
from .base import Method, StepContext, check_frozen, freeze  # noqa: F401
from .registry import METHODS, register  # noqa: F401


def _import_builtin() -> None:
    """Import the built-in method modules (each registers its methods); they import torch."""
    from . import ance, arr, pairs, rcl  # noqa: F401


def get_method(name: str) -> Method:
    _import_builtin()
    if name not in METHODS:
        raise ConfigError(f"loss.name={name!r} is not a registered method; registered: {', '.join(sorted(METHODS))}")
    return METHODS[name]


def method_names() -> list[str]:
    _import_builtin()
    return sorted(METHODS)
