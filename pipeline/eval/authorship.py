"""Authorship retrieval evaluation (ARR paper §3, docs/METHODS.md §4) and the paper-style table.

Protocol, per test split (records in file order):
- per author with n >= 2 texts, the first int(0.5 n) are queries and the rest targets;
- authors with a single text are distractors: their text joins the targets;
- every query is ranked against all targets by cosine similarity (dense models: an exact
  inner-product FAISS index over L2-normalised vectors; BOW / TF-IDF: exact sparse cosine,
  ties broken by target order), top 10 kept;
- R@8 = share of queries with a same-author target among the top 8; MRR = mean of
  1 / rank of the first same-author target within the top 10 (0 when none).

The BOW and TF-IDF baselines are scikit-learn's CountVectorizer / TfidfVectorizer with
default settings, fitted on the split's training file only (`data.authorship.vectorizer`).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..data.authorship import AUTHORSHIP_METHODS, TEST_SPLITS, load_split, read_manifest, vectorizer
from ..errors import PipelineError

K_RECALL, K_MRR = 8, 10
LABELS = ("zero-shot", "BOW", "TF-IDF", "CL", "CL+ARR", "MLL", "MLL+ARR")
METHOD_LABELS = {"arr_cl": "CL", "arr_mll": "MLL"}


def queries_and_targets(records: list[dict]) -> tuple[list[int], list[int]]:
    """Indices into `records` of the queries and of the targets (both in file order)."""
    by_author: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(records):
        by_author[r["author"]].append(i)
    queries, targets = [], []
    for idx in by_author.values():
        nq = int(0.5 * len(idx)) if len(idx) >= 2 else 0
        queries += idx[:nq]
        targets += idx[nq:]
    return sorted(queries), sorted(targets)


def rank_metrics(ranked: np.ndarray, q_authors: list, t_authors: list) -> dict:
    """ranked (Q, <=10) target indices best first (-1 = none) -> R@8, MRR over the top 10."""
    hits, rr = 0, 0.0
    for qi, row in enumerate(ranked):
        same = [j >= 0 and t_authors[j] == q_authors[qi] for j in row[:K_MRR]]
        hits += any(same[:K_RECALL])
        first = next((r for r, s in enumerate(same) if s), None)
        rr += 0.0 if first is None else 1.0 / (first + 1)
    n = len(ranked)
    return {"R@8": hits / n, "MRR": rr / n, "queries": n}


def _top_dense(qv: np.ndarray, tv: np.ndarray, k: int) -> np.ndarray:
    import faiss

    qv = np.ascontiguousarray(qv, dtype=np.float32)
    tv = np.ascontiguousarray(tv, dtype=np.float32)
    faiss.normalize_L2(qv)
    faiss.normalize_L2(tv)
    index = faiss.IndexFlatIP(tv.shape[1])
    index.add(tv)
    _, ids = index.search(qv, min(k, tv.shape[0]))
    return ids


def _top_sparse(qx, tx, k: int, chunk: int = 512) -> np.ndarray:
    out = []
    for s in range(0, qx.shape[0], chunk):
        sims = np.asarray((qx[s:s + chunk] @ tx.T).todense(), dtype=np.float64)
        out.append(np.argsort(-sims, axis=1, kind="stable")[:, :min(k, tx.shape[0])])
    return np.concatenate(out, 0)


def evaluate_records(records: list[dict], encode) -> dict:
    """`encode(texts) -> dense (N, D) array or sparse L2-normalised rows` -> metrics for one split."""
    qi, ti = queries_and_targets(records)
    if not qi:
        raise PipelineError("no queries: no author has 2 or more texts in this split")
    q_texts, t_texts = [records[i]["text"] for i in qi], [records[i]["text"] for i in ti]
    qv, tv = encode(q_texts), encode(t_texts)
    ranked = _top_dense(qv, tv, K_MRR) if isinstance(qv, np.ndarray) else _top_sparse(qv, tv, K_MRR)
    out = rank_metrics(ranked, [records[i]["author"] for i in qi], [records[i]["author"] for i in ti])
    out.update({"targets": len(ti), "authors": len({r["author"] for r in records}),
                "distractors": sum(1 for c in _counts(records).values() if c == 1)})
    return out


def _counts(records):
    c: dict = defaultdict(int)
    for r in records:
        c[r["author"]] += 1
    return c


def model_encoder(model, batch_size: int = 64, device: str = "cpu", precision: str = "fp32"):
    """texts -> vectors, in chunks that report progress ("encoding texts", pipeline/progress.py)."""
    def encode(texts):
        import numpy as np

        from .. import progress

        chunk = max(batch_size * 16, 256)
        parts = []
        progress.update("encoding texts", 0, len(texts))
        for s in range(0, len(texts), chunk):
            parts.append(model.embed(texts[s:s + chunk], "doc", batch_size=batch_size, device=device,
                                     precision=precision))
            progress.update("encoding texts", min(s + chunk, len(texts)), len(texts))
        return np.concatenate(parts) if parts else model.embed([], "doc", batch_size=batch_size, device=device,
                                                               precision=precision)

    return encode


def _system_info(model_path: str | None, baseline: str | None) -> dict:
    """What produced the vectors, and its table label / seed when known (from the run's summary.json)."""
    if baseline:
        return {"kind": "baseline", "baseline": baseline, "label": {"bow": "BOW", "tfidf": "TF-IDF"}[baseline],
                "seed": None}
    info = {"kind": "model", "model": model_path, "label": "zero-shot", "seed": None}
    summary = Path(model_path).parent / "summary.json" if model_path and model_path != "minilm" else None
    if summary is not None and summary.exists():
        s = json.loads(summary.read_text())
        method = s.get("method")
        info["seed"] = s.get("seed")
        info["method"] = method
        if method in METHOD_LABELS:
            info["label"] = METHOD_LABELS[method]
        elif method == "arr":
            teacher = _teacher_of(Path(model_path).parent)
            base = _system_info(teacher, None)["label"] if teacher else "?"
            info["label"] = f"{base}+ARR"
            info["teacher"] = teacher
        else:
            info["label"] = method or "model"
    return info


def _teacher_of(run_dir: Path) -> str | None:
    import yaml

    cfg = run_dir / "config.yaml"
    if not cfg.exists():
        return None
    return ((yaml.safe_load(cfg.read_text()) or {}).get("authorship") or {}).get("teacher")


def evaluate_split(split_dir: str | Path, model: str | None = None, baseline: str | None = None,
                   splits=TEST_SPLITS, batch_size: int = 64, device: str = "cpu", label: str | None = None,
                   progress: bool = True) -> dict:
    """`pipeline authorship evaluate`: R@8 and MRR per split, keyed by split name."""
    if (model is None) == (baseline is None):
        raise PipelineError("give exactly one of --model and --baseline")
    manifest = read_manifest(split_dir)
    if baseline is not None:
        if baseline not in ("bow", "tfidf"):
            raise PipelineError(f"--baseline must be bow or tfidf, got {baseline!r}")
        vec = vectorizer(split_dir, baseline)
        encode = vec.transform
    else:
        from ..config import ModelConfig
        from ..models import BiEncoder

        enc = BiEncoder.load(ModelConfig(name_or_path=model))
        enc.eval()
        encode = model_encoder(enc, batch_size, device)
    result = {"split_dir": str(Path(split_dir).resolve()), "source_sha256": manifest["source_sha256"],
              "system": _system_info(model, baseline)}
    if label:
        result["system"]["label"] = label
    for name in splits:
        result[name] = evaluate_records(load_split(split_dir, name), encode)
        if progress:
            r = result[name]
            print(f"[authorship] {result['system']['label']} {name}: R@8 {r['R@8']:.4f}  MRR {r['MRR']:.4f}  "
                  f"({r['queries']} queries, {r['targets']} targets)", flush=True)
    return result


class AuthorshipValidator:
    """validate_fn for the ARR methods: R@8 / MRR on the split's validation file (val_metric = R@8)."""

    def __init__(self, split_dir: str | Path, split: str = "val", batch_size: int = 64):
        self.split_dir = str(Path(split_dir).resolve())
        self.split, self.batch_size = split, batch_size
        read_manifest(self.split_dir)

    def __call__(self, model, device: str | None = None) -> dict:
        import time

        t0 = time.time()
        device = device or str(next(model.parameters()).device)
        r = evaluate_records(load_split(self.split_dir, self.split), model_encoder(model, self.batch_size, device))
        return {"val_R@8": r["R@8"], "val_MRR": r["MRR"], "val_metric": r["R@8"], "val_seconds": time.time() - t0}


# ---------------------------------------------------------------------------- table
def collect(paths: list[str | Path]) -> dict:
    """Result JSONs -> {label: {split: {metric: [values...]}}}; one value per JSON (seed)."""
    table: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    sources = set()
    for p in paths:
        try:
            r = json.loads(Path(p).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise PipelineError(f"{p}: not a readable authorship result JSON ({e})") from None
        if "system" not in r or not any(s in r for s in TEST_SPLITS):
            raise PipelineError(f"{p}: not an authorship result (no system / test splits)")
        sources.add(r.get("source_sha256"))
        for split in TEST_SPLITS:
            if split in r:
                for metric in ("R@8", "MRR"):
                    table[r["system"]["label"]][split][metric].append(float(r[split][metric]))
    if len(sources) > 1:
        raise PipelineError("the result JSONs come from different corpora (source_sha256 differs); one table per split")
    return table


def format_table(table: dict) -> str:
    """The paper-style table: rows zero-shot, BOW, TF-IDF, CL, CL+ARR, MLL, MLL+ARR (+ others);
    mean over seeds, with n = the number of results behind each cell."""
    rows = [lbl for lbl in LABELS if lbl in table] + sorted(k for k in table if k not in LABELS)
    head = "| model | cross-topic R@8 | cross-topic MRR | same-topic R@8 | same-topic MRR |"
    lines = [head, "|---|---|---|---|---|"]
    for lbl in rows:
        cells = []
        for split in TEST_SPLITS:
            for metric in ("R@8", "MRR"):
                vals = table[lbl].get(split, {}).get(metric, [])
                if not vals:
                    cells.append("–")
                    continue
                mean = sum(vals) / len(vals)
                sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else None
                cells.append(f"{mean:.3f}" + (f" ± {sd:.3f}" if sd is not None else "") + f" (n={len(vals)})")
        lines.append(f"| {lbl} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def validator_for(job):
    """validate_fn for an authorship training job (R@8 on the split's validation file), or None."""
    if job.loss.name not in AUTHORSHIP_METHODS or job.validation.corpus:
        return None
    sec = job.section("authorship")
    if not sec.split:
        return None
    return AuthorshipValidator(sec.split, "val", job.validation.batch_size)
