"""Validation during training through the spine: encode -> FAISS index -> retrieve -> evaluate.

Runs in-process on the training worker (rank 0) with the model being trained, using the
same pieces as the CLI (BiEncoder.embed, a FAISS inner-product index, the TREC run
writer, the ir-measures evaluator), and returns `val_<metric>` values for Ray Train/Tune.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from .. import progress
from ..config import EvalConfig
from ..data.irds import is_identifier
from ..data.manifest import join_title, load_manifest
from ..data.readers import load_qrels, load_queries
from ..eval.metrics import evaluate_run, measure_name, measures_for
from ..eval.runs import read_run, write_run


class Validator:
    """Picklable callable: model -> {"val_MRR@10": …, "val_metric": …}."""

    def __init__(self, corpus: str, queries: str | None = None, qrels: str | None = None,
                 metric: str = "MRR@10", top_k: int = 100, batch_size: int = 64, eval_cfg: EvalConfig | None = None):
        self.corpus = Path(corpus).resolve()
        # an ir_datasets identifier (msmarco-passage/dev/small) stays a string: the readers resolve it
        self.queries = str(queries) if is_identifier(queries) else Path(queries or self.corpus / "queries.tsv").resolve()
        self.qrels_path = str(qrels) if is_identifier(qrels) else Path(qrels or self.corpus / "qrels" / "test.trec").resolve()
        self.metric, self.top_k, self.batch_size = metric, top_k, batch_size
        self.eval_cfg = eval_cfg or EvalConfig()
        # the configured name may be an alias (MRR@10 -> RR@10); it is always computed
        self.metric_key = measure_name(metric, self.eval_cfg.rel_level)
        self.measures = list(measures_for(self.eval_cfg))
        if self.metric_key not in self.measures:
            self.measures.append(self.metric_key)
        load_manifest(self.corpus)  # fail here, on the driver, rather than inside a worker

    def __call__(self, model, device: str | None = None) -> dict:
        import faiss
        import torch

        t0 = time.time()
        device = device or str(next(model.parameters()).device)
        manifest = load_manifest(self.corpus)
        qrels = load_qrels(self.qrels_path)
        queries = {q: t for q, t in load_queries(self.queries).items() if q in qrels}
        index = faiss.IndexFlatIP(model.dim)
        pids: list[str] = []
        n_docs = int(manifest["rows"])
        chunk = max(self.batch_size * 16, 256)  # progress after every chunk (the sink prints every few s)
        with torch.no_grad():
            progress.update("encoding passages", 0, n_docs)
            for part in manifest["parts"]:
                t = pq.read_table(self.corpus / part["file"])
                texts = [join_title(a, b, manifest["title_join"]) for a, b in zip(t["title"].to_pylist(), t["text"].to_pylist())]
                for s in range(0, len(texts), chunk):
                    index.add(model.embed(texts[s:s + chunk], "doc", batch_size=self.batch_size, device=device))
                    progress.update("encoding passages", index.ntotal, n_docs)
                pids.extend(t["pid"].to_pylist())
            qids = list(queries)
            qv = np.zeros((0, model.dim), dtype=np.float32)
            progress.update("encoding queries", 0, len(qids))
            for s in range(0, len(qids), chunk):
                qv = np.concatenate([qv, model.embed([queries[q] for q in qids[s:s + chunk]], "query",
                                                     batch_size=self.batch_size, device=device)])
                progress.update("encoding queries", len(qv), len(qids))
        scores, ids = index.search(np.ascontiguousarray(qv, dtype=np.float32), min(self.top_k, len(pids)))
        with tempfile.TemporaryDirectory() as tmp:
            run_path = Path(tmp) / "val.trec"
            write_run(run_path, qids, pids, scores, ids, "validation")
            result = evaluate_run(read_run(run_path), qrels, self.eval_cfg, measures=self.measures)
        out = {f"val_{k}": v for k, v in result["metrics"].items()}
        out["val_metric"] = out[f"val_{self.metric_key}"]
        out["val_seconds"] = time.time() - t0
        return out


def make_validator(job):
    """The validation function `pipeline train` hands the trainer for `job` (a TrainJobConfig),
    or None: R@8 on the authorship split's val for the ARR methods (docs/METHODS.md §4), else the
    spine's Validator on `validation.corpus` (None without one). Tune trials and RCL's stages use
    the same choice."""
    from ..data.authorship import AUTHORSHIP_METHODS
    from ..eval.authorship import validator_for

    if job.loss.name in AUTHORSHIP_METHODS:
        return validator_for(job)
    if not job.validation.corpus:
        return None
    v = job.validation
    return Validator(v.corpus, v.queries, v.qrels, v.metric, v.top_k, v.batch_size, job.eval)
