"""Streaming readers for the corpus, query, qrels and QA formats of the field.

Every reader is a generator: it never holds the whole file in memory. Malformed
input raises `InputError` naming the file, the (1-based) line and the reason.
Records are plain dicts; corpus records are `{"pid", "title", "text", "line"}`.
"""

from __future__ import annotations

import ast
import contextlib
import csv
import gzip
import json
import logging
import sys
import zlib
from pathlib import Path
from typing import Iterator

from ..errors import InputError
from .checks import check_id, check_no_bare_cr, check_text, value_id

csv.field_size_limit(sys.maxsize)

CORPUS_FORMATS = ("dpr-wiki", "msmarco", "msmarco-titled", "beir", "hf", "irds")  # irds: an ir_datasets identifier


def _open_binary(path: Path):
    """(stream, raw file) for reading bytes; gzip is recognised by its magic bytes or a .gz name."""
    if not path.exists():
        raise InputError(path, None, "file not found")
    if path.is_dir():
        raise InputError(path, None, "is a folder; expected a file")
    try:
        raw = open(path, "rb")
    except OSError as e:
        raise InputError(path, None, f"cannot read: {e.strerror or e}") from None
    try:
        magic = raw.read(2)
        raw.seek(0)
    except OSError as e:
        raw.close()
        raise InputError(path, None, f"cannot read: {e.strerror or e}") from None
    if magic == b"\x1f\x8b" or path.suffix == ".gz":
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    return raw, raw


def iter_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """Yield (line_number, text) with strict UTF-8 decoding and the LF or CRLF ending stripped.

    A CR anywhere else in a line is an error (CR-only line endings would merge records).

    A NUL byte is an error: no format read here carries one, and it usually
    means a binary or corrupt file. Truncated or fake gzip data (and any read
    error) is an InputError naming the first line that could not be read.
    """
    path = Path(path)
    stream, raw_file = _open_binary(path)
    no = 0
    try:
        with raw_file, stream:
            it = iter(stream)
            while True:
                try:
                    raw = next(it)
                except StopIteration:
                    break
                no += 1
                if b"\x00" in raw:
                    raise InputError(path, no, f"NUL byte at byte {raw.index(0)} of the line (a binary or corrupt "
                                               "file?); remove NUL bytes first, e.g. tr -d '\\000'")
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise InputError(path, no, f"invalid UTF-8 at byte {e.start} of the line: "
                                               f"{raw[max(0, e.start - 10):e.end + 10]!r}") from None
                yield no, check_no_bare_cr(path, no, text.removesuffix("\n").removesuffix("\r"))
    except (OSError, EOFError, zlib.error) as e:
        if stream is not raw_file:
            raise InputError(path, no + 1, f"corrupt or truncated gzip data: {e}") from None
        raise InputError(path, no + 1, f"cannot read: {getattr(e, 'strerror', None) or e}") from None


def _strip_bom(text: str) -> str:
    return text[1:] if text.startswith("\ufeff") else text


# --------------------------------------------------------------------------- corpora


def read_dpr_wiki(path: str | Path) -> Iterator[dict]:
    """DPR Wikipedia passages: TSV with header `id\\ttext\\ttitle`, one passage per line.

    A record never spans lines. DPR's `psgs_w100.tsv` wraps some fields whole in
    double quotes, csv-style (an inner quote doubled); such a field is unquoted. A quote
    that opens a field and does not close on the same line (or text after a
    closing quote) is an error naming the line, never a reason to merge the
    following lines into one passage. Quotes inside an unquoted field are kept.
    """
    path = Path(path)
    lines = iter_lines(path)
    first = next(lines, None)
    if first is None:
        raise InputError(path, 1, "empty file; expected header 'id\\ttext\\ttitle'")
    header = [h.strip().lower() for h in _strip_bom(first[1]).split("\t")]
    if header != ["id", "text", "title"]:
        raise InputError(path, 1, f"expected header 'id\\ttext\\ttitle', found {header!r}")
    for no, line in lines:
        try:
            row = next(csv.reader([line], delimiter="\t", quotechar='"', strict=True), [])
        except csv.Error as e:
            raise InputError(path, no, f"malformed double quotes ({e}): a quoted field must close on the same "
                                       'line, and a quote inside a quoted field is written ""') from None
        if len(row) != 3:
            raise InputError(path, no, f"expected 3 tab-separated columns (id, text, title), found {len(row)}")
        pid, text, title = row
        yield {"pid": check_id(path, no, pid), "title": check_text(path, no, title, "title"),
               "text": check_text(path, no, text), "line": no}


