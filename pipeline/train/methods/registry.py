"""The method registry itself: `register` (a class decorator) and the table it fills.

Method modules import `register` from here; the package (`methods/__init__.py`) imports the
built-in method modules and offers `get_method` / `method_names`, so nothing here imports a
method and no method imports the package.
"""

from __future__ import annotations

from .base import Method

METHODS: dict[str, Method] = {}


def register(cls):
    """Class decorator: register one instance of a Method subclass under `cls.name`."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in METHODS and type(METHODS[cls.name]) is not cls:
        raise ValueError(f"method {cls.name!r} is registered twice")
    METHODS[cls.name] = cls()
    return cls
