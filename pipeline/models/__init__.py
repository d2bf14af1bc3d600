"""Bi-encoder models loaded offline from local directories or installed packages; saved as
sentence-transformers directories that are also plain HF models.

    loading.py    where a model comes from (local folder or the installed MiniLM), tower loading
    heads.py      pooling modes, Dense, Normalize (sentence-transformers' heads, reproduced exactly)
    st_layout.py  sentence-transformers directories: read and written
    encoder.py    BiEncoder: the towers, their heads, batched inference
    precision.py  `auto` precision per device / CPU ISA
    tokens.py     flat token arrays and padded batches
    checkpoint.py the training checkpoint format; tiny.py: a tiny random BERT for tests
"""


# imported on first use (PEP 562): a submodule without torch (precision.py's constants, which `pipeline index`
# records) does not import torch and transformers with the package
_LAZY = {"BiEncoder": "encoder", "POOLING_MODES": "heads", "resolve_model_path": "loading",
         "read_st_layout": "st_layout"}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
