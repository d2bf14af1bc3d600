"""Bi-encoder models loaded offline from local directories or installed packages; saved as
sentence-transformers directories that are also plain HF models."""

from .encoder import POOLING_MODES, BiEncoder, read_st_layout, resolve_model_path  # noqa: F401
