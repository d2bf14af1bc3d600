"""Corpus manifests: what a corpus is, so that two corpora are never mixed silently.

docs/METHODS.md §6: the official and the "titled" MS MARCO give incomparable numbers.
Every ingested corpus carries a manifest; every embedding set, index and run
carries the corpus manifest's fingerprint, and comparison tables refuse (or
visibly warn about) rows whose fingerprints differ.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import InputError, PipelineError

MANIFEST_NAME = "manifest.json"
VARIANTS_FIXED = ("wiki-dpr", "msmarco-official", "msmarco-titled", "custom")
TITLE_JOINS = {
    "none": "{text}",
    "{title} [SEP] {text}": "{title} [SEP] {text}",
    "{title} {text}": "{title} {text}",
}
DEFAULT_VARIANT = {"dpr-wiki": "wiki-dpr", "msmarco": "msmarco-official", "msmarco-titled": "msmarco-titled", "hf": "custom"}
DEFAULT_TITLE_JOIN = {
    "wiki-dpr": "{title} [SEP] {text}",
    "msmarco-official": "none",
    "msmarco-titled": "{title} [SEP] {text}",
    "custom": "{title} {text}",
}


def check_variant(variant: str) -> str:
    """A known variant, a `beir-<name>`, or `<variant>-subset` (pipeline subset of one: the source's
    variant, e.g. the titled flag of MS MARCO, survives in the name)."""
    if variant in VARIANTS_FIXED or (variant.startswith("beir-") and len(variant) > 5):
        return variant
    if variant.endswith("-subset") and variant.removesuffix("-subset") in VARIANTS_FIXED:
        return variant
    raise PipelineError(f"unknown corpus variant {variant!r}; use one of {', '.join(VARIANTS_FIXED)}, beir-<name> "
                        "or <variant>-subset")


def check_title_join(join: str) -> str:
    if join not in TITLE_JOINS:
        raise PipelineError(f"unknown title join {join!r}; use one of {', '.join(repr(j) for j in TITLE_JOINS)}")
    return join


def join_title(title: str, text: str, join: str) -> str:
    """The text the document encoder sees. An empty title never leaves a dangling separator."""
    if join == "none" or not title or not title.strip():
        return text
    return TITLE_JOINS[join].format(title=title, text=text)


def join_titles(titles, texts, join: str):
    """`join_title` over Arrow columns in one pass (no Python string per row): the joined texts."""
    import pyarrow.compute as pc

    import pyarrow as pa

    if join == "none":
        return texts
    template = TITLE_JOINS.get(join, "")
    sep = template.removeprefix("{title}").removesuffix("{text}")
    if f"{{title}}{sep}{{text}}" != template:  # another shape: row by row, as join_title does it
        return pa.array([join_title(t or "", x, join) for t, x in zip(titles.to_pylist(), texts.to_pylist())],
                        pa.string())
    titles = pc.fill_null(titles, "")
    blank = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(titles)), 0)
    return pc.if_else(blank, texts, pc.binary_join_element_wise(titles, texts, sep))


def fingerprint(manifest: dict) -> str:
    """Identity of the corpus *as encoded*: variant, source bytes, title join, rows."""
    key = {
        "variant": manifest["variant"],
        "sources": sorted(s["sha256"] for s in manifest["sources"]),
        "title_join": manifest["title_join"],
        "rows": manifest["rows"],
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def load_manifest(corpus_dir: str | Path) -> dict:
    folder = Path(corpus_dir)
    path = folder / MANIFEST_NAME
    if folder.exists() and not folder.is_dir():
        raise InputError(folder, None, "is a file; expected the folder `pipeline ingest` wrote")
    if not path.exists():
        if folder.is_dir() and any(folder.glob(".tmp-ingest-*")):
            raise InputError(path, None, "no manifest: an ingest into this folder was interrupted; run "
                                         "`pipeline ingest` into it again (it finishes or removes the interrupted one)")
        raise InputError(path, None, "no manifest: not a completed `pipeline ingest` output (run ingest first)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(path, e.lineno, f"invalid JSON: {e.msg}") from None
    except (UnicodeDecodeError, OSError) as e:
        raise InputError(path, None, f"cannot read: {e}") from None
    if not isinstance(manifest, dict):
        raise InputError(path, None, "expected a JSON object")
    for key in ("variant", "sources", "title_join", "rows", "parts"):
        if key not in manifest:
            raise InputError(path, None, f"manifest lacks {key!r}")
    parts = manifest["parts"]
    if not isinstance(parts, list) or not all(
            isinstance(p, dict) and isinstance(p.get("file"), str) and isinstance(p.get("rows"), int) for p in parts):
        raise InputError(path, None, "'parts' must be a list of {file, rows}")
    for part in parts:
        rel = Path(part["file"])
        if rel.is_absolute() or ".." in rel.parts:
            raise InputError(path, None, f"part {part['file']!r} is not a path inside the corpus folder")
    return manifest


def describe(manifest_or_meta: dict) -> str:
    m = manifest_or_meta
    return f"{m.get('variant', '?')} (title join {m.get('title_join', '?')!r}, {m.get('rows', '?')} passages, fingerprint {m.get('fingerprint', '?')})"


def check_comparable(metas: dict[str, dict], allow_mixed: bool = False) -> str | None:
    """Refuse (or, with allow_mixed, return a visible warning) when rows come from different corpora.

    `metas` maps a row label to a dict with at least `fingerprint` and `variant`.
    Returns None when all rows share one corpus.
    """
    prints = {label: m.get("fingerprint") for label, m in metas.items()}
    if len(set(prints.values())) <= 1:
        return None
    lines = [f"  {label}: {describe(m)}" for label, m in metas.items()]
    msg = "results come from different corpora and are NOT comparable (docs/METHODS.md §6):\n" + "\n".join(lines)
    if not allow_mixed:
        raise PipelineError(msg + "\npass --allow-mixed-corpora to print them anyway, with this warning")
    return "WARNING: " + msg
