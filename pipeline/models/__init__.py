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

from .encoder import BiEncoder  # noqa: F401
from .heads import POOLING_MODES  # noqa: F401
from .loading import resolve_model_path  # noqa: F401
from .st_layout import read_st_layout  # noqa: F401
