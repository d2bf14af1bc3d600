"""Validation during training through the spine: encode -> FAISS index -> retrieve -> evaluate.

Runs in-process on the training worker (rank 0) with the model being trained, using the
same pieces as the CLI (BiEncoder.embed, a FAISS inner-product index, the TREC run
writer, the ir-measures evaluator), and returns `val_<metric>` values for Ray Train/Tune.

It encodes as `pipeline encode` would on the machine, so its figure is the one the spine gives the
exported model and it runs at the encoder's speed: the lengths the export declares (not training's
shorter ones: `BiEncoder.inference_lengths`), the passages in encode's precision (`validation.precision`,
auto = bf16 where native, else fp32), the queries in fp32 (as retrieve encodes them), and on a CPU
through OpenVINO (`validation.backend`) when the corpus is large enough for the faster encoder to pay
for its conversion (OPENVINO_MIN_PASSAGES: converted at the first validation, refreshed with the step's
weights at the later ones); each validation says which encoder ran, at what rate, and why.
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

# auto uses OpenVINO from this many passages on: the model being trained is converted at the first
# validation (~2.5 s for MiniLM on 2 cores), again at the second to find its weights in the graph
# (RefreshableTower), and refreshed and compiled at the later ones (~0.5-1 s with the check), while
# OpenVINO encodes MiniLM 1.2-1.4x torch's bf16 rate on an AVX512-BF16 CPU (bench/batching.py) and
# 1.05x torch's fp32 on an AVX2 one (bench/encode.py), so small corpora stay with torch
OPENVINO_MIN_PASSAGES = 1000


class Validator:
    """Picklable callable: model -> {"val_MRR@10": …, "val_metric": …}."""

    def __init__(self, corpus: str, queries: str | None = None, qrels: str | None = None,
                 metric: str = "MRR@10", top_k: int = 100, batch_size: int = 64, eval_cfg: EvalConfig | None = None,
                 precision: str = "auto", backend: str = "auto"):
        self.corpus = Path(corpus).resolve()
        # an ir_datasets identifier (msmarco-passage/dev/small) stays a string: the readers resolve it
        self.queries = str(queries) if is_identifier(queries) else Path(queries or self.corpus / "queries.tsv").resolve()
        self.qrels_path = str(qrels) if is_identifier(qrels) else Path(qrels or self.corpus / "qrels" / "test.trec").resolve()
        self.metric, self.top_k, self.batch_size = metric, top_k, batch_size
        self.precision, self.backend = precision, backend
        self.eval_cfg = eval_cfg or EvalConfig()
        self._refreshable = None  # the model converted for OpenVINO at the first validation (not pickled)
        # the configured name may be an alias (MRR@10 -> RR@10); it is always computed
        self.metric_key = measure_name(metric, self.eval_cfg.rel_level)
        self.measures = list(measures_for(self.eval_cfg))
        if self.metric_key not in self.measures:
            self.measures.append(self.metric_key)
        load_manifest(self.corpus)  # fail here, on the driver, rather than inside a worker

    def __getstate__(self):
        return {**self.__dict__, "_refreshable": None}

    def encoder_plan(self, model, device, n_docs: int) -> tuple[str, str, str | None]:
        """(backend, precision, why) for the passages: `pipeline encode`'s choice on this machine."""
        from ..models.backends import openvino_available, resolve_backend
        from ..models.precision import resolve_precision

        import torch

        precision = resolve_precision(self.precision, device)
        cpu = torch.device(device).type == "cpu"
        if self.backend == "torch" or not cpu:
            return "torch", precision, None if self.backend == "torch" else "a GPU encodes with torch"
        if self.backend == "openvino":
            resolve_backend("openvino", device, precision)  # installed? (ConfigError naming encode's option)
            return "openvino", precision, None
        if not openvino_available():
            return "torch", precision, "OpenVINO is not installed"
        if n_docs < OPENVINO_MIN_PASSAGES:
            return "torch", precision, (f"{n_docs:,} passages < {OPENVINO_MIN_PASSAGES:,}: converting the model for "
                                        "OpenVINO costs more than it saves on so few")
        return "openvino", precision, None

    def __call__(self, model, device: str | None = None) -> dict:
        import faiss
        import torch

        from ..models.backends import tower_runner
        from ..models.precision import query_precision

        t0 = time.time()
        device = device or str(next(model.parameters()).device)
        manifest = load_manifest(self.corpus)
        qrels = load_qrels(self.qrels_path)
        queries = {q: t for q, t in load_queries(self.queries).items() if q in qrels}
        index = faiss.IndexFlatIP(model.dim)
        pids: list[str] = []
        n_docs = int(manifest["rows"])
        chunk = max(self.batch_size * 16, 256)  # progress after every chunk (the sink prints every few s)
        with torch.no_grad(), model.inference_lengths():
            backend, precision, why = self.encoder_plan(model, device, n_docs)
            t_enc = time.time()
            runner = None
            if backend == "openvino":
                backend, runner, precision, why = self._openvino(model, backend, precision, device, why)
            progress.update("encoding passages", 0, n_docs)
            for part in manifest["parts"]:
                t = pq.read_table(self.corpus / part["file"])
                texts = [join_title(a, b, manifest["title_join"]) for a, b in zip(t["title"].to_pylist(), t["text"].to_pylist())]
                for s in range(0, len(texts), chunk):
                    index.add(model.embed(texts[s:s + chunk], "doc", batch_size=self.batch_size, device=device,
                                          precision=precision, runner=runner))
                    progress.update("encoding passages", index.ntotal, n_docs)
                pids.extend(t["pid"].to_pylist())
            encode_s = time.time() - t_enc
            qids = list(queries)
            qv = np.zeros((0, model.dim), dtype=np.float32)
            progress.update("encoding queries", 0, len(qids))
            for s in range(0, len(qids), chunk):
                qv = np.concatenate([qv, model.embed([queries[q] for q in qids[s:s + chunk]], "query",
                                                     batch_size=self.batch_size, device=device,
                                                     precision=query_precision())])
                progress.update("encoding queries", len(qv), len(qids))
        scores, ids = index.search(np.ascontiguousarray(qv, dtype=np.float32), min(self.top_k, len(pids)))
        with tempfile.TemporaryDirectory() as tmp:
            run_path = Path(tmp) / "val.trec"
            write_run(run_path, qids, pids, scores, ids, "validation")
            result = evaluate_run(read_run(run_path), qrels, self.eval_cfg, measures=self.measures)
        out = {f"val_{k}": v for k, v in result["metrics"].items()}
        out["val_metric"] = out[f"val_{self.metric_key}"]
        out["val_seconds"] = time.time() - t0
        # how the passages were encoded (their rate counts a conversion in), and why not faster
        out["validation_rate"] = n_docs / max(encode_s, 1e-9)
        out["validation_encoder"] = f"{backend} {precision}" + (f" ({why})" if why else "")
        return out

    def _openvino(self, model, backend: str, precision: str, device, why: str | None):
        """(backend, runner, precision, why): the model as OpenVINO's tower with this step's weights,
        converted at the first validation and refreshed at the later ones (RefreshableTower), or
        converted each time where it cannot be refreshed (and the line says why); torch, and why, where
        the conversion failed or its check did not pass (auto)."""
        import torch

        from ..models.backends import RefreshableTower, tower_runner

        tower = self._refreshable
        stuck = tower is not None and tower.reason is not None and tower.is_of(model, "doc")  # cannot be refreshed
        if not stuck and (tower is None or not tower.fits(model, "doc")):
            progress.update("converting the model for OpenVINO", 0, 1)
            self._refreshable = RefreshableTower(model, "doc")
        used, runner, precision, note = tower_runner(model, "doc", backend, precision, torch.get_num_threads(), device,
                                                     keep=False, option="validation",
                                                     refreshable=None if stuck else self._refreshable)
        if note or used != "openvino":
            return used, runner, precision, note or why  # a failed conversion or check: torch, and why
        tower = self._refreshable
        if tower.reason:
            return used, runner, precision, f"converted at every validation: {tower.reason}"
        return used, runner, precision, ("converted for OpenVINO at this validation" if tower.uses == 1 else
                                         "converted at the first validation, this step's weights written in")


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
    return validator_for_job(job)


def validator_for_job(job) -> Validator:
    """The spine's Validator on `job.validation` (its corpus, queries, qrels, metric, encoder choice)."""
    v = job.validation
    return Validator(v.corpus, v.queries, v.qrels, v.metric, v.top_k, v.batch_size, job.eval, v.precision, v.backend)
