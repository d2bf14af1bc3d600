"""Bi-encoder models loaded offline from local directories or installed packages."""

from .encoder import BiEncoder, resolve_model_path  # noqa: F401
