"""`pipeline bm25`: a BM25 run over an ingested corpus, made with bm25s (a well-kept BM25 library on sparse
matrices), written as a standard TREC run with `<run>.meta.json` like `pipeline retrieve`'s.

What it is for: hard negatives for training (`data.negatives_run`, the DAR paper's Table 6 setting uses
BM25's), and a lexical baseline for `pipeline evaluate` / `compare`.

Choices (recorded in the run's meta):
- scoring: bm25s's `lucene` variant (Lucene's BM25, idf = ln(1 + (N - df + 0.5) / (df + 0.5))) with
  k1 = 0.9, b = 0.4, Anserini's (and so pyserini's) defaults for BEIR and MS MARCO;
- text: the corpus's title-joined passages (as the encoders see them), lower-cased, English stop words
  removed (bm25s's list), words stemmed with Snowball's English stemmer (PyStemmer), as Anserini's
  default analyser does;
- queries: every query of the file, or only those a qrels file judges (`--qrels`: e.g. the training
  split's, for hard negatives);
- ties: equal scores are ranked by the corpus's order (stable), so a run is reproducible.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..data.manifest import join_titles, load_manifest
from ..data.readers import load_qrels, load_queries
from ..errors import InputError, PipelineError
from ..eval.runs import RunOutput, RunWriter
from ..io_utils import write_json_atomic

K1, B, METHOD = 0.9, 0.4, "lucene"


def _corpus_texts(corpus_dir: Path, manifest: dict) -> tuple[list[str], list[str]]:
    import pyarrow.parquet as pq

    pids: list[str] = []
    texts: list[str] = []
    for part in manifest["parts"]:
        table = pq.read_table(corpus_dir / part["file"], columns=["pid", "title", "text"])
        pids.extend(table["pid"].to_pylist())
        texts.extend(join_titles(table["title"], table["text"], manifest["title_join"]).to_pylist())
    return pids, texts


def _tokenize(texts: list[str], stemmer, ids: bool = True):
    import bm25s

    return bm25s.tokenize(texts, lower=True, stopwords="en", stemmer=stemmer, show_progress=False, return_ids=ids)


def bm25_run(corpus_dir: str | Path, queries_path: str | Path, run_path: str | Path, top_k: int = 100,
             qrels: str | Path | None = None, k1: float = K1, b: float = B, overwrite: bool = False,
             tag: str = "bm25", progress: bool = True) -> dict:
    """Index the corpus with BM25 and write the top `top_k` passages of each query as a TREC run."""
    import bm25s
    import Stemmer

    t0 = time.time()
    if top_k < 1:
        raise PipelineError(f"--top-k must be a positive integer, got {top_k}")
    output = RunOutput(run_path, overwrite, asked={
        "queries": str(Path(queries_path).resolve()), "qrels": str(Path(qrels).resolve()) if qrels else None})
    corpus_dir = Path(corpus_dir)
    manifest = load_manifest(corpus_dir)
    queries = load_queries(queries_path)
    if qrels is not None:
        judged = load_qrels(qrels)
        missing = sorted(set(judged) - set(queries))
        if missing:
            raise InputError(qrels, None, f"{len(missing)} judged queries are not in {queries_path}, e.g. {missing[0]!r}")
        queries = {q: t for q, t in queries.items() if q in judged}
    if not queries:
        raise InputError(queries_path, None, "no queries to search (an empty run is not written)")
    pids, texts = _corpus_texts(corpus_dir, manifest)
    if not pids:
        raise PipelineError(f"{corpus_dir}: the corpus has no passages")
    stemmer = Stemmer.Stemmer("english")
    retriever = bm25s.BM25(method=METHOD, k1=k1, b=b)
    retriever.index(_tokenize(texts, stemmer), show_progress=False)
    del texts
    t_index = time.time() - t0
    k = min(top_k, len(pids))
    qids = list(queries)
    pid_array = np.asarray(pids, dtype=object)
    with output.target() as target:
        with RunWriter(target, tag) as run:
            for s in range(0, len(qids), 1000):
                batch = qids[s:s + 1000]
                ids, scores = _search(retriever, _tokenize([queries[q] for q in batch], stemmer, ids=False), k)
                # a query with no term in the corpus scores 0 everywhere: no hit rather than k arbitrary ones
                ids = np.where(scores > 0, ids, -1)
                run.write(batch, pid_array, scores.astype(np.float32), ids)
        if output.unchanged(target):
            if progress:
                print(f"[bm25] unchanged: {run_path} already holds this run ({len(qids):,} queries, top {k}, the same "
                      f"{run.lines:,} lines); nothing was written", flush=True)
            return output.meta()
    meta = {"corpus_fingerprint": manifest["fingerprint"], "variant": manifest.get("variant"),
            "title_join": manifest.get("title_join"), "model": {"name": "bm25", "library": f"bm25s {bm25s.__version__}",
                                                                "method": METHOD, "k1": k1, "b": b,
                                                                "analyser": "lower-case, bm25s English stop words, "
                                                                            "Snowball English stemmer"},
            "queries": str(Path(queries_path).resolve()), "qrels": str(Path(qrels).resolve()) if qrels else None,
            "n_queries": len(qids), "top_k": k, "seconds": round(time.time() - t0, 2)}
    write_json_atomic(str(run_path) + ".meta.json", meta)
    if progress:
        print(f"[bm25] done: {len(pids):,} passages indexed in {t_index:.1f}s (bm25s {METHOD}, k1 {k1:g}, b {b:g}); "
              f"{len(qids):,} queries, top {k}, {run.lines:,} run lines in {time.time() - t0:.1f}s -> {run_path}",
              flush=True)
    return meta


def _search(retriever, tokens, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, scores), each (n, k), best first; equal scores in corpus order. A query none of whose terms
    is in the corpus gets scores of 0 (no hits)."""
    n = len(tokens)
    known = [[t for t in q if t in retriever.vocab_dict] for q in tokens]
    live = [i for i, q in enumerate(known) if q]
    ids = np.zeros((n, k), dtype=np.int64)
    scores = np.zeros((n, k), dtype=np.float32)
    if not live:
        return ids, scores
    got_ids, got_scores = retriever.retrieve([known[i] for i in live], k=k, show_progress=False, n_threads=1,
                                             sorted=True)
    ids[live], scores[live] = np.asarray(got_ids), np.asarray(got_scores)
    ids, scores = np.asarray(ids), np.asarray(scores)
    # bm25s sorts by score only; make ties deterministic by corpus row
    order = np.lexsort((ids, -scores), axis=1)
    return np.take_along_axis(ids, order, 1), np.take_along_axis(scores, order, 1)
