"""Authorship records `(text, author, topic)` and the cross-topic-open-set split (docs/METHODS.md §4).

Reading: CSV (header row), JSONL (one object a line) or Parquet, column names configurable.
Every record needs a non-empty text, an author and a topic; a missing field, an empty
text, invalid UTF-8 or a malformed line is an `InputError` naming the file and the line
(for Parquet, the line is the 1-based row number).

The split (ARR paper §3, A.2), deterministic given `seed`:

1. Rank authors and topics by sample count (ties by name). The candidates for training
   are the records whose author is among the top `author_fraction` of authors and whose
   topic is among the top `topic_fraction` of topics (ceil, at least one of each).
2. `train_fraction` of the candidate records, a seeded random sample, form the training
   portion; its authors are the *seen* authors, its topics the *seen* topics.
3. `cross_topic_test`: every record with an unseen author and an unseen topic;
   `same_topic_test`: every record with an unseen author and a seen topic.
4. `val`: a seeded random sample of the training portion, as large as the cross-topic
   test, taken out of training (the paper samples validation from the training data, so
   its authors are seen ones). The rest is `train`.

Candidate records left out of the training portion, and records of seen authors on
other topics, are in no split (counted in the manifest as `unused`). Every split keeps the
source file order (evaluation takes each author's first half, in file order, as queries).

    <out>/train.parquet, val.parquet, cross_topic_test.parquet, same_topic_test.parquet
          columns text, author, topic
    <out>/manifest.json   thresholds, seed, columns, counts per split, source sha256; written last
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import PosInt, Section, Seed, UnitFraction
from ..errors import ConfigError, InputError, PipelineError
from .checks import check_no_bare_cr

# the loss names that train on authorship records (ARR, docs/METHODS.md §4)
AUTHORSHIP_METHODS = ("arr_cl", "arr_mll", "arr")
SPLITS = ("train", "val", "cross_topic_test", "same_topic_test")
TEST_SPLITS = ("cross_topic_test", "same_topic_test")
MANIFEST = "manifest.json"
FORMATS = ("auto", "csv", "jsonl", "parquet")


@dataclass(frozen=True)
class SplitConfig(Section):
    """`authorship:` settings of `pipeline authorship split` (defaults = the paper's A.2)."""

    author_fraction: UnitFraction = 0.10
    topic_fraction: UnitFraction = 0.20
    train_fraction: UnitFraction = 0.80
    seed: Seed = 0
    text_column: str = "text"
    author_column: str = "author"
    topic_column: str = "topic"
    format: str = "auto"
    min_test_queries: PosInt = 2   # a test split must give at least this many queries (authors with >= 2 texts)

    SECTION = "authorship"

    def validate(self) -> None:
        if self.format not in FORMATS:
            raise ConfigError(f"authorship.format must be one of {', '.join(FORMATS)}, got {self.format!r}")


# ---------------------------------------------------------------------------- reading
def _format(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    name = path.name.lower()
    for suffix, f in ((".parquet", "parquet"), (".jsonl", "jsonl"), (".ndjson", "jsonl"), (".json", "jsonl"),
                      (".csv", "csv")):
        if name.endswith(suffix):
            return f
    raise InputError(path, None, "cannot tell the format from the file name; give authorship.format=csv|jsonl|parquet")


def _record(path: Path, line: int, row: dict, cols: tuple[str, str, str]) -> dict:
    out = {}
    for key, col in zip(("text", "author", "topic"), cols):
        if col not in row or row[col] is None:
            raise InputError(path, line, f"missing field {col!r} ({key})")
        v = row[col]
        if isinstance(v, (int, float)) and not isinstance(v, bool) and key != "text":
            v = str(v)
        if not isinstance(v, str):
            raise InputError(path, line, f"field {col!r} ({key}) must be a string, got {type(v).__name__}")
        if "\x00" in v:
            raise InputError(path, line, f"field {col!r} ({key}) contains a NUL byte")
        if not v.strip():
            raise InputError(path, line, f"empty {key} in field {col!r}")
        out[key] = v if key == "text" else v.strip()
    return out


def _decoded_lines(path: Path):
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise InputError(path, n, f"invalid UTF-8 ({e.reason} at byte {e.start})") from None
            check_no_bare_cr(path, n, line.removesuffix("\n").removesuffix("\r"))
            yield n, line


def read_records(path: str | Path, cfg: SplitConfig | None = None) -> list[dict]:
    """All records of `path` as [{"text", "author", "topic"}] in file order."""
    cfg = cfg or SplitConfig()
    path = Path(path)
    if not path.is_file():
        raise InputError(path, None, "file not found" if not path.exists() else "not a file")
    cols = (cfg.text_column, cfg.author_column, cfg.topic_column)
    fmt = _format(path, cfg.format)
    out: list[dict] = []
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as e:
            raise InputError(path, None, f"not a readable Parquet file ({e})") from None
        missing = [c for c in cols if c not in table.column_names]
        if missing:
            raise InputError(path, None, f"missing column(s) {', '.join(map(repr, missing))}; "
                                         f"columns: {', '.join(table.column_names)}")
        for i, row in enumerate(table.select(list(dict.fromkeys(cols))).to_pylist(), 1):
            out.append(_record(path, i, row, cols))
    elif fmt == "jsonl":
        for n, line in _decoded_lines(path):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(path, n, f"invalid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise InputError(path, n, f"expected a JSON object, got {type(obj).__name__}")
            out.append(_record(path, n, obj, cols))
    else:
        # decode line by line first so a bad byte names its line; csv then sees clean text
        text = "".join(line for _, line in _decoded_lines(path))
        reader = csv.DictReader(io.StringIO(text, newline=""))
        if reader.fieldnames is None:
            raise InputError(path, 1, "empty CSV file (no header row)")
        missing = [c for c in cols if c not in reader.fieldnames]
        if missing:
            raise InputError(path, 1, f"missing column(s) {', '.join(map(repr, missing))} in the header; "
                                      f"columns: {', '.join(reader.fieldnames)}")
        start = 2
        try:
            for row in reader:
                if None in row:
                    raise InputError(path, start, "more fields than the header")
                out.append(_record(path, start, row, cols))
                start = reader.line_num + 1
        except csv.Error as e:
            raise InputError(path, reader.line_num, f"malformed CSV ({e})") from None
    if not out:
        raise InputError(path, None, "no records")
    return out


# ---------------------------------------------------------------------------- split
def _top(counts: Counter, fraction: float) -> list:
    ranked = sorted(counts, key=lambda k: (-counts[k], k))
    return ranked[:max(1, math.ceil(fraction * len(ranked)))]


def _queries(records: list[dict]) -> int:
    """How many queries evaluation takes: int(0.5 n) per author with n >= 2."""
    c = Counter(r["author"] for r in records)
    return sum(int(0.5 * n) for n in c.values() if n >= 2)


def split_records(records: list[dict], cfg: SplitConfig) -> tuple[dict[str, list[dict]], dict]:
    """The four splits (records in source order) and their statistics (see the module doc)."""
    by_author = Counter(r["author"] for r in records)
    by_topic = Counter(r["topic"] for r in records)
    top_authors, top_topics = set(_top(by_author, cfg.author_fraction)), set(_top(by_topic, cfg.topic_fraction))
    cand = [i for i, r in enumerate(records) if r["author"] in top_authors and r["topic"] in top_topics]
    rng = random.Random(cfg.seed)
    n_train = round(cfg.train_fraction * len(cand))
    portion = sorted(rng.sample(cand, n_train))
    if not portion:
        raise PipelineError(f"the training portion is empty ({len(cand)} candidate records from the top "
                            f"{cfg.author_fraction:g} of authors x top {cfg.topic_fraction:g} of topics): raise "
                            "authorship.author_fraction / authorship.topic_fraction / authorship.train_fraction")
    seen_a = {records[i]["author"] for i in portion}
    seen_t = {records[i]["topic"] for i in portion}
    cross = [i for i, r in enumerate(records) if r["author"] not in seen_a and r["topic"] not in seen_t]
    same = [i for i, r in enumerate(records) if r["author"] not in seen_a and r["topic"] in seen_t]
    n_val = len(cross)
    if n_val >= len(portion):
        raise PipelineError(f"validation must be as large as the cross-topic test ({n_val} records) but the training "
                            f"portion has only {len(portion)}: raise authorship.author_fraction or "
                            "authorship.topic_fraction (a larger training portion, fewer cross-topic records)")
    val = set(rng.sample(portion, n_val))
    parts = {"train": [i for i in portion if i not in val], "val": sorted(val), "cross_topic_test": cross,
             "same_topic_test": same}
    splits = {k: [records[i] for i in v] for k, v in parts.items()}
    hints = {"cross_topic_test": "lower authorship.topic_fraction (more unseen topics) or authorship.author_fraction "
                                 "(more unseen authors)",
             "same_topic_test": "lower authorship.author_fraction (more unseen authors) or raise "
                                "authorship.topic_fraction (more seen topics)"}
    for name in TEST_SPLITS:
        q = _queries(splits[name])
        if q < cfg.min_test_queries:
            raise PipelineError(f"{name} is too small to evaluate: {len(splits[name])} records, {q} queries "
                                f"(authorship.min_test_queries={cfg.min_test_queries}): {hints[name]}")
    pairs = sum(1 for n in Counter(r["author"] for r in splits["train"]).values() if n >= 2)
    if pairs < 2:
        raise PipelineError(f"train has {pairs} author(s) with at least 2 texts (contrastive batches need 2 or more): "
                            "raise authorship.author_fraction, authorship.topic_fraction or authorship.train_fraction")
    used = set().union(*map(set, parts.values()))
    stats = {name: {"texts": len(rs), "authors": len({r["author"] for r in rs}),
                    "topics": len({r["topic"] for r in rs}), "queries": _queries(rs)} for name, rs in splits.items()}
    stats["unused"] = {"texts": len(records) - len(used)}
    stats["source"] = {"texts": len(records), "authors": len(by_author), "topics": len(by_topic),
                       "candidate_authors": len(top_authors), "candidate_topics": len(top_topics),
                       "candidate_texts": len(cand), "training_portion": len(portion)}
    return splits, stats


def write_split(input_path: str | Path, out: str | Path, cfg: SplitConfig | None = None,
                progress: bool = True) -> dict:
    """`pipeline authorship split`: read, split, write the four Parquet files + manifest."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..io_utils import atomic_path, sha256_file

    cfg = cfg or SplitConfig()
    out = Path(out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MANIFEST).exists())):
        raise PipelineError(f"{out}: exists and is not an authorship split folder; refusing to write into it")
    records = read_records(input_path, cfg)
    splits, stats = split_records(records, cfg)
    schema = pa.schema([("text", pa.string()), ("author", pa.string()), ("topic", pa.string())])
    manifest = {"kind": "authorship-split", "protocol": "cross-topic-open-set (ARR, docs/METHODS.md §4)",
                "source": str(Path(input_path).resolve()), "source_sha256": sha256_file(input_path),
                "config": asdict(cfg), "counts": stats, "files": {k: f"{k}.parquet" for k in SPLITS}}
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        for name in SPLITS:
            pq.write_table(pa.Table.from_pylist(splits[name], schema=schema), tmp / f"{name}.parquet")
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    if progress:
        print(f"[authorship] {len(records):,} records -> " + ", ".join(
            f"{k} {stats[k]['texts']:,} ({stats[k]['authors']} authors, {stats[k]['topics']} topics)" for k in SPLITS)
            + f" -> {out}", flush=True)
    return manifest


def load_split(split_dir: str | Path, name: str) -> list[dict]:
    """One split's records (file order) from a folder written by `write_split`."""
    d = Path(split_dir)
    if not (d / MANIFEST).exists():
        raise PipelineError(f"{d}: not an authorship split (no {MANIFEST}); make one with `pipeline authorship split`")
    if name not in SPLITS:
        raise PipelineError(f"unknown split {name!r}; splits: {', '.join(SPLITS)}")
    import pyarrow.parquet as pq

    return pq.read_table(d / f"{name}.parquet").to_pylist()


def read_manifest(split_dir: str | Path) -> dict:
    d = Path(split_dir)
    if not (d / MANIFEST).exists():
        raise PipelineError(f"{d}: not an authorship split (no {MANIFEST}); make one with `pipeline authorship split`")
    return json.loads((d / MANIFEST).read_text())


def bundled_fortunes() -> Path:
    """The bundled corpus: 7,571 quotes from Debian's fortunes (scripts/build_fortunes.py)."""
    return Path(__file__).resolve().parent.parent / "resources" / "fortunes" / "quotes.parquet"


# ---------------------------------------------------------------------------- vectorisers (H, baselines)
VECTORIZER_KINDS = ("tfidf", "bow")


class FittedVectorizer:
    """A scikit-learn vectoriser fitted on a split's *training* records only.

    `transform` is the only way in: there is no method to refit it, and `fit_vectorizer`
    refuses any split but `train`. Persisted as `<split>/vectorizers/<kind>.pkl` with
    `<kind>.json` (sha256 of the pickle, sha256 of the train file it was fitted on); loading
    checks both, and a changed train file means a new fit, never a fit on other data."""

    def __init__(self, kind: str, vectorizer, sha256: str, train_sha256: str):
        self.kind, self._v, self.sha256, self.train_sha256 = kind, vectorizer, sha256, train_sha256

    def transform(self, texts: list[str]):
        """L2-normalised sparse rows (cosine = dot product)."""
        from sklearn.preprocessing import normalize

        return normalize(self._v.transform(texts), norm="l2", copy=False)

    def similarity(self, texts: list[str]):
        """(N, N) cosine similarities of `texts` as a dense float32 numpy array."""
        import numpy as np

        x = self.transform(texts)
        return np.asarray((x @ x.T).todense(), dtype=np.float32)

    @property
    def vocabulary_size(self) -> int:
        return len(self._v.vocabulary_)


def _new_vectorizer(kind: str):
    from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer

    if kind == "tfidf":
        return TfidfVectorizer()
    if kind == "bow":
        return CountVectorizer()
    raise ConfigError(f"unknown vectorizer {kind!r}; kinds: {', '.join(VECTORIZER_KINDS)}")


def fit_vectorizer_on(records: list[dict], split: str, kind: str = "tfidf"):
    """Fit a default-settings scikit-learn vectoriser on `records` of split `split` (must be train)."""
    if split != "train":
        raise PipelineError(f"refusing to fit the {kind} model on the {split!r} split: it is fitted on the training "
                            "split only (docs/METHODS.md §4)")
    v = _new_vectorizer(kind)
    v.fit([r["text"] for r in records])
    return v


def vectorizer(split_dir: str | Path, kind: str = "tfidf") -> FittedVectorizer:
    """The split's `kind` vectoriser fitted on train.parquet: loaded when persisted and intact
    for the current train file, else fitted (on train only) and persisted."""
    import hashlib
    import pickle

    from ..io_utils import sha256_file, write_json_atomic, write_text_atomic  # noqa: F401

    d = Path(split_dir)
    read_manifest(d)
    train_path = d / "train.parquet"
    train_sha = sha256_file(train_path)
    folder = d / "vectorizers"
    pkl, meta_path = folder / f"{kind}.pkl", folder / f"{kind}.json"
    if pkl.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        blob = pkl.read_bytes()
        if meta.get("train_sha256") == train_sha:
            if hashlib.sha256(blob).hexdigest() != meta.get("sha256"):
                raise PipelineError(f"{pkl}: its sha256 does not match {meta_path}; delete both to refit on train")
            return FittedVectorizer(kind, pickle.loads(blob), meta["sha256"], train_sha)
    v = fit_vectorizer_on(load_split(d, "train"), "train", kind)
    blob = pickle.dumps(v, protocol=4)
    sha = hashlib.sha256(blob).hexdigest()
    folder.mkdir(exist_ok=True)
    from ..io_utils import atomic_path

    with atomic_path(pkl) as tmp:
        tmp.write_bytes(blob)
    import sklearn

    write_json_atomic(meta_path, {"kind": kind, "sha256": sha, "train_sha256": train_sha, "fitted_on": "train",
                                  "texts": len(load_split(d, "train")), "vocabulary": len(v.vocabulary_),
                                  "sklearn": sklearn.__version__})
    return FittedVectorizer(kind, v, sha, train_sha)
