"""The field's training files as examples (`data.source` with `data.path`), each streamed (one line, record or
row batch in memory at a time) into the texts form of the examples store (`examples_store.py`):

    tevatron            Tevatron's JSONL: one query a line, {"query_id", "query", "positive_passages": [{"docid",
                        "title", "text"}], "negative_passages": [...]}; the first positive is the example's
                        (as DPR's loader takes its first), every negative a candidate hard negative; titles joined
                        with data.title_join (no title: the text alone)
    msmarco-triples     MS MARCO's triples.train.small.tsv: `query<TAB>positive<TAB>negative` (texts), one example
                        a line (the line number is its query id: the file names none)
    columns             sentence-transformers' column datasets: `anchor`, `positive`, and `negative` or
                        `negative_1` ... `negative_n` (a column of lists of negatives is taken too), as Parquet (a
                        file or a folder of them), JSON Lines, or a `datasets` folder (`save_to_disk`)

Bad input is named by file and line (or row), with its reason: a line that is not JSON or lacks a field, a TSV
line without three columns. A query without a positive, an empty text, or no negative where hard negatives
are asked for (`data.hard_negatives`) is a counted skip, reported with the examples' line. Memory: a line (a
Parquet row group, a datasets batch) at a time, whatever the file's size; the store written as it goes.

    msmarco-id-triples  MS MARCO's `qidpidtriples.train.full.2.tsv`: `qid<TAB>pid_pos<TAB>pid_neg`, one example a line,
                        with `data.corpus` (the ingested collection the pids name) and `data.queries` (qid<TAB>text);
                        the ids form of the store (`msmarco_id_triple_tables`): read twice, first for the pids it
                        names (each passage's text then copied once into the store, looked up by binary search on
                        the pids' integer values), then a block of lines at a time
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from ..errors import InputError
from .manifest import join_title
from .readers import _iter_jsonl  # the readers' JSON Lines: strict UTF-8, errors by line

SOURCES = ("tevatron", "msmarco-triples", "columns")  # the texts form; msmarco-id-triples: the ids form, below


def _skip(skipped: dict, why: str) -> None:
    skipped[why] = skipped.get(why, 0) + 1


def _text(value, path, line, what: str) -> str:
    if not isinstance(value, str):
        raise InputError(path, line, f"{what} is not a string (got {type(value).__name__})")
    return value


def tevatron_examples(path: str | Path, join: str, skipped: dict, need_negatives: bool) -> Iterator[dict]:
    path = Path(path)
    if not path.is_file():
        raise InputError(path, None, "file not found (data.path: Tevatron's training JSONL)")
    for no, obj in _iter_jsonl(path):
        if "query" not in obj or "positive_passages" not in obj:
            raise InputError(path, no, "a Tevatron line has query and positive_passages (and query_id, "
                                       "negative_passages)")

        def text_of(p, what):
            if not isinstance(p, dict) or "text" not in p:
                raise InputError(path, no, f"{what}: a passage is an object with text (and docid, title)")
            return join_title(str(p.get("title") or ""), _text(p["text"], path, no, f"{what} text"), join)

        positives = obj["positive_passages"] or []
        if not positives:
            _skip(skipped, "no_positive")
            continue
        negatives = [text_of(p, "negative_passages") for p in obj.get("negative_passages") or []]
        if need_negatives and not negatives:
            _skip(skipped, "no_negatives")
            continue
        query = _text(obj["query"], path, no, "query")
        positive = text_of(positives[0], "positive_passages")
        if not query.strip() or not positive.strip():
            _skip(skipped, "empty_text")
            continue
        yield {"qid": str(obj.get("query_id", no)), "query": query, "positive": positive,
               "negatives": negatives, "positive_id": str(positives[0].get("docid", "")),
               "negative_ids": [str(p.get("docid", "")) for p in obj.get("negative_passages") or []]}


def msmarco_triples_examples(path: str | Path, skipped: dict, need_negatives: bool) -> Iterator[dict]:
    path = Path(path)
    if not path.is_file():
        raise InputError(path, None, "file not found (data.path: MS MARCO's triples.train.small.tsv)")
    with open(path, encoding="utf-8", errors="strict") as f:
        no = 0
        while True:
            try:
                raw = f.readline()
            except UnicodeDecodeError as e:
                raise InputError(path, no + 1, f"invalid UTF-8 ({e.reason})") from None
            if not raw:
                return
            no += 1
            if not raw.strip():
                continue
            cols = raw.rstrip("\r\n").split("\t")
            if len(cols) != 3:
                raise InputError(path, no, f"{len(cols)} tab-separated columns; a triple is "
                                           "query<TAB>positive<TAB>negative")
            query, positive, negative = cols
            if not query.strip() or not positive.strip():
                _skip(skipped, "empty_text")
                continue
            if need_negatives and not negative.strip():
                _skip(skipped, "no_negatives")
                continue
            yield {"qid": str(no), "query": query, "positive": positive,
                   "negatives": [negative] if negative.strip() else []}


def _negative_columns(names: list[str]) -> list[str]:
    """`negative`, or `negative_1` ... `negative_n` in their number's order (sentence-transformers' layout)."""
    numbered = sorted((n for n in names if n.startswith("negative_") and n[len("negative_"):].isdigit()),
                      key=lambda n: int(n[len("negative_"):]))
    return (["negative"] if "negative" in names else []) + numbered


def _column_rows(path: Path) -> Iterator[tuple[str, list[str], Iterator[tuple[int, dict]]]]:
    """(what to name a row by, the columns, the rows numbered from 1) of a Parquet file or folder, a JSONL file,
    or a `datasets` folder."""
    if path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "state.json").is_file()):
        import datasets

        ds = datasets.load_from_disk(str(path))  # memory-mapped Arrow: rows are read as they are iterated
        if isinstance(ds, datasets.DatasetDict):
            raise InputError(path, None, f"a DatasetDict ({', '.join(ds)}); point data.path at one split's folder")

        def rows():
            for i, row in enumerate(ds, 1):
                yield i, row

        return "row", list(ds.column_names), rows()
    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise InputError(path, None, "file not found (data.path: a Parquet file or folder, a JSONL file, or a "
                                     "datasets folder)")
    if files[0].suffix == ".parquet":
        import pyarrow.parquet as pq

        names = pq.ParquetFile(files[0]).schema_arrow.names

        def rows():
            n = 0
            for f in files:
                for batch in pq.ParquetFile(f).iter_batches(batch_size=1024):
                    for row in batch.to_pylist():
                        n += 1
                        yield n, row

        return "row", names, rows()
    first = None
    with open(files[0], encoding="utf-8-sig") as f:
        for raw in f:
            if raw.strip():
                try:
                    first = json.loads(raw)
                except json.JSONDecodeError as e:
                    raise InputError(files[0], 1, f"not JSON Lines ({e.msg}); columns are read from Parquet, JSONL "
                                                  "or a datasets folder") from None
                break
    if not isinstance(first, dict):
        raise InputError(files[0], 1, "not JSON Lines of objects (empty, or not an object per line)")

    return "line", list(first), _iter_jsonl(files[0])


def columns_examples(path: str | Path, skipped: dict, need_negatives: bool) -> Iterator[dict]:
    path = Path(path)
    if not path.exists():
        raise InputError(path, None, "not found (data.path: a Parquet file or folder, a JSONL file, or a datasets "
                                     "folder with anchor, positive and negative columns)")
    unit, names, rows = _column_rows(path)
    missing = [c for c in ("anchor", "positive") if c not in names]
    if missing:
        raise InputError(path, None, f"no {' or '.join(missing)} column (columns: {', '.join(names)}); "
                                     "sentence-transformers' layout is anchor, positive, negative[_1..n]")
    negs = _negative_columns(names)
    for no, row in rows:
        if "anchor" not in row or "positive" not in row:
            raise InputError(path, no, f"{unit} {no}: no anchor or positive")
        anchor, positive = row["anchor"], row["positive"]
        for what, v in (("anchor", anchor), ("positive", positive)):
            if v is not None and not isinstance(v, str):
                raise InputError(path, no, f"{unit} {no}: {what} is not a string (got {type(v).__name__})")
        if not (anchor or "").strip() or not (positive or "").strip():
            _skip(skipped, "empty_text")
            continue
        negatives = []
        for c in negs:
            v = row.get(c)
            values = v if isinstance(v, list) else [v]
            for x in values:
                if x is None or (isinstance(x, str) and not x.strip()):
                    continue
                if not isinstance(x, str):
                    raise InputError(path, no, f"{unit} {no}: {c} is not a string (got {type(x).__name__})")
                negatives.append(x)
        if need_negatives and not negatives:
            _skip(skipped, "no_negatives")
            continue
        example = {"qid": str(row.get("id", no)), "query": anchor, "positive": positive, "negatives": negatives}
        if "label" in row:  # sentence-transformers' teacher scores: a margin, or [positive, negative_1, ...]
            example.update(_label_scores(row["label"], len(negatives), path, no, unit))
        yield example


def _label_scores(label, n_negatives: int, path, no, unit) -> dict:
    """The teacher's scores a `label` column gives: one number is MarginMSELoss's margin (the positive's score
    minus the one negative's), a list DistillKLDivLoss's scores of the positive and each negative."""
    if isinstance(label, (int, float)) and not isinstance(label, bool):
        if n_negatives != 1:
            raise InputError(path, no, f"{unit} {no}: a label of one number is a margin of one negative; this row "
                                       f"has {n_negatives}")
        return {"teacher_positive": float(label), "teacher_negatives": [0.0]}
    if isinstance(label, list) and all(isinstance(x, (int, float)) for x in label):
        if len(label) != n_negatives + 1:
            raise InputError(path, no, f"{unit} {no}: {len(label)} teacher scores for a positive and "
                                       f"{n_negatives} negatives")
        return {"teacher_positive": float(label[0]), "teacher_negatives": [float(x) for x in label[1:]]}
    raise InputError(path, no, f"{unit} {no}: label is not a number or a list of numbers")


def training_file_examples(source: str, path: str | Path, join: str, skipped: dict,
                           need_negatives: bool) -> Iterator[dict]:
    if source == "tevatron":
        return tevatron_examples(path, join, skipped, need_negatives)
    if source == "msmarco-triples":
        return msmarco_triples_examples(path, skipped, need_negatives)
    return columns_examples(path, skipped, need_negatives)


# ------------------------------------------------------------------------------------------- teacher scores


def read_teacher_scores(path: str | Path, fmt: str) -> tuple[dict, int]:
    """{(qid, docid): score} from a teacher's scores, and the lines read: `trec` (a TREC run with scores: a
    reranker's run is a teacher's scores) or `hofstaetter` (`score_pos<TAB>score_neg<TAB>qid<TAB>pid_pos<TAB>
    pid_neg`, his published MS MARCO teacher files). A malformed line is one error naming the file and line; a
    pair scored twice with two scores too. Pickled score files are never read (unpickling runs code): convert
    them to one of these first. Memory: ~150 bytes per (query, document) pair held."""
    path = Path(path)
    if not path.is_file():
        raise InputError(path, None, "file not found (data.teacher_scores)")
    if path.suffix in (".pkl", ".pickle", ".pt"):
        raise InputError(path, None, "a pickle: never read (unpickling runs whatever code it holds); write the "
                                     "scores as a TREC run or in Hofstätter's TSV layout")
    out: dict = {}
    lines = 0

    def put(key, value, no):
        old = out.get(key)
        if old is not None and old != value:
            raise InputError(path, no, f"query {key[0]!r}, document {key[1]!r} scored twice ({old} and {value})")
        out[key] = value

    with open(path, encoding="utf-8", errors="strict") as f:
        for no, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            lines += 1
            cols = raw.split()
            try:
                if fmt == "trec":
                    if len(cols) != 6:
                        raise ValueError("a TREC run line is qid Q0 docid rank score tag")
                    put((cols[0], cols[2]), float(cols[4]), no)
                else:
                    if len(cols) != 5:
                        raise ValueError("Hofstätter's layout is score_pos<TAB>score_neg<TAB>qid<TAB>pid_pos<TAB>pid_neg")
                    put((cols[2], cols[3]), float(cols[0]), no)
                    put((cols[2], cols[4]), float(cols[1]), no)
            except ValueError as e:
                raise InputError(path, no, str(e) if "layout" in str(e) or "line is" in str(e)
                                 else f"a score that is not a number ({e})") from None
    if not out:
        raise InputError(path, None, "no teacher scores in it")
    return out, lines


def with_teacher(examples: Iterator[dict], teacher: dict, counts: dict) -> Iterator[dict]:
    """Examples (with positive_id, negative_ids) given their teacher scores: a negative without one is dropped
    and counted, an example whose positive has none is a counted skip; the pairs the examples never named are
    counted in `counts["teacher_pairs_unused"]` once the examples are through."""
    used = 0
    for ex in examples:
        key = (ex["qid"], ex.get("positive_id"))
        if key not in teacher:
            counts["no_teacher_score_for_positive"] = counts.get("no_teacher_score_for_positive", 0) + 1
            continue
        used += 1
        negs, scores = [], []
        for text, docid in zip(ex["negatives"], ex.get("negative_ids") or []):
            t = teacher.get((ex["qid"], docid))
            if t is None:
                counts["negatives_without_teacher_score"] = counts.get("negatives_without_teacher_score", 0) + 1
                continue
            used += 1
            negs.append(text)
            scores.append(t)
        yield {**ex, "negatives": negs, "teacher_positive": teacher[key], "teacher_negatives": scores}
    counts["teacher_pairs_unused"] = max(len(teacher) - used, 0)


# ------------------------------------------------------------------------------------------- MS MARCO's id triples


def _id_triple_blocks(path: Path, block: int = 100_000) -> Iterator[tuple[int, list[tuple[str, str, str]]]]:
    """(first line number, [(qid, pid_pos, pid_neg)]) a block of lines at a time; a malformed line is named."""
    rows, first = [], 1
    with open(path, encoding="utf-8", errors="strict") as f:
        for no, raw in enumerate(f, 1):
            cols = raw.split()
            if not cols:
                continue
            if len(cols) != 3:
                raise InputError(path, no, f"{len(cols)} columns; an id triple is qid<TAB>pid_pos<TAB>pid_neg")
            if not rows:
                first = no
            rows.append((cols[0], cols[1], cols[2]))
            if len(rows) >= block:
                yield first, rows
                rows = []
    if rows:
        yield first, rows


def msmarco_id_triple_tables(path: str | Path, corpus: str | Path, queries: str | Path, store_path: str | Path,
                             skipped: dict, counts: dict, teacher: dict | None = None) -> Iterator:
    """Examples of MS MARCO's id triples in the ids form: Arrow tables (qid, query, positive_row, negative_rows)
    whose rows point into the passage store written at `store_path`. A line whose query is not in `queries`, or
    whose pid is not in the corpus, is a counted skip. Memory: the queries' texts, the store's sorted integer
    pids (8 bytes a passage) and one block of 100,000 lines."""
    import pyarrow as pa

    from .corpus import PassageStore
    from .readers import load_queries

    path = Path(path)
    if not path.is_file():
        raise InputError(path, None, "file not found (data.path: MS MARCO's qidpidtriples.train.full.2.tsv)")
    qtexts = load_queries(queries)
    pids: set[str] = set()
    for _, rows in _id_triple_blocks(path):  # first pass: the passages the triples name
        for _, p, n in rows:
            pids.add(p)
            pids.add(n)
    store = PassageStore(corpus, pa.array(sorted(pids), pa.string()), store_path, join=None)
    counts["passages"] = len(store)
    del pids
    for _, rows in _id_triple_blocks(path):
        keep = [r for r in rows if r[0] in qtexts]
        if len(keep) < len(rows):
            skipped["query_not_in_queries"] = skipped.get("query_not_in_queries", 0) + len(rows) - len(keep)
        if not keep:
            continue
        pos_rows, pos_found = store.rows([r[1] for r in keep])
        neg_rows, neg_found = store.rows([r[2] for r in keep])
        ok = pos_found & neg_found
        missing = int((~ok).sum())
        if missing:
            skipped["pid_not_in_corpus"] = skipped.get("pid_not_in_corpus", 0) + missing
        idx = [i for i in range(len(keep)) if ok[i]]
        if teacher is not None:  # a teacher's scores of both passages (Hofstätter's file names these triples)
            scored = [i for i in idx if (keep[i][0], keep[i][1]) in teacher and (keep[i][0], keep[i][2]) in teacher]
            if len(scored) < len(idx):
                skipped["no_teacher_score"] = skipped.get("no_teacher_score", 0) + len(idx) - len(scored)
            idx = scored
        if not idx:
            continue
        columns = {"qid": pa.array([keep[i][0] for i in idx], pa.string()),
                   "query": pa.array([qtexts[keep[i][0]] for i in idx], pa.string()),
                   "positive_row": pa.array(pos_rows[idx], pa.int64()),
                   "negative_rows": pa.array([[int(neg_rows[i])] for i in idx], pa.list_(pa.int64()))}
        if teacher is not None:
            columns["teacher_positive"] = pa.array([teacher[(keep[i][0], keep[i][1])] for i in idx], pa.float64())
            columns["teacher_negatives"] = pa.array([[teacher[(keep[i][0], keep[i][2])]] for i in idx],
                                                    pa.list_(pa.float64()))
        yield pa.table(columns)
