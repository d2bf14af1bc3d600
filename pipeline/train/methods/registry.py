"""The method registry itself: `register` (a class decorator) and the table it fills.

Method modules import `register` from here; the package (`methods/__init__.py`) imports the
built-in method modules and offers `get_method` / `method_names`, so nothing here imports a
method and no method imports the package.
"""

from __future__ import annotations

from ...errors import ConfigError
from .base import Method
from .configs import METHOD_CONFIGS, MethodConfig

METHODS: dict[str, Method] = {}


def register(cls):
    """Class decorator: register one instance of a Method subclass under `cls.name`. A built-in
    method's `config_cls` and `sections` must be what configs.py says of `cls.name` (the config is
    parsed from there, without importing the method)."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in METHODS and type(METHODS[cls.name]) is not cls:
        raise ValueError(f"method {cls.name!r} is registered twice")
    spec = METHOD_CONFIGS.get(cls.name)
    if spec is not None and (cls.config_cls is not spec.config_cls or dict(cls.sections) != dict(spec.sections)):
        raise ValueError(f"method {cls.name!r}: config_cls / sections ({cls.config_cls.__name__}, "
                         f"{sorted(cls.sections)}) differ from its line in train/methods/configs.py "
                         f"({spec.config_cls.__name__}, {sorted(spec.sections)})")
    METHODS[cls.name] = cls()
    return cls


def method_config(name: str) -> MethodConfig:
    """What method `name` reads from a config: its line in configs.py (no torch imported), else the
    class of a method other code has registered; an unknown name is a ConfigError listing the known."""
    if name in METHOD_CONFIGS:
        return METHOD_CONFIGS[name]
    if name in METHODS:
        return MethodConfig(METHODS[name].config_cls, dict(METHODS[name].sections))
    raise ConfigError(f"loss.name={name!r} is not a registered method; registered: {', '.join(config_method_names())}")


def config_method_names() -> list[str]:
    """Every method a config may name: the built-in ones (configs.py) and any registered since."""
    return sorted(set(METHOD_CONFIGS) | set(METHODS))
