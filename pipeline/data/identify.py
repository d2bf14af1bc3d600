"""Is this the dataset a reproduction cell names? Its `identify` counts, counted on the files given.

A matrix dataset declares counts that identify its files (`identify: {passages: 3633, test_queries: 323}`);
`pipeline reproduce run` counts them on the folder or file given with `--data` before the first command, so
the wrong dataset, a truncated corpus or a missing split is one line naming the mismatch, not a figure
recorded under the wrong name.

What can be counted, by layout:
- a BEIR folder (corpus.jsonl, queries.jsonl, qrels/*.tsv): `passages` (corpus.jsonl's records), `queries`
  (queries.jsonl's records), `<split>_queries` (the distinct queries qrels/<split>.tsv judges),
  `judged_queries` (those of qrels/test.tsv) and `judgements` (the lines of qrels/test.tsv);
- a single file: `passages`, `queries`, `questions`, `pairs` (its non-empty lines, less a header line when the
  file is a CSV/TSV whose first line names columns), `judgements` (a qrels file's lines), `questions_in_json`
  (the records of a JSON array, DPR's retriever files: streamed, never loaded whole);
- in a BEIR folder, also `<split>_judgements_sha256`: the digest of qrels/<split>.tsv's sorted (query, document,
  grade) triples (`judgements_digest`: the same judgements in any order or layout), so a copy
  whose counts agree but whose judgements were shuffled between queries is not taken for the dataset;
- anything else (authorship records, models, an ir_datasets identifier): nothing to count. A key that no layout
  counts is refused when the matrix loads (`countable`): a misspelt key would otherwise turn its check off.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

_SPLIT_QUERIES = re.compile(r"^([a-z0-9]+)_queries$")
_HEADER_WORDS = {"id", "_id", "qid", "query-id", "query_id", "corpus-id", "score", "text", "title", "question",
                 "answers", "sentence1", "sentence2", "sent0", "sent1", "hard_neg", "pair_id", "genre",
                 "relatedness_score", "entailment_judgment"}


def _lines(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                n += 1
    return n


def _has_header(path: Path) -> bool:
    with open(path, "r", encoding="utf-8-sig", errors="replace") as f:
        first = f.readline().strip().lower()
    cells = [c.strip().strip('"') for c in re.split(r"[\t,]", first)]
    return bool(cells) and sum(c in _HEADER_WORDS for c in cells) >= max(1, len(cells) // 2)


def _qrels_tsv(folder: Path, split: str) -> Path | None:
    for name in (f"{split}.tsv", f"{split}.trec", f"{split}.txt"):
        p = folder / "qrels" / name
        if p.is_file():
            return p
    return None


def _qrels_queries(path: Path) -> set[str]:
    qids = set()
    with open(path, "r", encoding="utf-8-sig", errors="replace") as f:
        for i, line in enumerate(f):
            cells = line.split()
            if not cells or (i == 0 and cells[0].lower() in ("query-id", "qid", "query_id")):
                continue
            qids.add(cells[0])
    return qids


def _qrels_lines(path: Path) -> int:
    return _lines(path) - (1 if _has_header(path) else 0)


FOLDER_KEYS = {"passages", "queries", "judged_queries", "judgements"}
FILE_KEYS = {"passages", "queries", "questions", "pairs", "judgements", "questions_in_json"}
_SPLIT_DIGEST = re.compile(r"^([a-z0-9]+)_judgements_sha256$")


def countable(key: str, layout: str) -> bool:
    """Whether `count` counts `key` for a dataset of this layout (a BEIR folder when its layout says so, else a
    single file)."""
    if str(layout).startswith("a BEIR folder"):
        return key in FOLDER_KEYS or bool(_SPLIT_QUERIES.match(key) or _SPLIT_DIGEST.match(key))
    return key in FILE_KEYS


def _json_records(path: Path) -> int:
    """The records of the JSON array a file holds, streamed (DPR's training files are gigabytes)."""
    import ijson

    n = 0
    with open(path, "rb") as f:
        for prefix, event, _ in ijson.parse(f):
            if prefix == "item" and event in ("start_map", "start_array", "string", "number", "boolean", "null"):
                n += 1
    return n


_DIGESTS: dict = {}  # (path, size, mtime) -> digest: a result is written after every run, each run's key read


def judgements_digest(path: Path) -> str | None:
    """The judgements' digest: their sorted (qid, docid, grade) triples, whatever the file's layout and order
    (None where there is no such file; a malformed one is read_qrels's error, naming its line)."""
    from .readers import read_qrels

    try:
        st = Path(path).stat()
        key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    except OSError:
        return None
    if key in _DIGESTS:
        return _DIGESTS[key]
    triples = sorted(f"{r['qid']}\t{r['docid']}\t{int(r['rel'])}" for r in read_qrels(path))  # bad: file:line
    _DIGESTS[key] = hashlib.sha256("\n".join(triples).encode()).hexdigest()[:16]
    return _DIGESTS[key]


def digest(path: str | Path, key: str) -> str | None:
    """The judgements digest `key` (`<split>_judgements_sha256`) of the BEIR folder at `path`, or None."""
    m = _SPLIT_DIGEST.match(key)
    path = Path(path)
    if not m or not path.is_dir():
        return None
    qrels = _qrels_tsv(path, m.group(1))
    return judgements_digest(qrels) if qrels is not None else "missing"


def count(path: str | Path, key: str) -> int | None:
    """The count `key` of the data at `path`, or None when this layout does not give it."""
    path = Path(path)
    if path.is_dir():
        corpus = path / "corpus.jsonl"
        if not corpus.is_file():  # a folder where a BEIR folder belongs: its counts are 0, a mismatch said as such
            return 0 if key in ("passages", "queries", "judgements", "judged_queries") or _SPLIT_QUERIES.match(key) \
                else None
        if key == "passages":
            return _lines(corpus)
        if key == "queries":
            q = path / "queries.jsonl"
            return _lines(q) if q.is_file() else None
        m = _SPLIT_QUERIES.match(key)
        split = m.group(1) if m else ("test" if key in ("judged_queries", "judgements") else None)
        if split is None or split == "judged":
            split = "test" if key == "judged_queries" else split
        if split is None:
            return None
        qrels = _qrels_tsv(path, split)
        if qrels is None:
            return 0  # the split is missing: a mismatch, not "not counted"
        return _qrels_lines(qrels) if key == "judgements" else len(_qrels_queries(qrels))
    if path.is_file() and key in FILE_KEYS:
        if key == "judgements":
            return _qrels_lines(path)
        if key == "questions_in_json":
            try:
                return _json_records(path)
            except Exception:  # not a JSON array: a mismatch, said as a count of 0
                return 0
        return _lines(path) - (1 if _has_header(path) else 0)
    return None


def check_identity(name: str, spec: dict, location: str) -> list[str]:
    """Compare the declared `identify` counts of dataset `name` with `location`'s. Returns the lines of what was
    not counted (said, not fatal); raises a PipelineError naming every mismatch."""
    from ..errors import PipelineError

    expected = spec.get("identify") or {}
    if not expected:
        return []
    if not Path(location).exists():  # an ir_datasets identifier: ir_datasets checks its own files' digests
        return [f"dataset {name}: {location} is an ir_datasets identifier; its counts are not checked here"]
    wrong, unchecked = [], []
    for key, want in expected.items():
        if _SPLIT_DIGEST.match(key):
            got = digest(location, key)
            if got is None:
                unchecked.append(key)
            elif got != want:
                wrong.append(f"{key} {got} (expected {want}: other judgements than the dataset's)")
            continue
        if not isinstance(want, int):
            unchecked.append(key)
            continue
        got = count(location, key)
        if got is None:
            unchecked.append(key)
        elif got != want:
            wrong.append(f"{key} {got:,} (expected {want:,})")
    if wrong:
        raise PipelineError(f"--data {name}={location}: not the dataset the cell names ({spec.get('layout')}): "
                            + "; ".join(wrong) + ". Give the full, unmodified files of " + name
                            + (f" ({spec['get']})" if spec.get("get") else ""))
    return [f"dataset {name}: {', '.join(unchecked)} not counted for this layout"] if unchecked else []