def _tab_rows(path: Path, columns: tuple[str, ...], skip_blank: bool = False) -> Iterator[tuple[int, list[str]]]:
    """(line, fields) of a headerless TSV whose every line has exactly len(columns) fields."""
    for no, line in iter_lines(path):
        if no == 1:
            line = _strip_bom(line)
        if skip_blank and not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != len(columns):
            raise InputError(path, no, f"expected {len(columns)} tab-separated columns ({', '.join(columns)}), "
                                       f"found {len(parts)}")
        yield no, parts


def read_msmarco(path: str | Path) -> Iterator[dict]:
    """Official MS MARCO passage collection: `pid\\ttext`, no header."""
    path = Path(path)
    for no, parts in _tab_rows(path, ("pid", "text")):
        yield {"pid": check_id(path, no, parts[0]), "title": "", "text": check_text(path, no, parts[1]), "line": no}


def read_msmarco_titled(path: str | Path) -> Iterator[dict]:
    """The "titled" MS MARCO collection (RocketQA/Tevatron): `pid\\ttitle\\ttext`."""
    path = Path(path)
    for no, parts in _tab_rows(path, ("pid", "title", "text")):
        title = "" if parts[1].strip() == "-" else check_text(path, no, parts[1], "title")
        yield {"pid": check_id(path, no, parts[0]), "title": title, "text": check_text(path, no, parts[2]), "line": no}


