"""STS evaluation: Spearman and Pearson correlation of cosine similarity with the gold score.

`pipeline sts --pairs FILE --model MODEL [--json OUT]`. Layouts read (`fmt=auto` tells them apart
from the first line):

    stsb-csv   STS-benchmark CSV with a header naming sentence1, sentence2, score (any column order,
               extra columns ignored; comma-separated, RFC 4180 quoting)
    stsb-tsv   the original STS-benchmark TSV, no header: genre, file, year, id, score, sentence1,
               sentence2 [, extra source columns]; quotes are literal text (as the file is read
               with quoting off by its authors)
    sick       SICK: tab-separated with a header naming pair_ID, sentence_A, sentence_B,
               relatedness_score (other columns ignored); any tab-separated file whose header
               names sentence1, sentence2 and score is read the same way (GLUE's STS-B dev.tsv)
    tsv        plain `s1<TAB>s2<TAB>score`, no header (a header line s1/sentence1 … is skipped)

A malformed row (too few fields, a score that is not a finite number or lies outside the gold
scale, 0-5 unless `--scale LO:HI` says otherwise, an empty sentence) is an InputError naming the
file and line; so is a file whose gold scores are all equal. The STS convention: sentences are encoded as documents
(no query prompt), cosine similarity, correlations over all pairs (scipy).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np

from ..errors import InputError, PipelineError
from ..io_utils import OutputKind, register_output_kind

FORMATS = ("auto", "stsb-csv", "stsb-tsv", "sick", "tsv")
_S1 = ("sentence1", "sentence_a", "s1", "sentence 1", "text1")
_S2 = ("sentence2", "sentence_b", "s2", "sentence 2", "text2")
_SCORE = ("score", "relatedness_score", "similarity_score", "label", "gold", "gold_score")


def _is_own_sts(path: Path) -> bool:
    import json

    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(m, dict) and {"spearman", "pearson", "pairs"} <= set(m)


register_output_kind(OutputKind("sts", False, "an STS metrics JSON (pipeline sts)", is_own=_is_own_sts))


def _lines(path: Path) -> list[tuple[int, str]]:
    from ..data.readers import iter_lines

    return [(no, text) for no, text in iter_lines(path)]


SCALE = (0.0, 5.0)  # STS-benchmark and GLUE STS-B: 0-5; SICK relatedness: 1-5


def parse_scale(text: str) -> tuple[float, float]:
    """'LO:HI' -> (lo, hi), lo < hi (the gold scale a file is checked against)."""
    try:
        lo, hi = (float(x) for x in text.split(":"))
    except ValueError:
        raise PipelineError(f"--scale {text!r}: expected LO:HI, e.g. 0:5") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise PipelineError(f"--scale {text!r}: expected finite LO < HI")
    return lo, hi


def _score(path, line: int, raw: str, scale: tuple[float, float]) -> float:
    try:
        v = float(raw.strip())
    except ValueError:
        raise InputError(path, line, f"score {raw.strip()!r} is not a number") from None
    if not math.isfinite(v):
        raise InputError(path, line, f"score {raw.strip()!r} is not finite")
    if not scale[0] <= v <= scale[1]:
        raise InputError(path, line, f"gold score {raw.strip()} is outside the scale {scale[0]:g}-{scale[1]:g} "
                                     "(the wrong column, or another scale? pass --scale LO:HI for a file on "
                                     "another scale)")
    return v


def _pair(path, line: int, s1: str, s2: str, score: str, scale: tuple[float, float]) -> tuple[str, str, float]:
    s1, s2 = s1.strip(), s2.strip()
    if not s1 or not s2:
        raise InputError(path, line, "empty sentence")
    return s1, s2, _score(path, line, score, scale)


def _column(header: list[str], names: tuple[str, ...], path, what: str) -> int:
    low = [h.strip().lower() for h in header]
    for n in names:
        if n in low:
            return low.index(n)
    raise InputError(path, 1, f"the header names no {what} column (one of {', '.join(names)}); got {header}")


def detect_format(path: str | Path) -> str:
    """`stsb-csv` | `stsb-tsv` | `sick` | `tsv` from the first non-empty line."""
    first = next((t for _, t in _lines(Path(path)) if t.strip()), None)
    if first is None:
        raise InputError(path, None, "no STS pairs (empty file)")
    first = first.lstrip("\ufeff")
    low = first.lower()
    if "\t" in first:
        fields = first.split("\t")
        if ("pair_id" in low and "sentence_a" in low) or ("sentence1" in low and "sentence2" in low and len(fields) > 3):
            return "sick"  # a tab header naming the columns (SICK; also GLUE's STS-B train/dev.tsv)
        if len(fields) >= 7:
            try:
                float(fields[4])
                return "stsb-tsv"
            except ValueError:
                pass
        return "tsv"
    if "sentence1" in low and "," in first:
        return "stsb-csv"
    raise InputError(path, 1, "unknown STS layout: expected an STS-benchmark CSV header (sentence1,sentence2,score), "
                              "the STS-benchmark TSV (genre, file, year, id, score, s1, s2), SICK, or s1<TAB>s2<TAB>score")


def read_sts(path: str | Path, fmt: str = "auto", scale: tuple[float, float] = SCALE) -> list[tuple[str, str, float]]:
    """(sentence1, sentence2, gold score) for every row; malformed rows are InputErrors (file:line).

    A gold score outside `scale` is an error naming its line, and so is a file whose gold scores
    are all equal (no correlation exists): a broken file never prints a correlation."""
    path = Path(path)
    if fmt not in FORMATS:
        raise PipelineError(f"unknown STS format {fmt!r}; one of {', '.join(FORMATS)}")
    if fmt == "auto":
        fmt = detect_format(path)
    lines = [(no, t.lstrip("\ufeff") if i == 0 else t) for i, (no, t) in enumerate(_lines(path))]
    out: list[tuple[str, str, float]] = []
    if fmt == "stsb-csv":
        text = "\n".join(t for _, t in lines)
        reader = csv.reader(io.StringIO(text))
        try:
            header = next(reader)
        except StopIteration:
            raise InputError(path, None, "no STS pairs (empty file)") from None
        i1, i2, isc = (_column(header, n, path, w) for n, w in ((_S1, "sentence1"), (_S2, "sentence2"), (_SCORE, "score")))
        need = max(i1, i2, isc) + 1
        try:
            for row in reader:
                line = lines[reader.line_num - 1][0] if reader.line_num - 1 < len(lines) else reader.line_num
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) < need:
                    raise InputError(path, line, f"{len(row)} field(s), the header names {len(header)}")
                out.append(_pair(path, line, row[i1], row[i2], row[isc], scale))
        except csv.Error as e:
            raise InputError(path, reader.line_num, f"CSV: {e}") from None
    elif fmt == "sick":
        header = lines[0][1].split("\t") if lines else []
        i1, i2, isc = (_column(header, n, path, w) for n, w in ((_S1, "sentence_A"), (_S2, "sentence_B"),
                                                                 (_SCORE, "relatedness_score")))
        for no, t in lines[1:]:
            if not t.strip():
                continue
            f = t.split("\t")
            if len(f) <= max(i1, i2, isc):
                raise InputError(path, no, f"{len(f)} field(s), the header names {len(header)}")
            out.append(_pair(path, no, f[i1], f[i2], f[isc], scale))
    elif fmt == "stsb-tsv":
        for no, t in lines:
            if not t.strip():
                continue
            f = t.split("\t")
            if len(f) < 7:
                raise InputError(path, no, f"{len(f)} field(s); the STS-benchmark TSV has 7 "
                                           "(genre, file, year, id, score, sentence1, sentence2)")
            out.append(_pair(path, no, f[5], f[6], f[4], scale))
    else:  # tsv
        for k, (no, t) in enumerate(lines):
            if not t.strip():
                continue
            f = t.split("\t")
            if len(f) != 3:
                raise InputError(path, no, f"{len(f)} field(s); expected s1<TAB>s2<TAB>score")
            if k == 0 and f[0].strip().lower() in _S1 and f[1].strip().lower() in _S2:
                continue  # a header line
            out.append(_pair(path, no, f[0], f[1], f[2], scale))
    if len(out) < 2:
        raise InputError(path, None, f"{len(out)} STS pair(s): correlations need at least 2")
    if len({p[2] for p in out}) == 1:
        raise InputError(path, None, f"every gold score is {out[0][2]:g} ({len(out)} pairs): a constant gold list has "
                                     "no correlation (the wrong column?)")
    return out


def correlations(pred, gold) -> dict:
    """Spearman and Pearson of predicted vs gold scores (scipy), as floats."""
    from scipy.stats import pearsonr, spearmanr

    pred, gold = np.asarray(pred, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if pred.shape != gold.shape or pred.ndim != 1:
        raise ValueError(f"pred {pred.shape} and gold {gold.shape} must be equal-length vectors")
    if np.ptp(pred) == 0 or np.ptp(gold) == 0:
        raise PipelineError("a constant score list has no correlation (every prediction or every gold score equal)")
    return {"spearman": float(spearmanr(pred, gold).statistic), "pearson": float(pearsonr(pred, gold).statistic)}


def cosine_scores(model, pairs: list[tuple[str, str, float]], side: str = "doc", batch_size: int = 64,
                  device: str = "cpu") -> np.ndarray:
    """cos(E(s1), E(s2)) per pair; every distinct sentence encoded once."""
    sentences = list(dict.fromkeys([p[0] for p in pairs] + [p[1] for p in pairs]))
    pos = {s: i for i, s in enumerate(sentences)}
    v = model.embed(sentences, side, batch_size=batch_size, device=device)
    v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    a = v[[pos[p[0]] for p in pairs]]
    b = v[[pos[p[1]] for p in pairs]]
    return (a * b).sum(axis=1)


def evaluate_sts(pairs_path: str | Path, model, fmt: str = "auto", side: str = "doc", batch_size: int = 64,
                 device: str = "cpu", scale: tuple[float, float] = SCALE,
                 pairs: list[tuple[str, str, float]] | None = None) -> dict:
    """{"spearman", "pearson", "pairs", "format", "file"} for a loaded BiEncoder (`pairs`: the file's
    pairs when the caller has read them already)."""
    fmt = detect_format(pairs_path) if fmt == "auto" else fmt
    pairs = read_sts(pairs_path, fmt, scale) if pairs is None else pairs
    pred = cosine_scores(model, pairs, side, batch_size, device)
    return {**correlations(pred, [p[2] for p in pairs]), "pairs": len(pairs), "format": fmt,
            "file": str(pairs_path), "side": side}


class STSValidator:
    """The trainer's validation hook on an STS dev file (e.g. STS-benchmark's sts-dev.csv):
    `val_metric` = Spearman of cosine vs gold (x1, greater is better), plus `val_spearman`,
    `val_pearson`. The pairs are read once, on the driver, so the file need not exist where
    rank 0 runs."""

    def __init__(self, pairs_path: str | Path, fmt: str = "auto", side: str = "doc", batch_size: int = 64):
        self.path = str(pairs_path)
        self.fmt = detect_format(pairs_path) if fmt == "auto" else fmt
        self.pairs = read_sts(pairs_path, self.fmt)
        self.side, self.batch_size = side, batch_size

    def __call__(self, model) -> dict:
        import time

        t0 = time.time()
        device = str(next(model.parameters()).device)
        pred = cosine_scores(model, self.pairs, self.side, self.batch_size, device)
        c = correlations(pred, [p[2] for p in self.pairs])
        return {"val_metric": c["spearman"], "val_spearman": c["spearman"], "val_pearson": c["pearson"],
                "val_seconds": time.time() - t0}
