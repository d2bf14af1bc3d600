"""ir_datasets identifiers as inputs (`msmarco-passage/dev/small`, `beir/scifact/test`,
`dpr-w100/natural-questions/dev`), read ONLY from files already in ir_datasets' home.

ir_datasets (the PyPI package, pinned 0.6.x) knows, for every dataset, which files it
reads, where it keeps them (`IR_DATASETS_HOME`, default `~/.ir_datasets`) and where it
would download them from. We never let it download:

* before anything is read, `check_local` walks the objects ir_datasets built for the
  dataset (its `Cache`, `Download`, `TarExtract`, `ZipExtract`... chain) and lists every
  file that is neither there nor derivable from a file that is there; any such file is
  an error naming where to put it (and the URL and md5 ir_datasets would use);
* it refuses a dataset whose `Migrator` would delete a file the user placed (ir_datasets
  deletes e.g. `msmarco-passage/collection.tsv` when `irds_version.txt` is missing);
* while iterating, every network path of ir_datasets (`Download.path` with no local
  copy, `RequestsDownload`, Google Drive / bucket streams) is replaced by one that raises,
  so a file the static walk could not see (e.g. behind a lazily built query filter) is the
  same error, never a request.

Extraction (a file out of a local archive, a docstore, DPR's queries.tsv built from its
JSON) is ir_datasets' own local work and is allowed. Note that ir_datasets fixes its home
when it is first imported: set `IR_DATASETS_HOME` before.

Size: ~510 lines on purpose: walking ir_datasets' Cache/Download chains, the local-files-only
guard and the readers of its docs/queries/qrels are one concern, the one place ir_datasets is touched.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import os
import re
import tempfile
import shutil
import atexit
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import InputError, PipelineError
from .checks import check_id, check_text

_FILE_SUFFIX = re.compile(r"\.(tsv|csv|jsonl?|gz|bz2|zip|trec|txt|parquet|run|qrels)$", re.I)
EXAMPLES = "msmarco-passage/dev/small, beir/scifact/test, dpr-w100/natural-questions/dev"


class _NoNetwork(PipelineError):
    """Raised by the patched download paths of ir_datasets."""


def _irds():
    os.environ.setdefault("IR_DATASETS_DL_TRIES", "1")
    os.environ.setdefault("IR_DATASETS_DL_DISABLE_PBAR", "true")
    try:
        import ir_datasets
    except ImportError:  # pragma: no cover - a dependency since pyproject lists it
        raise PipelineError("ir_datasets identifiers need the package ir_datasets (pip install ir_datasets==0.6.3)") \
            from None
    return ir_datasets


def home() -> Path:
    return Path(os.environ.get("IR_DATASETS_HOME", Path.home() / ".ir_datasets"))


@dataclass(frozen=True)
class IrdsRef:
    """An ir_datasets identifier given where a file was expected."""

    id: str

    def __str__(self) -> str:
        return self.id

    def dataset(self):
        return load(self.id)


def load(identifier: str):
    """The ir_datasets Dataset, or a PipelineError naming close identifiers."""
    ir_datasets = _irds()
    try:
        return ir_datasets.registry[identifier]
    except KeyError:
        pass
    known = list(ir_datasets.registry)
    close = difflib.get_close_matches(identifier, known, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else f" (e.g. {EXAMPLES}; `ir_datasets list` lists them)"
    raise PipelineError(f"{identifier!r} is neither an existing file nor an ir_datasets identifier{hint}")


def is_identifier(spec) -> bool:
    """True when `spec` names no existing path and is a registered ir_datasets identifier.
    A path that exists always wins."""
    if isinstance(spec, IrdsRef):
        return True
    if spec is None or isinstance(spec, Path):
        return False
    s = str(spec)
    if not s or os.path.exists(s) or s.startswith((".", "/", "~")) or "\\" in s or _FILE_SUFFIX.search(s):
        return False  # a file name (e.g. a mistyped queries.tsv) never imports ir_datasets
    try:
        load(s)
    except PipelineError:
        return False
    return True


def resolve(spec, what: str = "file"):
    """`spec` as a Path (an existing path, or one that is not an identifier) or an IrdsRef.

    A missing path that looks like an identifier (no suffix, 'a/b' form) but is not one is
    an error naming close identifiers, rather than a bare 'file not found' later.
    """
    if spec is None or isinstance(spec, (IrdsRef, Path)):
        return spec
    s = str(spec)
    if os.path.exists(s):
        return Path(s)
    if is_identifier(s):
        return IrdsRef(s)
    if "/" in s and not Path(s).suffix and not s.startswith((".", "/", "~")):
        load(s)  # raises: names close identifiers
    return Path(s)


# --------------------------------------------------------------------------- which files a dataset needs


@dataclass
class Missing:
    path: str
    url: str | None = None
    md5: str | None = None
    note: str | None = None
    cache: str | None = None  # ir_datasets' own derived copy that would also do

    def describe(self) -> str:
        s = f"  {self.path}"
        if self.url:
            s += f"\n      (ir_datasets downloads it from {self.url}" + (f", md5 {self.md5})" if self.md5 else ")")
        elif self.note:
            s += f"\n      ({self.note.strip()})"
        if self.cache and self.cache != self.path:
            s += f"\n      or ir_datasets' own extracted copy at {self.cache}"
        return s


def _mod(obj) -> str:
    return type(obj).__module__ or ""


def _provider(dataset, entity: str):
    """The constituent that serves `<entity>_handler`, without calling anything (a Migrator runs
    its deletions on the first call). Returns (handler-ish object, migrators on the way)."""
    migrators = []
    node = dataset
    for _ in range(20):
        cons = getattr(node, "_constituents", None)
        if cons is None:
            break
        for c in cons:
            if hasattr(c, f"{entity}_handler"):
                node = c
                break
        else:
            return None, migrators
        while type(node).__name__ == "Migrator":
            migrators.append(node)
            node = node._wrapped
    return node, migrators


def _check_migrator(m, problems: list[str]) -> None:
    vf = Path(m._version_file)
    current = vf.read_text().strip() if vf.exists() else None
    if current == m._version:
        return
    doomed = [str(f) for f in m._affected_files if os.path.exists(f)]
    if doomed:
        problems.append(f"ir_datasets would delete {', '.join(doomed)}: {vf} does not say {m._version!r} (it treats "
                        f"the files as an older layout). If they are ir_datasets {m._version} files, write "
                        f"{m._version!r} into {vf}; otherwise remove them")


def _walk(node, missing: list[Missing], seen: set, depth: int = 0) -> bool:
    """True when `node` can produce its bytes from local files. Appends what is missing."""
    if node is None or depth > 40 or isinstance(node, (str, bytes, int, float, bool, dict, type)):
        return True
    if id(node) in seen:
        return True
    seen.add(id(node))
    name = type(node).__name__
    if isinstance(node, (list, tuple)):
        return all([_walk(x, missing, seen, depth + 1) for x in node])
    if not _mod(node).startswith("ir_datasets"):
        return True
    if name == "Cache":
        if Path(node._path).exists():
            return True
        before = len(missing)
        if _walk(node._streamer, missing, seen, depth + 1):
            return True
        for m in missing[before:]:
            m.cache = m.cache or str(node._path)
        return False
    if name == "Download":
        return _download_ok(node, missing)
    if name == "LocalDownload":
        if Path(node._path).exists():
            return True
        missing.append(Missing(str(node._path), note=getattr(node, "_message", None)))
        return False
    if name in ("RequestsDownload", "GoogleDriveDownload"):
        missing.append(Missing("(no local path: ir_datasets only streams it)", url=node.url))
        return False
    if name == "GoogleCloudBucketStream":
        missing.append(Missing("(no local path: ir_datasets only streams it)", url=node.uri))
        return False
    if name == "TarExtractAll":
        return Path(node._extract_path).exists() or _walk(node._streamer, missing, seen, depth + 1)
    if name == "ZipExtractCache":
        return Path(node.extract_path).exists() or _walk(node.dlc, missing, seen, depth + 1)
    if name == "ReTar":
        return Path(node._output_file).exists() or _walk(node._streamer, missing, seen, depth + 1)
    if name == "_ManagedDlc":  # dpr-w100: queries.tsv / qrels built from DPR's JSON
        return Path(node._path).exists() or _walk(node._manager._dlc, missing, seen, depth + 1)
    if name == "Lazy":  # e.g. a query filter built from qrels: walk what its function closes over
        fn = getattr(node, "_fn", None)
        cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if _cell_ok(c)]
        return all([_walk(c, missing, seen, depth + 1) for c in cells if not isinstance(c, (dict, list))])
    if name == "Dataset":
        return True  # another dataset's handler: not walked (the runtime guard covers it)
    if name == "Migrator":
        return _walk(node._wrapped, missing, seen, depth + 1)
    attrs = getattr(node, "__dict__", None)
    if not attrs:
        return True
    return all([_walk(v, missing, seen, depth + 1) for k, v in attrs.items()
                if k not in ("_beta_apis", "_docs_cls", "_cls")])


def _cell_ok(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _download_ok(dl, missing: list[Missing]) -> bool:
    cache = getattr(dl, "_cache_path", None)
    if dl._path is not None or (cache and os.path.exists(cache)):
        return True
    url = note = None
    local = []
    for mirror in dl.mirrors:
        kind = type(mirror).__name__
        if kind == "LocalDownload":
            if Path(mirror._path).exists():
                return True
            local.append(str(mirror._path))
            note = note or getattr(mirror, "_message", None)
        elif url is None:
            url = getattr(mirror, "url", None) or getattr(mirror, "uri", None)
    path = cache or (local[0] if local else "(a temporary file: ir_datasets keeps no copy of it)")
    missing.append(Missing(str(path), url=url, md5=getattr(dl, "expected_md5", None), note=None if url else note))
    return False


def check_local(identifier: str, entities=("docs", "queries", "qrels")) -> dict:
    """Raise a PipelineError listing every file `identifier` needs for `entities` that is not local.

    Returns {entity: provider type name} for the entities the dataset has.
    """
    ds = load(identifier)
    missing: list[Missing] = []
    problems: list[str] = []
    have = {}
    for entity in entities:
        node, migrators = _provider(ds, entity)
        if node is None:
            continue
        have[entity] = type(node).__name__
        for m in migrators:
            _check_migrator(m, problems)
        _walk(node, missing, set())
    if problems:
        raise PipelineError(f"ir_datasets dataset {identifier!r}: " + "; ".join(problems))
    if missing:
        raise PipelineError(_missing_message(identifier, entities, missing))
    return have


def _missing_message(identifier: str, entities, missing: list[Missing]) -> str:
    uniq, seen = [], set()
    for m in missing:
        if m.path not in seen:
            seen.add(m.path)
            uniq.append(m)
    return (f"ir_datasets dataset {identifier!r} ({'/'.join(entities)}) is not available locally, and nothing is "
            f"downloaded here. Place {'this file' if len(uniq) == 1 else 'these files'} "
            f"(IR_DATASETS_HOME={home()}):\n" + "\n".join(m.describe() for m in uniq))


# --------------------------------------------------------------------------- the network guard


_GUARD: dict = {"active": [], "saved": None}  # identifiers being read; ir_datasets' originals while patched


def _guarded_id() -> str:
    return _GUARD["active"][-1] if _GUARD["active"] else "?"


@contextlib.contextmanager
def no_network(identifier: str):
    """Every way ir_datasets could reach the network raises `_NoNetwork` (a PipelineError) instead.

    Reference-counted: the patches go in when the first reader starts and come out when the last
    one ends, whatever order overlapping readers (generators) finish in."""
    dl = _irds().util.download

    def refuse(what):
        def f(self, *a, **k):
            url = getattr(self, "url", None) or getattr(self, "uri", None) or what
            raise _NoNetwork(f"ir_datasets dataset {_guarded_id()!r} needs {url}, which is not in its home "
                             f"(IR_DATASETS_HOME={home()}); nothing is downloaded here: place that file in "
                             "ir_datasets' home")
        return f

    if _GUARD["saved"] is None:
        orig_path = dl.Download.path

        def guarded_path(self, force=True):
            if force and self._path is None:
                cache = self._cache_path
                if not (cache and os.path.exists(cache)) and not any(
                        type(m).__name__ == "LocalDownload" and Path(m._path).exists() for m in self.mirrors):
                    missing: list[Missing] = []
                    _download_ok(self, missing)
                    raise _NoNetwork(_missing_message(_guarded_id(), ("a file it reads",), missing))
            return orig_path(self, force)

        patches = [(dl.Download, "path", guarded_path),
                   (dl.RequestsDownload, "__iter__", refuse("a download")),
                   (dl.RequestsDownload, "stream", refuse("a download")),
                   (dl.GoogleDriveDownload, "stream", refuse("a Google Drive download")),
                   (dl.GoogleCloudBucketStream, "stream", refuse("a bucket download"))]
        _GUARD["saved"] = [(cls, name, cls.__dict__[name]) for cls, name, _ in patches]
        for cls, name, fn in patches:
            setattr(cls, name, fn)
    _GUARD["active"].append(identifier)
    try:
        yield
    finally:
        _GUARD["active"].remove(identifier)
        if not _GUARD["active"] and _GUARD["saved"] is not None:
            for cls, name, fn in _GUARD["saved"]:
                setattr(cls, name, fn)
            _GUARD["saved"] = None


def _iterate(identifier: str, entity: str) -> Iterator:
    check_local(identifier, (entity,))
    ds = load(identifier)
    if not getattr(ds, f"has_{entity}")():
        raise PipelineError(f"ir_datasets dataset {identifier!r} has no {entity}")
    with no_network(identifier):  # ir_datasets' own progress lines (docstore builds, extraction) stay visible
        try:
            it = getattr(ds, f"{entity}_iter")()
            for rec in it:
                yield rec
        except PipelineError:
            raise
        except ImportError as e:
            raise PipelineError(f"ir_datasets dataset {identifier!r} needs a package that is not installed: {e}") \
                from None
        except Exception as e:  # corrupt archive, bad md5, format change: ir_datasets raises many types
            raise InputError(identifier, None, f"ir_datasets could not read its {entity}: "
                                               f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None


# --------------------------------------------------------------------------- records in our shapes


def _text(rec) -> str:
    t = getattr(rec, "text", None)
    if isinstance(t, str):
        return t
    return rec.default_text()


def read_docs(identifier: str) -> Iterator[dict]:
    """Corpus records {pid, title, text, line} (line = 1-based document number)."""
    for no, doc in enumerate(_iterate(identifier, "docs"), 1):
        title = getattr(doc, "title", "")
        title = title if isinstance(title, str) else ""
        yield {"pid": check_id(identifier, no, str(doc.doc_id)), "title": check_text(identifier, no, title, "title"),
               "text": check_text(identifier, no, _text(doc)), "line": no}


def read_queries(identifier: str) -> Iterator[dict]:
    """Query records {qid, text, line} (+ answers when the dataset has them, e.g. dpr-w100)."""
    for no, q in enumerate(_iterate(identifier, "queries"), 1):
        text = " ".join(_text(q).split())
        if not text:
            raise InputError(identifier, no, f"empty query text for query {q.query_id!r}")
        r = {"qid": check_id(identifier, no, str(q.query_id), "query id"), "text": text, "line": no}
        answers = getattr(q, "answers", None)
        if answers is not None:
            r["answers"] = list(answers)
        yield r


def read_qrels(identifier: str) -> Iterator[dict]:
    """Qrels records {qid, docid, rel, line}."""
    for no, r in enumerate(_iterate(identifier, "qrels"), 1):
        yield {"qid": check_id(identifier, no, str(r.query_id), "query id"),
               "docid": check_id(identifier, no, str(r.doc_id), "doc id"), "rel": int(r.relevance), "line": no}


def has(identifier: str, entity: str) -> bool:
    return bool(getattr(load(identifier), f"has_{entity}")())


def docs_parent(identifier: str) -> str:
    """The identifier whose docs these are (beir/scifact/test -> beir/scifact), without running a migrator."""
    ds = load(identifier)
    node, _ = _provider(ds, "docs")
    parts = identifier.split("/")
    best = identifier
    while len(parts) > 1:
        parts.pop()
        cand = "/".join(parts)
        try:
            other = _irds().registry[cand]
        except KeyError:
            continue
        n2, _ = _provider(other, "docs")
        if n2 is not None and n2 is node:
            best = cand
    return best


def split_name(identifier: str) -> str:
    """The qrels split name ingest files a dataset's qrels under (qrels/<split>.trec)."""
    parent = docs_parent(identifier)
    rest = identifier[len(parent):].strip("/")
    if rest:
        return rest.replace("/", "-")
    return "test" if identifier.startswith("beir/") else "qrels"


