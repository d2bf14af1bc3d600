"""FAQ retrieval in k folds (RCL's FAQ metrics: top-1/3/5 accuracy and MAP) and anisotropy.

The FAQ is a BEIR folder (corpus.jsonl = answers, queries.jsonl = questions, qrels/all.tsv);
the bundled Python FAQ (`pipeline/resources/python_faq`) by default. Queries are split into
`k` seeded folds; each fold's questions are searched against every answer through the spine's
path (BiEncoder.embed -> FAISS exact inner product -> TREC run -> ir-measures): top-k accuracy
is ir-measures' `Success@k`, MAP its `AP` over the full ranking. With `model_for_fold`, each
fold is scored with the model trained without it (train on k-1 folds, test on the held-out one).

Anisotropy: the mean cosine between the embeddings of distinct random sentences (Ethayarajh
2019); 0 for an isotropic space, near 1 when every vector points the same way.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import PipelineError

MEASURES = ("Success@1", "Success@3", "Success@5", "AP")
NAMES = {"Success@1": "top1", "Success@3": "top3", "Success@5": "top5", "AP": "MAP"}


def load_faq(folder: str | Path | None = None, qrels_file: str = "all.tsv"):
    """(queries {qid: text}, answers {pid: text}, qrels {qid: {pid: rel}}) of a BEIR folder."""
    from ..data.manifest import join_title
    from ..data.readers import load_qrels, load_queries, read_beir_corpus

    if folder is None:
        from ..data.bundled import python_faq_dir

        folder = python_faq_dir()
    folder = Path(folder)
    answers = {r["pid"]: join_title(r["title"], r["text"], "{title} {text}") if r["title"] else r["text"]
               for r in read_beir_corpus(folder / "corpus.jsonl")}
    queries = load_queries(folder / "queries.jsonl")
    qrels = load_qrels(folder / "qrels" / qrels_file)
    qrels = {q: {d: r for d, r in docs.items() if r > 0} for q, docs in qrels.items() if q in queries}
    if not qrels:
        raise PipelineError(f"{folder}: no judged query")
    return queries, answers, qrels


def kfold(qids, k: int = 5, seed: int = 0) -> list[list[str]]:
    """k disjoint folds of the (sorted, seeded-shuffled) query ids, sizes differing by at most 1."""
    ids = sorted(qids)
    if k < 2 or k > len(ids):
        raise PipelineError(f"k={k} folds need 2 <= k <= {len(ids)} queries")
    random.Random(seed).shuffle(ids)
    return [sorted(ids[i::k]) for i in range(k)]


def faq_metrics(model, queries: dict, answers: dict, qrels: dict, qids, batch_size: int = 64,
                device: str = "cpu", answer_vectors: np.ndarray | None = None) -> dict:
    """top1/3/5 accuracy and MAP of `qids` searched against every answer (FAISS exact IP)."""
    import faiss

    from ..config import EvalConfig
    from .metrics import evaluate_run
    from .runs import read_run, write_run

    pids = list(answers)
    dv = answer_vectors if answer_vectors is not None else model.embed([answers[p] for p in pids], "doc",
                                                                      batch_size=batch_size, device=device)
    index = faiss.IndexFlatIP(dv.shape[1])
    index.add(np.ascontiguousarray(dv, dtype=np.float32))
    qids = [q for q in qids if q in qrels]
    qv = model.embed([queries[q] for q in qids], "query", batch_size=batch_size, device=device)
    scores, ids = index.search(np.ascontiguousarray(qv, dtype=np.float32), len(pids))
    with tempfile.TemporaryDirectory() as tmp:
        run_path = Path(tmp) / "faq.trec"
        write_run(run_path, qids, pids, scores, ids, "faq")
        res = evaluate_run(read_run(run_path), {q: qrels[q] for q in qids}, EvalConfig(), measures=list(MEASURES))
    return {NAMES[m]: float(res["metrics"][m]) for m in MEASURES} | {"queries": len(qids)}


def kfold_eval(model_for_fold: Callable[[int, list[str], list[str]], object] | object, folder=None, k: int = 5,
               seed: int = 0, batch_size: int = 64, device: str = "cpu") -> dict:
    """Mean (and std) over k folds of the FAQ metrics.

    `model_for_fold(i, train_qids, test_qids) -> model` gives the model scored on fold i (e.g. one
    trained on the other folds); a plain model is scored on every fold as it is."""
    queries, answers, qrels = load_faq(folder)
    folds = kfold(qrels, k, seed)
    per_fold = callable(model_for_fold) and not hasattr(model_for_fold, "embed")
    dv = None
    if not per_fold:  # one model for every fold: the answers are encoded once
        dv = model_for_fold.embed(list(answers.values()), "doc", batch_size=batch_size, device=device)
    per = []
    for i, test in enumerate(folds):
        train = sorted(q for j, f in enumerate(folds) if j != i for q in f)
        model = model_for_fold(i, train, test) if per_fold else model_for_fold
        per.append(faq_metrics(model, queries, answers, qrels, test, batch_size, device, answer_vectors=dv))
    out = {}
    for key in NAMES.values():
        vals = np.array([p[key] for p in per])
        out[key] = float(vals.mean())
        out[f"{key}_std"] = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
    return {**out, "folds": per, "k": k, "seed": seed, "queries": sum(p["queries"] for p in per)}


def anisotropy(model, texts: list[str], n: int = 200, seed: int = 0, side: str = "doc", batch_size: int = 64,
               device: str = "cpu") -> float:
    """Mean pairwise cosine of the embeddings of `n` random distinct sentences (diagonal excluded)."""
    distinct = sorted(set(texts))
    if len(distinct) < 2:
        raise PipelineError("anisotropy needs at least 2 distinct sentences")
    sample = random.Random(seed).sample(distinct, min(n, len(distinct)))
    v = model.embed(sample, side, batch_size=batch_size, device=device).astype(np.float64)
    v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    sims = v @ v.T
    m = len(sample)
    return float((sims.sum() - np.trace(sims)) / (m * (m - 1)))
