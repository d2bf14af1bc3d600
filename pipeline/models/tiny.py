"""A tiny random-weight BERT built from a config: for tests, smoke runs and benchmarks.

It borrows the WordPiece tokenizer files of the installed MiniLM package (so
tokenisation is real) and never touches the network.
"""

from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def build_tiny_bert(out: str | Path, hidden: int = 32, layers: int = 2, heads: int = 2,
                    intermediate: int = 64, max_positions: int = 256, seed: int = 0) -> Path:
    """Write a randomly initialised BERT (safetensors) + tokenizer to `out`; returns `out`."""
    import torch
    from transformers import BertConfig, BertModel

    from .loading import resolve_model_path

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    src = resolve_model_path("minilm")
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=intermediate,
                        max_position_embeddings=max_positions)
    BertModel(config).save_pretrained(out, safe_serialization=True)
    return out