def variant_for(identifier: str) -> str:
    if identifier.startswith("msmarco-passage"):
        return "msmarco-official"
    if identifier.startswith("dpr-w100"):
        return "wiki-dpr"
    if identifier.startswith("beir/"):
        return "beir-" + docs_parent(identifier).split("/", 1)[1].replace("/", "-").lower()
    return "custom"


# --------------------------------------------------------------------------- local files for the other verbs

_TMP: list[str] = []


def _tmpdir() -> Path:
    if not _TMP:
        d = tempfile.mkdtemp(prefix="pipeline-irds-")
        _TMP.append(d)
        atexit.register(shutil.rmtree, d, True)
    return Path(_TMP[0])


def queries_file(identifier: str, fmt: str = "tsv") -> Path:
    """The dataset's queries as a temporary `qid\\ttext` TSV (fmt 'tsv') or DPR QA file
    (fmt 'dpr-qa': question\\t[answers], in the dataset's order, so qids are 0..N-1 as DPR's)."""
    import json

    name = hashlib.sha1(f"{identifier}|{fmt}".encode()).hexdigest()[:12]
    path = _tmpdir() / f"queries-{name}.{'csv' if fmt == 'dpr-qa' else 'tsv'}"
    if path.exists():
        return path
    with open(path, "w", encoding="utf-8") as f:
        for i, q in enumerate(read_queries(identifier)):
            if fmt == "dpr-qa":
                if "answers" not in q:
                    raise PipelineError(f"ir_datasets dataset {identifier!r} has no answers; --qa needs a dataset "
                                        "with answers (e.g. dpr-w100/natural-questions/dev)")
                if q["qid"] != str(i):
                    raise PipelineError(f"ir_datasets dataset {identifier!r}: query ids are not 0..N-1 in order "
                                        f"(found {q['qid']!r} at row {i}), as DPR's QA files number them")
                f.write(f"{q['text']}\t{json.dumps(q['answers'], ensure_ascii=False)}\n")
            else:
                f.write(f"{q['qid']}\t{q['text']}\n")
    return path


def qrels_file(identifier: str) -> Path:
    """The dataset's qrels as a temporary TREC qrels file."""
    name = hashlib.sha1(identifier.encode()).hexdigest()[:12]
    path = _tmpdir() / f"qrels-{name}.trec"
    if path.exists():
        return path
    with open(path, "w", encoding="utf-8") as f:
        for r in read_qrels(identifier):
            f.write(f"{r['qid']} 0 {r['docid']} {r['rel']}\n")
    return path
