"""The export cache of OpenVINO towers (models/backends.py): where it is, what names an entry (the keys),
and how an entry is made, checked and repaired.

Two kinds of entry, each a folder named by a digest of everything its content depends on:

- `openvino/<tower_digest>`: one model's tower with its weights (`export.json`). Its key: the model
  folder's files (each by its place in the folder, symlinks followed), the tower's settings, the source
  of the model modules and the versions (`tower_settings`). Another model, the same folder with a
  changed file, or a change to the code that computes a tower (pooling, heads) is another digest, so a
  stale export is never used and nobody has to bump a version by hand.
- `openvino-graphs/<graph_key>`: an architecture's converted graph and which constant holds which
  weight (`graph.json`, models/backends.RefreshableTower). Its key: the transformer's class and
  config, the parameters' names and shapes, the buffers' values and the same `tower_settings`, in
  which every setting of the head that changes what it computes is written out (pooling, normalize,
  include_prompt, each Dense layer's activation, bias and residual flag, on tokens or on the sentence
  vector), so two models whose parameters have equal shapes but whose heads compute differently never
  share a graph.

An entry is complete when its marker file is there, the files the marker lists have the digests it
records, and the marker matches the digest of its own record (`record_digest`): every file of an entry
is under a digest, the marker's own content (a kept graph's weight map) included. Whoever makes or
repairs an entry holds its lock (`.<entry>.lock` beside it, fcntl.flock: also across the nodes sharing
a home folder over NFS), so two encoders converting one model at once do the work once: the second
waits, then finds the entry complete. A complete entry is never removed or replaced; one whose files
or marker no longer match their digests is set aside and made again, once, with a note naming it. What
a killed converter left (`.<entry>-tmp-*`) is removed by the next lock holder. The cache is not kept in
the model's folder: a model may sit in a read-only package, and files added there would change its digest.

The cache is bounded (`PIPELINE_EXPORT_CACHE_MAX_GB`, 10 by default, 0 for no bound): every trained
checkpoint that is encoded is a new tower, so a sweep would otherwise fill the disk. An entry's folder is
touched whenever it is used; after an entry is made, the least recently used ones are removed until the
cache fits. Only entries the cache made are ever removed: a folder whose marker is the cache's own sealed
record (`owned_entry`); anything else under `openvino/` or `openvino-graphs/` (a user's own IR folder, an
entry whose marker was altered) is left as it is and not counted. Never removed either: the one just made,
one used in the last `PRUNE_GRACE_S`, one whose making lock another process holds, and one a process is
using: every reader holds a shared lock on the entry (`in_use`, `.<entry>.use` beside it) from before it
checks the entry until it has compiled what it read, and a prune removes an entry only under that lock
taken exclusively, so an encode of any length never has its entry removed under it. What was removed is
said in a note; it is made again when needed.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import tempfile
import time
import types
from pathlib import Path

import torch

from ..errors import ConfigError

EXPORT_VERSION = 4  # bump when the conversion changes: earlier exports are not used (3: made through the
# architecture's graph; 4: every marker's own record under a digest, the head's settings and the model code
# in both keys, graphs kept only once verified at the fp32 gate)
GRAPH_MARKER = "graph.json"  # the marker of an `openvino-graphs/` entry


def export_cache() -> Path:
    """Where converted towers are kept: $PIPELINE_EXPORT_CACHE, else the user's cache folder."""
    if os.environ.get("PIPELINE_EXPORT_CACHE"):
        return Path(os.environ["PIPELINE_EXPORT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dense-retrieval-pipeline" / "exports"


def export_cache_dir(cache: str | Path | None = None) -> Path:
    """The cache folder, checked: $PIPELINE_EXPORT_CACHE (or `cache`) naming a file, or a bound
    ($PIPELINE_EXPORT_CACHE_MAX_GB) that is not a size, is a ConfigError before anything is converted."""
    cache_limit_bytes()
    folder = Path(cache) if cache is not None else export_cache()
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"PIPELINE_EXPORT_CACHE={folder}: not a folder (a file is there); point it at a folder "
                          "for the converted models (or unset it: the default is ~/.cache/dense-retrieval-pipeline)")
    return folder


KINDS = ("openvino", "openvino-graphs")  # the cache's folders of entries (an int8 tower sits in its tower's)
DEFAULT_MAX_GB = 10.0
PRUNE_GRACE_S = 600.0


def cache_limit_bytes() -> int:
    """The cache's bound from $PIPELINE_EXPORT_CACHE_MAX_GB (GB, 10 by default); 0 means none."""
    raw = os.environ.get("PIPELINE_EXPORT_CACHE_MAX_GB", "").strip()
    if not raw:
        return int(DEFAULT_MAX_GB * 1e9)
    try:
        gb = float(raw)
    except ValueError:
        gb = -1.0
    if not gb >= 0 or gb == float("inf"):
        raise ConfigError(f"PIPELINE_EXPORT_CACHE_MAX_GB={raw!r}: not a size in GB (a number >= 0; 0 for no bound, "
                          f"unset for {DEFAULT_MAX_GB:g})")
    return int(gb * 1e9)


# ---------------------------------------------------------------------------------------- the keys


@functools.lru_cache(maxsize=1)
def model_code_digest() -> str:
    """This package's model modules (encoder, heads, tokens, the conversion: how a tower computes), read
    once a process. In both keys: a fix to pooling or head code is a new export and a new graph."""
    h = hashlib.sha256()
    for source in sorted(Path(__file__).parent.glob("*.py")):
        h.update(source.name.encode() + b"\0" + source.read_bytes())
    return h.hexdigest()


def input_names(model, side: str) -> list[str]:
    """The token arrays the tower takes (token_type_ids where the tokenizer gives them)."""
    tok = model.token_spec(side)[0]
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in tok("probe", truncation=True):
        names.append("token_type_ids")
    return names


def parameter_shapes(model) -> list[tuple[str, tuple[int, ...]]]:
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def _plain(value):
    """A module attribute as JSON when it is a setting (a number, flag, string, a tuple of them, a
    function), else None (tensors, configs, submodules: described elsewhere)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return [value]
    if isinstance(value, (tuple, list)) and all(v is None or isinstance(v, (bool, int, float, str)) for v in value):
        return [list(value)]
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
        return [f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', repr(value))}"]
    return None


def head_settings(head) -> list:
    """Every module of a head (models/heads.Head: Dense layers, their activations, pooling, Normalize) with
    its class and settings: its plain attributes (pooling mode, normalize, include_prompt, a Dense layer's
    bias, residual flag and side, an activation's own parameters such as GELU's approximation) and torch's
    description of it. Written out generically, so a setting added to a head later is in the keys too."""
    out = []
    for name, module in head.named_modules():
        attrs = {}
        for key, value in sorted(vars(module).items()):
            plain = None if key.startswith("_") or key == "training" else _plain(value)
            if plain is not None:
                attrs[key] = plain[0]
        out.append([name, f"{type(module).__module__}.{type(module).__qualname__}", module.extra_repr(), attrs])
    return out


def tower_settings(model, side: str) -> dict:
    """What one side's output depends on apart from the weights and the transformer's architecture:
    the head (every setting that changes what it computes), the prompt length, the inputs, the source of
    the model modules and the versions. Part of both keys (`tower_digest`, `graph_key`)."""
    import openvino
    import transformers

    head = model.query_head if side == "query" else model.doc_head
    return {"side": side, "pooling": model.cfg.pooling, "normalize": model.cfg.normalize,
            "head": head_settings(head), "prompt_length": model._prompt_lengths[side],
            "inputs": input_names(model, side), "dim": model.dim, "code": model_code_digest(),
            "export_version": EXPORT_VERSION, "torch": torch.__version__,
            "transformers": transformers.__version__, "openvino": openvino.__version__}


def tower_digest(model, side: str) -> str:
    """An export's key: the model folder's files (each by its place in the folder, symlinks followed:
    models/loading.model_digest) and `tower_settings` (the model code's digest included)."""
    from .loading import model_digest, resolve_model_path

    cfg = model.cfg
    path = resolve_model_path(cfg.query_name_or_path if side == "query" and cfg.query_name_or_path
                              else cfg.name_or_path)
    h = hashlib.sha256(model_digest(path).encode())
    h.update(json.dumps(tower_settings(model, side), sort_keys=True, default=str).encode())
    return h.hexdigest()


def graph_key(model, side: str) -> str:
    """A converted graph's key: what it depends on apart from the weights' values: the architecture (the
    transformer's class and config, the parameters' names and shapes, the buffers' values) and
    `tower_settings` (the head's settings, the model code, the versions)."""
    encoder = model.query_encoder if side == "query" else model.doc_encoder
    config = encoder.config.to_dict() if hasattr(encoder, "config") else {}
    config = {k: v for k, v in config.items() if not k.startswith("_") and k not in ("torch_dtype", "dtype",
                                                                                       "transformers_version")}
    h = hashlib.sha256()
    for name, buffer in model.named_buffers():
        h.update(name.encode() + buffer.detach().cpu().contiguous().numpy().tobytes())
    settings = {**tower_settings(model, side), "config": config, "parameters": parameter_shapes(model),
                "encoder": f"{type(encoder).__module__}.{type(encoder).__qualname__}"}
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------- the entries


@contextlib.contextmanager
def _flocked(path: Path, wait: bool):
    """An exclusive fcntl lock on `path` (made when missing): yields True holding it, or False without it when
    `wait` is off and another process holds it."""
    import fcntl

    with open(path, "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def entry_lock(entry: Path, wait: bool = True):
    """Exclusive lock of one cache entry, held while it is made, checked or repaired. Yields False
    (without the lock) when `wait` is off and another process holds it."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    with _flocked(entry.parent / f".{entry.name}.lock", wait) as held:
        yield held


@contextlib.contextmanager
def in_use(entry: Path):
    """A shared lock on the entry (the tower entry an int8 entry sits in) while this process reads it: from
    before its check to after what it read is compiled. Waits while a prune removes it (then the entry is
    missing and is made again); a prune skips an entry any process holds this of. Shared: any number of
    readers at once; apart from the making lock (`entry_lock`), so a reader never blocks a repair."""
    import fcntl

    top = _top_entry(entry) or entry
    try:  # no cache folder yet: nothing to protect (an entry made now is the prune's `keep`, then fresh)
        f = open(top.parent / f".{top.name}.use", "a+") if top.parent.is_dir() else None
    except OSError:  # a read-only cache: nothing there can be pruned by anyone
        f = None
    if f is None:
        yield
        return
    with f:
        fcntl.flock(f.fileno(), fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def _removable(entry: Path):
    """Yields True holding the entry's use lock exclusively when no process is using it (else False)."""
    with _flocked(entry.parent / f".{entry.name}.use", wait=False) as held:
        yield held


MARKERS = {"openvino": "export.json", "openvino-graphs": GRAPH_MARKER}  # each kind's entry marker


def owned_entry(entry: Path) -> bool:
    """Whether the cache made `entry`: its kind's marker is a record sealed by `seal` (its own digest
    matches). A user's folder, or an entry whose marker is unreadable or altered, is not: never pruned
    (an altered one is set aside and made again only when it is used, by `cached_entry`)."""
    marker = MARKERS.get(entry.parent.name)
    if marker is None:
        return False
    try:
        record = json.loads((entry / marker).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and isinstance(record.get("files"), dict) \
        and record.get("record_digest") == record_digest(record)


def _file_digests(folder: Path, names) -> dict[str, str]:
    from ..io_utils import sha256_file

    return {n: sha256_file(folder / n) for n in names}


def record_digest(record: dict) -> str:
    """The digest of a marker's record (everything in it but this digest: the file digests included)."""
    body = {k: v for k, v in record.items() if k != "record_digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def seal(record: dict) -> dict:
    """`record` with its own digest, as a marker is written."""
    return {**record, "record_digest": record_digest(record)}


def entry_problem(entry: Path, marker: str) -> str | None:
    """None when `entry` is complete and whole; else why not ("missing" when there is no marker)."""
    try:
        record = json.loads((entry / marker).read_text())
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError) as e:
        return f"its {marker} is unreadable ({e})"
    files = record.get("files") if isinstance(record, dict) else None
    if not files or not isinstance(files, dict):
        return f"its {marker} lists no file digests (made by an older version)"
    if record.get("record_digest") != record_digest(record):
        return f"{marker} does not match its recorded digest (altered)"
    for name, want in files.items():
        try:
            got = _file_digests(entry, [name])[name]
        except OSError:
            return f"{name} is missing"
        if got != want:
            return f"{name} does not match its recorded digest (truncated or altered)"
    return None


def set_aside(entry: Path) -> None:
    """Move a broken entry out of the way (one rename), then delete it."""
    aside = entry.with_name(f".{entry.name}-broken-{os.getpid()}-{os.urandom(4).hex()}")
    with contextlib.suppress(FileNotFoundError):
        os.rename(entry, aside)
        shutil.rmtree(aside, ignore_errors=True)


def _clean_temporaries(entry: Path) -> None:
    """What a converter killed while making `entry` left beside it (only the lock holder calls this)."""
    for tmp in entry.parent.glob(f".{entry.name}-tmp-*"):
        shutil.rmtree(tmp, ignore_errors=True)


def _top_entry(entry: Path) -> Path | None:
    """The entry of a kind's folder that holds `entry` (itself, or the tower an int8 entry sits in)."""
    for folder in (entry, *entry.parents):
        if folder.parent.name in KINDS:
            return folder
    return None


def mark_used(entry: Path) -> None:
    """Touch the entry (and the tower folder an int8 entry sits in): the cache keeps the recently used."""
    for folder in {entry, _top_entry(entry) or entry}:
        with contextlib.suppress(OSError):
            os.utime(folder)


def _size(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def prune(cache: Path, keep: Path | None = None, limit: int | None = None, now: float | None = None) -> str | None:
    """Remove the least recently used entries of the cache until it is within `limit` bytes (the bound of
    $PIPELINE_EXPORT_CACHE_MAX_GB), never `keep`, an entry used in the last PRUNE_GRACE_S or one another
    process holds the making lock of or is using (`in_use`). Only entries the cache made are removed or counted
    (`owned_entry`). Returns a note saying what was removed (None when nothing was)."""
    limit = cache_limit_bytes() if limit is None else limit
    if not limit:
        return None
    now = time.time() if now is None else now
    entries = []
    for kind in KINDS:
        with contextlib.suppress(OSError):
            entries += [e for e in (cache / kind).iterdir()
                        if e.is_dir() and not e.name.startswith(".") and owned_entry(e)]
    sizes = {e: _size(e) for e in entries}
    total = sum(sizes.values())
    if total <= limit:
        return None
    used = {}
    for e in entries:
        with contextlib.suppress(OSError):
            used[e] = e.stat().st_mtime
    removed, freed = 0, 0
    for e in sorted(used, key=used.get):
        if total <= limit:
            break
        if e == keep or now - used[e] < PRUNE_GRACE_S:
            continue
        with entry_lock(e, wait=False) as held, _removable(e) as unused:
            if not (held and unused):
                continue
            set_aside(e)
        removed, freed, total = removed + 1, freed + sizes[e], total - sizes[e]
    if not removed:  # nothing could go (all in use): said once something does, not at every entry made
        return None
    said = (f"the export cache {cache} holds {total / 1e9:.1f} GB after removing the {removed} least recently "
            f"used entr{'y' if removed == 1 else 'ies'} ({freed / 1e9:.1f} GB)")
    if total > limit:
        said += f"; still over its bound of {limit / 1e9:g} GB (what is left was used in the last " \
                f"{PRUNE_GRACE_S / 60:g} min or is being made)"
    else:
        said += f" to keep within its bound of {limit / 1e9:g} GB"
    return said + "; PIPELINE_EXPORT_CACHE_MAX_GB sets it (0: no bound)"


def cached_entry(entry: Path, marker: str, make, notes: list[str]) -> bool:
    """Make sure `entry` holds a complete, whole export: `make(tmp)` writes one into a temporary folder
    (its files; the marker with their digests and its own is written here, last) when there is none, or
    when the one there is broken (set aside first, with a note in `notes`). Returns True when this call
    made it."""
    if entry_problem(entry, marker) is None:
        if any(entry.parent.glob(f".{entry.name}-tmp-*")):  # a killed converter's leftovers, if nobody works now
            with entry_lock(entry, wait=False) as held:
                if held:
                    _clean_temporaries(entry)
        mark_used(entry)
        return False
    with entry_lock(entry):
        problem = entry_problem(entry, marker)
        if problem is None:  # another process made it while this one waited
            mark_used(entry)
            return False
        _clean_temporaries(entry)
        if problem != "missing" or entry.exists():
            notes.append(f"the export cache entry {entry} was broken ({problem if problem != 'missing' else 'incomplete'}); "
                         "set aside and made again")
            set_aside(entry)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-tmp-", dir=entry.parent))
        try:
            record = make(tmp) or {}
            names = sorted(p.name for p in tmp.iterdir() if p.is_file())
            record["files"] = _file_digests(tmp, names)
            (tmp / marker).write_text(json.dumps(seal(record), indent=2, sort_keys=True) + "\n")
            os.rename(tmp, entry)  # the entry appears whole, marker included (nothing is there: checked above)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    mark_used(entry)
    top = _top_entry(entry)
    if top is not None:
        note = prune(top.parent.parent, keep=top)
        if note:
            notes.append(note)
    return True


def graph_cached(model, side: str, cache: str | Path | None = None) -> bool:
    """Whether the export cache holds a converted graph of this architecture (RefreshableTower)."""
    try:
        entry = export_cache_dir(cache) / "openvino-graphs" / graph_key(model, side)[:32]
    except Exception:
        return False
    return (entry / GRAPH_MARKER).is_file()
