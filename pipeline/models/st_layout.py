"""sentence-transformers directories: read (`read_st_layout`) and written (`save_st_directory`).

Any sentence-transformers directory loads (Transformer or a query/document Router, then Dense, Pooling in any
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
from pathlib import Path

import torch

from ..errors import ConfigError
from .heads import LEGACY_POOLING_KEYS, POOLING_MODES, DenseLayer
from .loading import BIENCODER_FILE, read_json, write_json


ST_TRANSFORMER_CONFIGS = ("sentence_bert_config.json", "sentence_roberta_config.json",
                          "sentence_distilbert_config.json", "sentence_camembert_config.json",
                          "sentence_albert_config.json", "sentence_xlm-roberta_config.json",
                          "sentence_xlnet_config.json")


DOC_PROMPT_NAMES = ("document", "passage", "corpus")  # what encode_document looks for, in order


def _kind(type_name: str, where: str) -> str:
    """'Transformer', 'Pooling', 'Dense', 'Normalize' or 'Router' for a sentence-transformers module type."""
    short = type_name.rsplit(".", 1)[-1]
    if type_name.startswith("sentence_transformers.") and short in ("Transformer", "Pooling", "Dense", "Normalize",
                                                                   "Router", "Asym"):
        return "Router" if short == "Asym" else short
    raise ConfigError(f"{where}: module {type_name!r} is not supported (supported: Transformer, Pooling, Dense, "
                      "Normalize, a query/document Router); refusing rather than encoding differently")


def _pooling_mode(folder: Path, where: str) -> tuple[str, bool]:
    cfg = read_json(folder / "config.json") or {}
    mode = cfg.get("pooling_mode")
    if mode is None:
        active = [m for key, m in LEGACY_POOLING_KEYS.items() if cfg.get(key)]
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
            cfg = read_json(folder / name) or {}
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
            cfg = read_json(folder / "config.json") or {}
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
    cfg = read_json(folder / "router_config.json") or read_json(folder / "config.json")
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
    modules = read_json(path / "modules.json")
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
    st_cfg = read_json(path / "config_sentence_transformers.json") or {}
    prompts = st_cfg.get("prompts") or {}
    doc_prompt = next((prompts[n] for n in DOC_PROMPT_NAMES if n in prompts), None)
    return {**specs, "shared": shared, "same_head": chains["query"][1:] == chains["document"][1:],
            "prompts": {"query": prompts.get("query") or "", "doc": doc_prompt or ""}}


# ---------------------------------------------------------------------------- writing


def save_st_directory(bi, out: str | Path) -> None:
    """Save a BiEncoder `bi` as a sentence-transformers directory that is also a HF model (see the
    module doc); atomic."""
    from ..io_utils import atomic_path

    q_len, d_len = bi.default_max_lengths["query"], bi.default_max_lengths["doc"]
    transformer = "sentence_transformers.models.Transformer"
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)

        def tower(folder: Path, model, tok, lengths: dict) -> None:
            model.save_pretrained(folder, safe_serialization=True)
            tok.save_pretrained(folder)
            write_json(folder / "sentence_bert_config.json", {**lengths, "do_lower_case": False})

        both = {"max_seq_length": d_len, **({"query_length": q_len, "document_length": d_len} if q_len != d_len else {})}
        if bi.shared and bi.query_head is bi.doc_head:
            tower(tmp, bi.doc_encoder, bi.doc_tokenizer, both)
            modules = [{"idx": 0, "name": "0", "path": "", "type": transformer}]
            for i, (kind, typ, write) in enumerate(bi.doc_head.st_modules(bi.doc_encoder.config.hidden_size), 1):
                write(tmp / f"{i}_{kind}")
                modules.append({"idx": i, "name": str(i), "path": f"{i}_{kind}", "type": typ})
        else:
            if bi.shared:
                tower(tmp / "encoder", bi.doc_encoder, bi.doc_tokenizer, both)
                ids = {"query": "encoder", "document": "encoder"}
            else:
                tower(tmp / "query_encoder", bi.query_encoder, bi.query_tokenizer, {"max_seq_length": q_len})
                tower(tmp / "doc_encoder", bi.doc_encoder, bi.doc_tokenizer, {"max_seq_length": d_len})
                ids = {"query": "query_encoder", "document": "doc_encoder"}
            types, structure = {}, {}
            for task, head, model in (("query", bi.query_head, bi.query_encoder),
                                      ("document", bi.doc_head, bi.doc_encoder)):
                types[ids[task]] = transformer
                structure[task] = [ids[task]]
                for i, (kind, typ, write) in enumerate(head.st_modules(model.config.hidden_size), 1):
                    write(tmp / f"{task}_{i}_{kind}")
                    types[f"{task}_{i}_{kind}"] = typ
                    structure[task].append(f"{task}_{i}_{kind}")
            write_json(tmp / "router_config.json", {
                "types": types, "structure": structure,
                "parameters": {"default_route": "document", "allow_empty_key": True, "route_mappings": {}}})
            modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Router"}]
        write_json(tmp / "modules.json", modules)
        write_json(tmp / "config_sentence_transformers.json", st_config(bi))
        meta = {"shared": bi.shared, "pooling": bi.pooling, "normalize": bi.normalize,
                "query_prefix": bi.cfg.query_prefix, "doc_prefix": bi.cfg.doc_prefix,
                "max_lengths": {"query": q_len, "doc": d_len},
                "trained_max_lengths": {"query": bi.cfg.query_max_length, "doc": bi.cfg.doc_max_length}}
        write_json(tmp / BIENCODER_FILE, meta)


def st_config(bi) -> dict:
    """config_sentence_transformers.json: prompts for encode_query / encode_document (and plain encode)."""
    from importlib import metadata

    import transformers

    versions = {"transformers": transformers.__version__, "pytorch": torch.__version__}
    try:
        versions["sentence_transformers"] = metadata.version("sentence-transformers")
    except metadata.PackageNotFoundError:
        pass
    return {"__version__": versions, "model_type": "SentenceTransformer",
            "prompts": {"query": bi.cfg.query_prefix, "document": bi.cfg.doc_prefix},
            # plain .encode(texts) gives document vectors, as `pipeline encode` does
            "default_prompt_name": "document" if bi.cfg.doc_prefix else None,
            "similarity_fn_name": "cosine" if bi.normalize else "dot"}
