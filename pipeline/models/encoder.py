"""The bi-encoder: query and document towers (shared or separate), their heads (pooling, Dense,
Normalize), and batched inference (`embed`, `embed_tokens`).

Where it loads from: models/loading.py; the sentence-transformers directory it reads and writes:
models/st_layout.py (the layout is described there); heads: models/heads.py; precision:
models/precision.py; token arrays: models/tokens.py.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from ..config import ModelConfig
from ..errors import ConfigError, NonFiniteError
from .heads import Head
from .loading import (BIENCODER_FILE, _declared_length, _detect_max_length, _load_config, _load_tokenizer,
                      _lowercase, read_json, resolve_model_path)
from .loading import _load_tower as _load_weighted_tower
from .precision import resolve_precision
from .st_layout import read_st_layout, save_st_directory
from .tokens import batch_bounds, cpu_batch_tokens, padded_batch, tokenize_sorted


_TOWERS = ("doc_encoder", "query_encoder")


class DeferredTower(nn.Module):
    """A transformers tower whose weights are not loaded yet (`BiEncoder.load(..., defer=True)`): its folder
    and config now, the weights at `load()` (once). Its BiEncoder loads it before anything reads it."""

    def __init__(self, path: Path, config):
        super().__init__()
        self.path, self.config = Path(path), config
        self._cell: list = [None]  # the loaded tower (a list: not registered as a submodule)

    def load(self) -> nn.Module:
        if self._cell[0] is None:
            self._cell[0] = _load_weighted_tower(self.path, tokenizer=False)[0]
        return self._cell[0]

    def forward(self, *args, **kwargs):
        raise RuntimeError("a deferred tower is used only once its BiEncoder has loaded it (BiEncoder.load_weights)")


def _deferred_tower(path: Path):
    """(DeferredTower, tokenizer) of one transformers folder: a broken config.json or tokenizer is the
    ConfigError it is at a full load; broken weights are named when they are loaded."""
    return DeferredTower(path, _load_config(path)), _load_tokenizer(path)


def _freeze_pooler(tower) -> None:
    # BERT-style pooler heads are never used (we pool hidden states ourselves); freezing
    # them keeps DDP from waiting for gradients that never come. They are still saved.
    pooler = getattr(tower, "pooler", None)
    if isinstance(pooler, nn.Module):
        pooler.requires_grad_(False)


class BiEncoder(nn.Module):
    """Query and document towers with pooling and optional L2 normalisation. Towers loaded with `defer`
    are loaded at the first use of `doc_encoder`, `query_encoder`, the parameters, buffers, state dict or
    modules (`load_weights`), with the conversions asked for before (`to`, `float`, ...) applied then."""

    def __init__(self, doc_model, doc_tokenizer, query_model=None, query_tokenizer=None,
                 cfg: ModelConfig | None = None, doc_head: Head | None = None, query_head: Head | None = None,
                 declared_max_lengths: dict | None = None):
        super().__init__()
        self._pending: list = []  # conversions (Module._apply) made while a tower is deferred, replayed on it
        cfg = cfg or ModelConfig()
        declared = declared_max_lengths or {}
        # Inference lengths when the config names none: the model's declared limit, else 64 / 256.
        # These (not training's lengths, which only sit in cfg) are what `save` declares.
        self.default_max_lengths = {"query": int(declared.get("query") or 64), "doc": int(declared.get("doc") or 256)}
        cfg = replace(cfg, query_max_length=cfg.query_max_length or self.default_max_lengths["query"],
                      doc_max_length=cfg.doc_max_length or self.default_max_lengths["doc"])
        self.cfg = cfg
        self.doc_encoder = doc_model
        self.doc_tokenizer = doc_tokenizer
        self.shared = query_model is None
        self.query_encoder = doc_model if self.shared else query_model
        self.query_tokenizer = doc_tokenizer if self.shared else (query_tokenizer or doc_tokenizer)
        self.pooling = cfg.pooling or "cls"
        self.normalize = bool(cfg.normalize)
        self.doc_head = doc_head if doc_head is not None else Head(self.pooling, self.normalize)
        self.query_head = query_head if query_head is not None else self.doc_head
        self._prompt_lengths = {side: self._prompt_length(side) for side in ("query", "doc")}
        # training (train.length_group_rows): a batch of at least 2 x this many rows is encoded in length-sorted
        # groups of >= this many rows, each padded to its own longest text (0 = one padded batch)
        self.length_group_rows = 0
        self.row_order = None  # the rows' order in the last grouped forward (`_forward_grouped`)
        for tower in {id(m): m for m in (self._modules[n] for n in _TOWERS)}.values():
            _freeze_pooler(tower)  # (a deferred tower's when it loads)

    # ------------------------------------------------------------------ deferred towers
    @property
    def deferred(self) -> bool:
        """Whether a tower's weights are still to be loaded (`load(..., defer=True)`)."""
        return any(isinstance(self._modules.get(n), DeferredTower) for n in _TOWERS)

    def load_weights(self) -> "BiEncoder":
        """Load every deferred tower now (nothing when none is): the conversions made since (`to`, dtype
        casts) are applied to it, its train/eval mode set and its pooler frozen, as at a full load."""
        if not self.deferred:  # (every parameters() call of a training step comes through here)
            return self
        deferred = {id(t): t for t in (self._modules[n] for n in _TOWERS) if isinstance(t, DeferredTower)}
        loaded = {}
        for key, tower in deferred.items():
            real = tower.load()
            for fn, recurse in self._pending:
                real._apply(fn, recurse)
            real.train(tower.training)
            _freeze_pooler(real)
            loaded[key] = real
        for n in _TOWERS:
            if id(self._modules[n]) in loaded:
                self._modules[n] = loaded[id(self._modules[n])]
        self._pending = []
        return self

    def __getattr__(self, name: str):
        if name in _TOWERS and isinstance(self.__dict__.get("_modules", {}).get(name), DeferredTower):
            self.load_weights()
        return super().__getattr__(name)

    def _apply(self, fn, recurse=True):
        if self.deferred:
            self._pending.append((fn, recurse))
        return super()._apply(fn, recurse)

    def named_parameters(self, *args, **kwargs):
        return super(BiEncoder, self.load_weights()).named_parameters(*args, **kwargs)

    def named_buffers(self, *args, **kwargs):
        return super(BiEncoder, self.load_weights()).named_buffers(*args, **kwargs)

    def named_modules(self, *args, **kwargs):
        return super(BiEncoder, self.load_weights()).named_modules(*args, **kwargs)

    def apply(self, fn):
        return super(BiEncoder, self.load_weights()).apply(fn)

    def state_dict(self, *args, **kwargs):
        return super(BiEncoder, self.load_weights()).state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return super(BiEncoder, self.load_weights()).load_state_dict(*args, **kwargs)

    def __getstate__(self):
        self.load_weights()  # a pickled or copied model carries its weights, never a folder to read them from
        return super().__getstate__()

    def _prompt_length(self, side: str) -> int:
        """Tokens of the prefix (sentence-transformers' prompt_length), when pooling must skip them."""
        head = self.query_head if side == "query" else self.doc_head
        prefix = self.cfg.query_prefix if side == "query" else self.cfg.doc_prefix
        if head.include_prompt or not prefix:
            return 0
        tok = self.query_tokenizer if side == "query" else self.doc_tokenizer
        ids = tok([prefix], truncation=True)["input_ids"][0]
        return len(ids) - (1 if ids and ids[-1] in tok.all_special_ids else 0)

    # ------------------------------------------------------------------ loading / saving
    @classmethod
    def load(cls, cfg: ModelConfig, defer: bool = False) -> "BiEncoder":
        """Any of: a sentence-transformers directory, one saved by `save` (either layout, any age),
        or a plain HF model directory (CLS, no normalisation unless the config says otherwise).
        `defer`: the towers' weights (and transformers' modelling code, ~2.6 s to import for BERT on a 2-core
        EPYC) are loaded at their first use (`DeferredTower`): a caller that may need only the tokenizer,
        the heads and the sizes (a warm OpenVINO encode: models/backends.py) never pays for them."""
        _load_tower = _deferred_tower if defer else _load_weighted_tower
        path = resolve_model_path(cfg.name_or_path)
        saved = read_json(path / BIENCODER_FILE) or {}
        st = read_st_layout(path)
        q_model = q_tok = None
        st_pool = st_norm = None
        specs = {}
        if st is not None:
            specs = {"doc": st["document"], "query": st["query"]}
            doc_model, doc_tok = _load_tower(specs["doc"]["folder"])
            if not st["shared"]:
                q_model, q_tok = _load_tower(specs["query"]["folder"])
            for side, tok in (("doc", doc_tok), ("query", q_tok or doc_tok)):
                if specs[side]["do_lower_case"]:
                    _lowercase(tok)
            declared = {"doc": _declared_length(specs["doc"], "document", doc_model, doc_tok),
                        "query": _declared_length(specs["query"], "query", q_model or doc_model, q_tok or doc_tok)}
            q, d = specs["query"], specs["doc"]
            if (q["pooling"], q["normalize"]) != (d["pooling"], d["normalize"]):
                raise ConfigError(f"{path}: the query route pools {q['pooling']!r} (normalize={q['normalize']}) and the "
                                  f"document route {d['pooling']!r} (normalize={d['normalize']}); both must agree")
            st_pool, st_norm = d["pooling"], d["normalize"]
        else:
            if saved.get("shared") is False:  # separate towers saved before the sentence-transformers layout
                doc_model, doc_tok = _load_tower(path / "doc_encoder")
                q_model, q_tok = _load_tower(path / "query_encoder")
            else:
                doc_model, doc_tok = _load_tower(path)
            length = _detect_max_length(path)
            declared = {"query": length, "doc": length}
        if cfg.query_name_or_path:
            q_path = resolve_model_path(cfg.query_name_or_path)
            q_st = read_st_layout(q_path)
            q_model, q_tok = _load_tower(q_st["query"]["folder"] if q_st else q_path)
        pooling = cfg.pooling or st_pool or saved.get("pooling") or "cls"
        if cfg.normalize is not None:
            normalize = cfg.normalize
        else:
            normalize = st_norm if st is not None else saved.get("normalize", False)
        prompts = st["prompts"] if st is not None else {}
        cfg = replace(cfg, pooling=pooling, normalize=bool(normalize),
                      # an empty prefix means the model's own (its prompts, or what it was trained with)
                      query_prefix=cfg.query_prefix or prompts.get("query") or saved.get("query_prefix") or "",
                      doc_prefix=cfg.doc_prefix or prompts.get("doc") or saved.get("doc_prefix") or "")
        doc_head = query_head = None
        if specs:
            def head(spec):
                return Head(pooling, bool(normalize), spec["include_prompt"], spec["token_dense"], spec["sentence_dense"])

            doc_head = head(specs["doc"])
            query_head = doc_head if st["same_head"] else head(specs["query"])
            d_dim = doc_head.dim(int(doc_model.config.hidden_size))
            q_dim = query_head.dim(int((q_model or doc_model).config.hidden_size))
            if q_dim != d_dim:
                raise ConfigError(f"{path}: query vectors have {q_dim} dimensions, document vectors {d_dim}")
        # lengths used in training are recorded, not imposed: inference takes the config, else
        # the model's declared limit, else 64 / 256
        return cls(doc_model, doc_tok, q_model, q_tok, cfg, doc_head, query_head, declared)

    def save(self, out: str | Path) -> None:
        """Save as a sentence-transformers directory that is also a HF model (models/st_layout.py); atomic."""
        save_st_directory(self, out)


    # ------------------------------------------------------------------ encoding
    @property
    def dim(self) -> int:
        return self.doc_head.dim(int(self._modules["doc_encoder"].config.hidden_size))  # (a deferred tower's too)

    def tokenize(self, texts: list[str], side: str) -> dict[str, torch.Tensor]:
        if side == "query":
            tok, prefix, max_len = self.query_tokenizer, self.cfg.query_prefix, self.cfg.query_max_length
        else:
            tok, prefix, max_len = self.doc_tokenizer, self.cfg.doc_prefix, self.cfg.doc_max_length
        if prefix:
            texts = [prefix + t for t in texts]
        return tok(list(texts), padding=True, truncation=True, max_length=max_len, return_tensors="pt")

    def _forward(self, model, batch: dict[str, torch.Tensor], head: Head | None = None,
                 prompt_length: int = 0, side: str = "doc") -> torch.Tensor:
        rows, group = batch["input_ids"].shape[0], self.length_group_rows
        self.row_order = None
        cache = getattr(self, "grad_cache", None)
        if cache is not None and self.training:  # train.grad_cache: chunk by chunk, no graph (train/grad_cache.py)
            return cache.encode(self, model, batch, head, prompt_length, side)
        if self.training and group > 0 and rows >= 2 * group and self._right_padded(model):
            return self._forward_grouped(model, batch, head, prompt_length, rows // group)
        return self._forward_one(model, batch, head, prompt_length)

    def _right_padded(self, model) -> bool:
        tok = self.doc_tokenizer if model is self.doc_encoder else self.query_tokenizer
        return getattr(tok, "padding_side", "right") == "right"

    def _forward_grouped(self, model, batch: dict[str, torch.Tensor], head, prompt_length: int,
                         groups: int) -> torch.Tensor:
        """The rows sorted by length into `groups` groups, each cut to its own longest row (right padding:
        the columns cut are padding in every row of the group), encoded, and put back in input order. Each
        row's vector is the one batch encoding gives (padding is masked; to float rounding), while the
        padded tokens, which a whole batch pads to its single longest text, are not computed: on
        MiniLM with FAQ answers (40 % padding at batch 32, length 256) a step is 1.35x faster in fp32.
        `row_order` keeps the order the tower saw the rows in (a hook on the tower that reads its outputs
        call by call puts them back in input order with `argsort(row_order)`)."""
        mask = batch["attention_mask"]
        lengths = mask.sum(1)
        order = torch.argsort(lengths, stable=True)
        self.row_order = order
        parts = []
        for idx in torch.tensor_split(order, groups):
            width = int(lengths[idx].max())
            parts.append(self._forward_one(model, {k: v[idx, :width] for k, v in batch.items()}, head,
                                           prompt_length))
        return torch.cat(parts)[torch.argsort(order)]

    def _forward_one(self, model, batch: dict[str, torch.Tensor], head: Head | None, prompt_length: int):
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    **({"token_type_ids": batch["token_type_ids"]} if "token_type_ids" in batch else {}))
        return (head or self.doc_head)(out.last_hidden_state, batch["attention_mask"], prompt_length)

    def encode_queries(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Tokenised queries -> (B, D) vectors (with gradients when training)."""
        return self._forward(self.query_encoder, batch, self.query_head, self._prompt_lengths["query"], "query")

    def encode_docs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Tokenised documents -> (B, D) vectors (with gradients when training)."""
        return self._forward(self.doc_encoder, batch, self.doc_head, self._prompt_lengths["doc"])

    def forward(self, queries: dict[str, torch.Tensor] | None, docs: dict[str, torch.Tensor] | None):
        """Training forward (what DDP wraps): each tower runs once. -> (B, D), (N, D).

        Either side may be None (single-tower methods such as ARR encode all texts as
        documents); its output is then None."""
        return (self.encode_queries(queries) if queries is not None else None,
                self.encode_docs(docs) if docs is not None else None)

    @torch.inference_mode()
    def embed(self, texts: list[str], side: str, batch_size: int = 64, device: str | torch.device = "cpu",
              fp16: bool = False, precision: str | None = None, sort_by_length: bool = True,
              window: int = 8192, runner=None, max_tokens: int | None = None):
        """Plain text -> float32 numpy (N, D) in input order, in batches, inference mode.

        Texts are tokenised once per `window`, sorted by token length inside it and
        batched, so each batch pads only to its own longest text; rows come back in
        input order. `precision` is `fp32` (default), `bf16`, `fp16` or `auto`
        (`resolve_precision`): autocast for the matmuls, vectors returned as float32.
        `fp16=True` is the older spelling of `precision="fp16"` on CUDA. `runner`: a compiled tower
        (models/backends.py) that runs the padded batches instead of this module (see `embed_tokens`,
        which also says how `max_tokens` caps a batch's padded tokens on a CPU).
        """
        import numpy as np

        self.eval()
        device = torch.device(device)
        if precision is None:
            precision = "fp16" if fp16 and device.type == "cuda" else "fp32"
        precision = resolve_precision(precision, device)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for w in range(0, len(texts), max(1, window)):
            chunk = texts[w:w + max(1, window)]
            out[w:w + len(chunk)] = self._embed_window(chunk, side, batch_size, device, precision, sort_by_length,
                                                       runner, max_tokens)
        return out

    def _embed_window(self, texts, side: str, batch_size: int, device: torch.device, precision: str,
                      sort_by_length: bool, runner=None, max_tokens: int | None = None):
        """One window of `embed`: tokenise once, length-sorted padded batches, order restored."""
        tok, prefix, max_len = self.token_spec(side)
        tokens = tokenize_sorted(tok, texts, prefix, max_len, sort_by_length)
        return self.embed_tokens(tokens, side, batch_size, device, precision, runner, max_tokens)

    @contextmanager
    def inference_lengths(self):
        """Within this block the model tokenises to the lengths its export declares (`default_max_lengths`,
        what `save` writes and `pipeline encode` / `retrieve` use), not to training's shorter ones: a
        validation inside training then scores the texts the exported model will see."""
        kept = self.cfg
        self.cfg = replace(kept, query_max_length=self.default_max_lengths["query"],
                           doc_max_length=self.default_max_lengths["doc"])
        try:
            yield self
        finally:
            self.cfg = kept

    def token_spec(self, side: str):
        """(tokenizer, prefix, max length) of one side: all a tokenising stage needs."""
        if side == "query":
            return self.query_tokenizer, self.cfg.query_prefix, self.cfg.query_max_length
        return self.doc_tokenizer, self.cfg.doc_prefix, self.cfg.doc_max_length

    @torch.inference_mode()
    def embed_tokens(self, tokens: dict, side: str, batch_size: int = 64, device: str | torch.device = "cpu",
                     precision: str = "fp32", runner=None, max_tokens: int | None = None):
        """`tokenize_sorted`'s arrays -> float32 numpy (N, D) in the texts' input order.

        Only the model's part of encoding (padding a batch is one vectorised copy), so a
        CPU stage can tokenise ahead of this. On CUDA each batch goes through pinned
        memory with a non-blocking copy. `runner` (models/backends.py: e.g. the tower compiled
        by OpenVINO) takes the padded numpy batch instead of this module. A batch holds at most
        `batch_size` rows and `max_tokens` padded tokens (None: on a CPU `cpu_batch_tokens` of the threads
        that run it, rows only on a GPU; 0: rows only)."""
        import numpy as np

        self.eval()
        device = torch.device(device)
        if runner is None:  # a runner computes in its own precision (e.g. OpenVINO's int8)
            precision = resolve_precision(precision, device)
        encode = self.encode_queries if side == "query" else self.encode_docs
        tok = self.token_spec(side)[0]
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
        left = getattr(tok, "padding_side", "right") == "left"
        cuda = device.type == "cuda" and torch.cuda.is_available()
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        lengths, order = tokens["lengths"], tokens["order"]
        offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        out = np.empty((len(lengths), self.dim), dtype=np.float32)
        if max_tokens is None:  # on a CPU: the cap for the threads that run the batches (the runner's or torch's)
            max_tokens = 0 if device.type == "cuda" else cpu_batch_tokens(getattr(runner, "threads", None)
                                                                           or torch.get_num_threads())
        # one autocast block around every batch: the weights are cast to bf16/fp16 once, not at every batch
        with torch.autocast(device_type=device.type, dtype=dtype or torch.float32,
                            enabled=dtype is not None and runner is None):
            for s, e in batch_bounds(lengths, batch_size, max_tokens):
                batch = padded_batch(tokens, offsets, s, e, pad_id, left)
                if runner is not None:
                    out[order[s:e]] = runner(batch)
                    continue
                if cuda:
                    batch = {k: torch.from_numpy(v).pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
                else:
                    batch = {k: torch.from_numpy(v).to(device) for k, v in batch.items()}
                out[order[s:e]] = encode(batch).float().cpu().numpy()
        self.check_finite(out, side)
        return out

    def check_finite(self, vectors, side: str) -> None:
        """Refuse NaN/inf vectors where they are made: a model that gives them (weights from a training
        run that diverged, a broken export) would otherwise be indexed, searched and scored silently."""
        import numpy as np

        bad = ~np.isfinite(vectors).all(axis=1)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise NonFiniteError(f"the model {self.cfg.name_or_path} gives non-finite vectors (NaN or inf) for "
                                 f"{int(bad.sum()):,} of {len(vectors):,} {'queries' if side == 'query' else 'passages'} "
                                 f"(the first at position {first}): its weights are unusable (a training run that "
                                 "diverged?); nothing was written from them")