def _iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    for no, line in iter_lines(path):
        if no == 1:
            line = _strip_bom(line)
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(path, no, f"invalid JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(obj, dict):
            raise InputError(path, no, "expected a JSON object")
        yield no, obj


def read_beir_corpus(path: str | Path) -> Iterator[dict]:
    """BEIR `corpus.jsonl`: `{"_id", "title", "text"}` per line (title optional)."""
    path = Path(path)
    for no, obj in _iter_jsonl(path):
        if "_id" not in obj:
            raise InputError(path, no, "missing field '_id'")
        if "text" not in obj:
            raise InputError(path, no, "missing field 'text'")
        text, title = obj["text"], obj.get("title") or ""
        if not isinstance(text, str) or not isinstance(title, str):
            raise InputError(path, no, "fields 'text' and 'title' must be strings")
        yield {"pid": value_id(path, no, obj["_id"]), "title": check_text(path, no, title, "title"),
               "text": check_text(path, no, text), "line": no}


def read_hf(path: str | Path, id_field: str = "id", title_field: str | None = "title",
            text_field: str = "text", split: str = "train") -> Iterator[dict]:
    """Hugging Face `datasets` data: a `save_to_disk` folder, or JSON/CSV/Parquet files.

    Folders written by `save_to_disk` are memory-mapped; files are read with
    `datasets`' builders in streaming mode. `line` is the 1-based row number.
    """
    import datasets

    path = Path(path)
    if not path.exists():
        raise InputError(path, None, "file or folder not found")
    if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
        try:
            with _quiet_datasets():
                ds = datasets.load_from_disk(str(path))
        except Exception as e:  # a damaged save_to_disk folder: datasets/pyarrow raise many types
            raise InputError(path, None, f"cannot load this save_to_disk folder: {_first_line(e)}") from None
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise InputError(path, None, f"split {split!r} not in {list(ds)}")
            ds = ds[split]
    else:
        suffix = path.suffix.lower().lstrip(".")
        builder = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet", "tsv": "csv"}.get(suffix)
        if builder is None:
            raise InputError(path, None, "expected a save_to_disk folder or a .jsonl/.json/.csv/.tsv/.parquet file")
        if path.is_dir():
            raise InputError(path, None, "is a folder but not a save_to_disk folder (no dataset_info.json)")
        kwargs = {"delimiter": "\t"} if suffix == "tsv" else {}
        try:
            with _quiet_datasets():
                ds = datasets.load_dataset(builder, data_files=str(path), split="train", streaming=True, **kwargs)
        except Exception as e:
            raise InputError(path, None, f"cannot read as {builder}: {_first_line(e)}") from None
    columns = getattr(ds, "column_names", None)
    if columns is not None:
        for need in [id_field, text_field]:
            if need not in columns:
                raise InputError(path, None, f"missing column {need!r}; columns are {columns}")
    for no, row in _rows_or_error(path, ds):
        if id_field not in row or text_field not in row:
            raise InputError(path, no, f"missing column {id_field!r} or {text_field!r}")
        if row[id_field] is None:
            raise InputError(path, no, f"missing value in column {id_field!r}")
        title = row.get(title_field) if title_field else ""
        text = row[text_field]
        if text is None:
            text = ""
        if not isinstance(text, str):
            raise InputError(path, no, f"column {text_field!r} must be a string, got {type(text).__name__}")
        if title is not None and not isinstance(title, str):
            raise InputError(path, no, f"column {title_field!r} must be a string, got {type(title).__name__}")
        yield {"pid": value_id(path, no, row[id_field], field=f"column {id_field!r}"), "title": check_text(path, no, title or "", "title"),
               "text": check_text(path, no, text), "line": no}


@contextlib.contextmanager
def _quiet_datasets():
    """datasets logs its own copy of a parse error (with a traceback); ours names the file instead."""
    logger = logging.getLogger("datasets")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _first_line(e: BaseException) -> str:
    cause = e.__cause__ or e.__context__
    text = str(e).strip() or type(e).__name__
    if cause is not None and str(cause).strip():  # datasets wraps the parser's message
        text = f"{text.splitlines()[0]} ({str(cause).strip().splitlines()[0]})"
    return text.splitlines()[0][:300]


def _rows_or_error(path: Path, ds) -> Iterator[tuple[int, dict]]:
    """(row number, row); a parse error of the underlying file is an InputError after the last good row."""
    it = iter(ds)
    no = 0
    while True:
        try:
            with _quiet_datasets():
                row = next(it)
        except StopIteration:
            return
        except Exception as e:
            raise InputError(path, None, f"cannot read row {no + 1} or a later one (rows are read in blocks): "
                                         f"{_first_line(e)}") from None
        no += 1
        yield no, row


def corpus_reader(fmt: str, path: str | Path, **kwargs) -> Iterator[dict]:
    readers = {
        "dpr-wiki": read_dpr_wiki,
        "msmarco": read_msmarco,
        "msmarco-titled": read_msmarco_titled,
        "beir": read_beir_corpus,
        "hf": read_hf,
        "irds": _read_irds_docs,
    }
    if fmt not in readers:
        raise InputError(path, None, f"unknown corpus format {fmt!r}; choose from {', '.join(CORPUS_FORMATS)}")
    if fmt != "hf" and kwargs:
        raise InputError(path, None, f"options {sorted(kwargs)} only apply to the 'hf' format")
    if fmt == "beir" and Path(path).is_dir():
        path = Path(path) / "corpus.jsonl"
    return readers[fmt](path, **kwargs)


def _read_irds_docs(identifier) -> Iterator[dict]:
    from . import irds

    return irds.read_docs(str(identifier))


# --------------------------------------------------------------------------- queries


def read_queries_tsv(path: str | Path) -> Iterator[dict]:
    """Queries TSV: `qid\\ttext`, no header."""
    path = Path(path)
    for no, parts in _tab_rows(path, ("qid", "text"), skip_blank=True):
        if not parts[1].strip():
            raise InputError(path, no, "empty query text")
        yield {"qid": check_id(path, no, parts[0], "query id"), "text": parts[1], "line": no}


def read_beir_queries(path: str | Path) -> Iterator[dict]:
    """BEIR `queries.jsonl`: `{"_id", "text"}`."""
    path = Path(path)
    for no, obj in _iter_jsonl(path):
        if "_id" not in obj or "text" not in obj:
            raise InputError(path, no, "expected fields '_id' and 'text'")
        if not isinstance(obj["text"], str):
            raise InputError(path, no, f"field 'text' must be a string, got {type(obj['text']).__name__}")
        if not obj["text"].strip():
            raise InputError(path, no, "empty query text")
        yield {"qid": value_id(path, no, obj["_id"], "query id"), "text": obj["text"], "line": no}


def _parse_answers(path, no, raw: str) -> list[str]:
    raw = raw.strip()
    try:
        answers = json.loads(raw)
    except json.JSONDecodeError:
        try:
            answers = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            raise InputError(path, no, f"answers column is not a list literal: {raw[:80]!r}") from None
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise InputError(path, no, "answers must be a list of strings")
    if not answers:
        raise InputError(path, no, "empty answer list")
    return answers


def read_dpr_qa(path: str | Path) -> Iterator[dict]:
    """DPR QA files (`nq-test.csv`): `question\\t["answer", ...]`; qid is the 0-based row index."""
    path = Path(path)
    idx = 0
    for no, parts in _tab_rows(path, ("question", "answers"), skip_blank=True):
        question = parts[0].strip()
        if len(question) >= 2 and question[0] == question[-1] == '"':
            question = question[1:-1].replace('""', '"')
        if not question:
            raise InputError(path, no, "empty question")
        yield {"qid": str(idx), "text": question, "answers": _parse_answers(path, no, parts[1]), "line": no}
        idx += 1


def read_queries(path: str | Path, fmt: str = "auto") -> Iterator[dict]:
    """Queries from TSV (`qid\\ttext`), BEIR jsonl, a DPR QA file (`fmt='dpr-qa'`), or an
    ir_datasets identifier (an existing path always wins; see data/irds.py)."""
    if _is_irds(path):
        from . import irds

        return irds.read_queries(str(path))
    path = Path(path)
    if fmt == "auto":
        fmt = "beir" if path.name.endswith((".jsonl", ".jsonl.gz")) else "tsv"
    return {"tsv": read_queries_tsv, "beir": read_beir_queries, "dpr-qa": read_dpr_qa}[fmt](path)


# --------------------------------------------------------------------------- qrels


def _whitespace_rows(path: Path, n: int, layout: str) -> Iterator[tuple[int, list[str]]]:
    """Non-blank lines of a whitespace-separated TREC file, each with exactly n columns."""
    for no, line in iter_lines(path):
        if no == 1:
            line = _strip_bom(line)  # else the first id would carry it
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != n:
            raise InputError(path, no, f"expected {n} columns '{layout}', found {len(parts)}")
        yield no, parts


def _number(path: Path, no: int, value: str, cast, what: str):
    try:
        return cast(value)
    except ValueError:
        kind = "an integer" if cast is int else "a number"
        raise InputError(path, no, f"{what} {value!r} is not {kind}") from None


def read_trec_qrels(path: str | Path) -> Iterator[dict]:
    """TREC qrels: `qid 0 docid rel` (whitespace-separated)."""
    path = Path(path)
    for no, parts in _whitespace_rows(path, 4, "qid 0 docid rel"):
        rel = _number(path, no, parts[3], int, "relevance")
        yield {"qid": parts[0], "docid": parts[2], "rel": rel, "line": no}


def read_beir_qrels(path: str | Path) -> Iterator[dict]:
    """BEIR qrels: TSV with header `query-id\\tcorpus-id\\tscore` (CRLF tolerated)."""
    path = Path(path)
    for no, line in iter_lines(path):
        if no == 1:
            if _strip_bom(line).split("\t")[:3] != ["query-id", "corpus-id", "score"]:
                raise InputError(path, 1, f"expected header 'query-id\\tcorpus-id\\tscore', found {line!r}")
            continue
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 3:
            raise InputError(path, no, f"expected 3 tab-separated columns, found {len(parts)}")
        try:
            rel = int(parts[2])
        except ValueError:
            raise InputError(path, no, f"score {parts[2]!r} is not an integer") from None
        yield {"qid": check_id(path, no, parts[0], "query id"), "docid": check_id(path, no, parts[1], "corpus id"), "rel": rel, "line": no}


def read_qrels(path: str | Path, fmt: str = "auto") -> Iterator[dict]:
    """Qrels in TREC or BEIR format (auto: BEIR when the first line is its header), or an
    ir_datasets identifier (an existing path always wins)."""
    if _is_irds(path):
        from . import irds

        return irds.read_qrels(str(path))
    path = Path(path)
    if fmt == "auto":
        first = next(iter_lines(path), (1, ""))[1]
        fmt = "beir" if _strip_bom(first).startswith("query-id") else "trec"
    return {"trec": read_trec_qrels, "beir": read_beir_qrels}[fmt](path)


def _is_irds(spec) -> bool:
    """An ir_datasets identifier given as a str or IrdsRef (a Path is always a file; a path that exists wins)."""
    if isinstance(spec, Path):
        return False
    from . import irds

    return irds.is_identifier(spec)


def load_qrels(path: str | Path, fmt: str = "auto") -> dict[str, dict[str, int]]:
    """Qrels as `{qid: {docid: rel}}`; a repeated (qid, docid) pair is an error."""
    out: dict[str, dict[str, int]] = {}
    for r in read_qrels(path, fmt):
        docs = out.setdefault(r["qid"], {})
        if r["docid"] in docs:
            raise InputError(path, r["line"], f"duplicate judgement for query {r['qid']!r}, doc {r['docid']!r}")
        docs[r["docid"]] = r["rel"]
    return out


def load_queries(path: str | Path, fmt: str = "auto") -> dict[str, str]:
    """Queries as `{qid: text}`; a repeated qid is an error."""
    out: dict[str, str] = {}
    for r in read_queries(path, fmt):
        if r["qid"] in out:
            raise InputError(path, r["line"], f"duplicate query id {r['qid']!r}")
        out[r["qid"]] = r["text"]
    return out


# --------------------------------------------------------------------------- runs


def read_run_file(path: str | Path) -> Iterator[dict]:
    """TREC run `qid Q0 docid rank score tag` -> {qid, docid, rank, score, line}."""
    path = Path(path)
    for no, parts in _whitespace_rows(path, 6, "qid Q0 docid rank score tag"):
        score = _number(path, no, parts[4], float, "score")
        rank = _number(path, no, parts[3], int, "rank")
        yield {"qid": parts[0], "docid": parts[2], "rank": rank, "score": score, "line": no}
