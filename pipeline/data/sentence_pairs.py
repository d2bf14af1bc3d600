"""Sentence-pair training files (anchor, positive[, hard negative]): RCL's STS setting.

The paper trains its STS models on NLI-style pairs (entailment pairs, contradiction as the hard
negative). Layouts read, told apart by the file name and the first line:

    JSONL (.jsonl, .json lines)   {"anchor": …, "positive": …[, "negative": …]} per line
    CSV   (.csv, header needed)   e.g. SimCSE's nli_for_simcse.csv: sent0,sent1,hard_neg
    TSV   (anything else)         anchor<TAB>positive[<TAB>negative]; a header line naming the
                                  columns is used (and then other columns are ignored)

Column names accepted: anchor / query / sent0 / sentence1 / premise; positive / sent1 /
sentence2 / hypothesis / entailment; negative / hard_neg / hard_negative / contradiction.
Gzipped files are read too. A malformed line (a missing or empty sentence, bad JSON) is an
InputError naming file and line.

`pair_examples` writes them as the trainer's examples (data/training.py schema); `rcl.dev_split`
holds a seeded share of the pairs out as the dev pairs (early stopping), never trained on.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path
from typing import Iterator

from ..errors import InputError, PipelineError

ANCHOR = ("anchor", "query", "sent0", "sentence1", "premise")
POSITIVE = ("positive", "sent1", "sentence2", "hypothesis", "entailment")
NEGATIVE = ("negative", "hard_neg", "hard_negative", "contradiction")


def _pick(row: dict, names: tuple[str, ...]):
    low = {str(k).strip().lower(): v for k, v in row.items()}
    for n in names:
        if n in low:
            return low[n], True
    return None, False


def _pair(path, line: int, a, p, n) -> tuple[int, str, str, str | None]:
    for what, v in (("anchor", a), ("positive", p)):
        if not isinstance(v, str) or not v.strip():
            raise InputError(path, line, f"the {what} sentence is missing or empty")
    if n is not None and (not isinstance(n, str) or not n.strip()):
        n = None
    return line, a, p, n


def _header_cols(fields: list[str]) -> dict[str, int] | None:
    low = [f.strip().lower() for f in fields]
    cols = {}
    for key, names in (("a", ANCHOR), ("p", POSITIVE), ("n", NEGATIVE)):
        for name in names:
            if name in low:
                cols[key] = low.index(name)
                break
    return cols if "a" in cols and "p" in cols else None


def read_pairs(path: str | Path) -> Iterator[tuple[int, str, str, str | None]]:
    """(line, anchor, positive, negative or None) per pair."""
    from .readers import iter_lines

    path = Path(path)
    if not path.is_file():
        raise InputError(path, None, "no such file (a pairs file: JSONL, CSV with a header, or TSV)")
    name = path.name.lower().removesuffix(".gz")
    lines = iter_lines(path)
    if name.endswith((".jsonl", ".ndjson")) or name.endswith(".json"):
        for no, text in lines:
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise InputError(path, no, f"invalid JSON: {e.msg}") from None
            if not isinstance(obj, dict):
                raise InputError(path, no, "each line must be a JSON object")
            a, ha = _pick(obj, ANCHOR)
            p, hp = _pick(obj, POSITIVE)
            if not (ha and hp):
                raise InputError(path, no, f"needs an anchor ({'/'.join(ANCHOR)}) and a positive "
                                           f"({'/'.join(POSITIVE)}) field; has {sorted(obj)}")
            n, _ = _pick(obj, NEGATIVE)
            yield _pair(path, no, a, p, n)
        return
    if name.endswith(".csv"):
        numbered = [(no, t.lstrip("\ufeff") if i == 0 else t) for i, (no, t) in enumerate(lines)]
        reader = csv.reader(t for _, t in numbered)
        try:
            header = next(reader, None)
            cols = _header_cols(header or [])
            if cols is None:
                raise InputError(path, 1, f"a CSV pairs file needs a header naming the anchor ({'/'.join(ANCHOR)}) "
                                          f"and positive ({'/'.join(POSITIVE)}) columns; got {header}")
            for fields in reader:
                no = numbered[reader.line_num - 1][0] if reader.line_num - 1 < len(numbered) else reader.line_num
                if not any(f.strip() for f in fields):
                    continue
                if len(fields) <= max(cols["a"], cols["p"]):
                    raise InputError(path, no, f"{len(fields)} field(s); the header names {len(header)}")
                n = fields[cols["n"]] if "n" in cols and cols["n"] < len(fields) else None
                yield _pair(path, no, fields[cols["a"]], fields[cols["p"]], n)
        except csv.Error as e:
            raise InputError(path, reader.line_num, f"CSV: {e}") from None
        return
    cols = None
    for no, text in lines:
        if not text.strip():
            continue
        fields = text.lstrip("\ufeff").split("\t") if no == 1 else text.split("\t")
        if cols is None and no == 1:
            cols = _header_cols(fields)
            if cols is not None:
                continue
        if cols is None:
            cols = {"a": 0, "p": 1, "n": 2}
        if len(fields) <= max(cols["a"], cols["p"]):
            raise InputError(path, no, f"{len(fields)} tab-separated field(s); expected anchor<TAB>positive[<TAB>negative]")
        n = fields[cols["n"]] if "n" in cols and cols["n"] < len(fields) else None
        yield _pair(path, no, fields[cols["a"]], fields[cols["p"]], n)


def split_pairs(path: str | Path, dev_split: float, seed: int) -> tuple[list[tuple], list[tuple]]:
    """(train, dev) pairs: a seeded `dev_split` share is the dev part (none when 0)."""
    pairs = list(read_pairs(path))
    if not pairs:
        raise PipelineError(f"{path}: no sentence pairs")
    if not dev_split:
        return pairs, []
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    n_dev = max(1, round(dev_split * len(pairs)))
    if n_dev >= len(pairs):
        raise PipelineError(f"{path}: dev_split={dev_split} leaves no training pair ({len(pairs)} in all)")
    dev = set(order[:n_dev])
    return [p for i, p in enumerate(pairs) if i not in dev], [p for i, p in enumerate(pairs) if i in dev]


def pair_examples(path: str | Path, out: str | Path, dev_split: float = 0.0, seed: int = 0,
                  hard_negatives: int = 0, progress: bool = True) -> dict:
    """Write the training pairs as the trainer's examples (reused while the file and settings are
    unchanged): qid = `l<line>`, query = anchor, positive, negatives = [hard negative]."""
    from ..io_utils import sha256_file
    from .examples_store import EXAMPLES_META, write_examples

    out = Path(out)
    meta = {"source": "pairs", "path": str(Path(path).resolve()), "sha256": sha256_file(path),
            "dev_split": dev_split, "seed": seed, "need_negatives": hard_negatives > 0}
    meta_path = out / EXAMPLES_META
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        if {k: old.get(k) for k in meta} == meta:
            return old
    train, dev = split_pairs(path, dev_split, seed)
    skipped: dict = {}

    def rows():
        for line, a, p, n in train:
            if hard_negatives and n is None:
                skipped["no_negatives"] = skipped.get("no_negatives", 0) + 1
                continue
            yield {"qid": f"l{line}", "query": a, "positive": p, "negatives": [n] if n is not None else []}

    result = write_examples(rows(), out, {**meta, "dev_pairs": len(dev)}, skipped=skipped)
    if progress:
        print(f"[train-data] {result['examples']:,} pairs from {path}"
              + (f" ({len(dev):,} held out as dev pairs)" if dev else "")
              + (f", skipped {skipped}" if skipped else "") + f" -> {out}", flush=True)
    return result
