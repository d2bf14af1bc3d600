"""Validation during training through the spine: encode -> FAISS index -> retrieve -> evaluate.

Runs in-process on the training worker (rank 0) with the model being trained, using the
same pieces as the CLI (BiEncoder.embed, a FAISS inner-product index, the TREC run
writer, the ir-measures evaluator), and returns `val_<metric>` values for Ray Train/Tune.

It encodes as `pipeline encode` would on the machine, so its figure is the one the spine gives the
exported model and it runs at the encoder's speed: the lengths the export declares (not training's
shorter ones: `BiEncoder.inference_lengths`), the passages in encode's precision (`validation.precision`,
auto = bf16 where native, else fp32), the queries in fp32 (as retrieve encodes them), and on a CPU
through OpenVINO (`validation.backend`) when the corpus is large enough for the faster encoder to pay
for its conversion (OPENVINO_MIN_PASSAGES: converted at the first validation, or the architecture's graph
read from the export cache, the step's weights written in at every one; fewer passages pay where the graph
is cached); each validation says which encoder ran, at what rate, and why. In a run of
several workers every rank encodes its share and rank 0 scores them all (`part` in `__call__`).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import progress
from ..config import EvalConfig
from ..data.irds import is_identifier
from ..data.manifest import join_title, load_manifest
from ..data.readers import load_qrels, load_queries
from ..eval.metrics import evaluate_run, measure_name, measures_for
from ..eval.runs import read_run, write_run
# validation.backend=auto uses OpenVINO from these many passages per worker on (index/export_cost.py says why;
# read here, so that a test can set them for validation alone)
from .export_cost import (OPENVINO_MIN_PASSAGES, OPENVINO_MIN_PASSAGES_CACHED, OPENVINO_MIN_PASSAGES_FP32,
                          OPENVINO_MIN_PASSAGES_FP32_CACHED)


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
        self._work = None  # (what it was computed for, each passage's work): the shares' cut, once per run
        # the configured name may be an alias (MRR@10 -> RR@10); it is always computed
        self.metric_key = measure_name(metric, self.eval_cfg.rel_level)
        self.measures = list(measures_for(self.eval_cfg))
        if self.metric_key not in self.measures:
            self.measures.append(self.metric_key)
        load_manifest(self.corpus)  # fail here, on the driver, rather than inside a worker

    def __getstate__(self):
        return {**self.__dict__, "_refreshable": None, "_work": None}

    def encoder_plan(self, model, device, n_docs: int, workers: int = 1) -> tuple[str, str, str | None]:
        """(backend, precision, why) for `n_docs` passages (one worker's share of `workers`):
        `pipeline encode`'s choice on this machine."""
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
        tower = self._refreshable
        if tower is not None and tower.is_of(model, "doc"):  # this run validates through OpenVINO: it goes on
            return "openvino", precision, None
        from ..models.backends import graph_cached

        cached = graph_cached(model, "doc")  # a run of this architecture kept its graph: nothing to convert
        least = (OPENVINO_MIN_PASSAGES_CACHED if cached else OPENVINO_MIN_PASSAGES) if precision == "bf16" else (
            OPENVINO_MIN_PASSAGES_FP32_CACHED if cached else OPENVINO_MIN_PASSAGES_FP32)
        if n_docs < least:
            each = " per worker" if workers > 1 else ""
            cost = ("writing the weights into the cached OpenVINO graph" if cached
                    else "converting the model for OpenVINO")
            return "torch", precision, (f"{n_docs:,} passages{each} < {least:,}: {cost} costs more than it saves "
                                        f"on so few{' in ' + precision if precision != 'bf16' else ''}")
        return "openvino", precision, None

    # the training loop runs this on every rank of a multi-worker run (each encodes its share, see __call__)
    splits_across_ranks = True

    def __call__(self, model, device: str | None = None, part: tuple | None = None) -> dict:
        """The validation figures of `model`. `part` = (rank, world, all_gather) when every worker of a
        run calls it at once: each encodes its contiguous share of the passages and queries (so every
        worker's threads or GPU work, not rank 0's alone while the others wait), `all_gather(obj)` hands
        rank 0 every share in rank order, and rank 0 searches and evaluates; the other ranks return {}.
        A rank that fails makes every rank raise, naming it (no rank waits for a share that never comes)."""
        import faiss
        import torch

        from ..models.precision import query_precision

        rank, world, all_gather = part if part is not None else (0, 1, None)
        t0 = time.time()
        device = device or str(next(model.parameters()).device)
        try:  # from here a failure on one rank reaches the others (a file missing on one node, say)
            manifest = load_manifest(self.corpus)
            qrels = load_qrels(self.qrels_path)
            queries = {q: t for q, t in load_queries(self.queries).items() if q in qrels}
            qids = list(queries)
            t_enc = time.time()
            corpus = pa.concat_tables([pq.read_table(self.corpus / p["file"], columns=["pid", "title", "text"])
                                       for p in manifest["parts"]])  # the parts in manifest order: row i is pid i
            n_docs = corpus.num_rows
            qlo, qhi = _balanced(np.ones(len(qids)), world)[rank]  # queries split by their count
            with torch.no_grad(), model.inference_lengths():
                # passages by their tokens (the work: the FAQ's second half has 9 % more in 7 % fewer passages)
                lo, hi = _balanced(self._passage_work(model, corpus, manifest), world)[rank] if world > 1 else (0, n_docs)
                rows = corpus.slice(lo, hi - lo)
                texts = [join_title(a, b, manifest["title_join"])
                         for a, b in zip(rows["title"].to_pylist(), rows["text"].to_pylist())]
                # every rank plans for the largest share, so they choose alike and say the same
                backend, precision, why = self.encoder_plan(model, device, -(-n_docs // world), world)
                runner = None
                if backend == "openvino":
                    backend, runner, precision, why = self._openvino(model, backend, precision, device, why)
                docs = self._encode(model, texts, "doc", n_docs, world, device, precision, runner)
                mine = {"docs": docs, "encoder": f"{backend} {precision}", "why": why}
                if world > 1:  # every share, so the rate counts the slowest worker in
                    shares = _gathered(all_gather, mine, rank)
                    docs = np.concatenate([s["docs"] for s in shares]) if rank == 0 else docs
                else:
                    shares = [mine]
                encode_s = time.time() - t_enc
                if world > 1:
                    progress.update("encoding passages", n_docs, n_docs)
                qv = self._encode(model, [queries[q] for q in qids[qlo:qhi]], "query", len(qids), world, device,
                                  query_precision(), None)
        except _RankFailed:
            raise  # every rank saw it at the same exchange
        except Exception as e:  # this rank's failure reaches the others before they wait for its share
            if world > 1:
                all_gather({"error": f"{type(e).__name__}: {e}"})  # the others raise, naming this rank
            raise
        if world > 1:
            qshares = _gathered(all_gather, {"queries": qv}, rank)
            if rank != 0:
                return {}
            qv = np.concatenate([s["queries"] for s in qshares])
            progress.update("encoding queries", len(qv), len(qids))
        pids = corpus["pid"].to_pylist()
        from .sharded import search_ordered

        index = faiss.IndexFlatIP(model.dim)
        index.add(np.ascontiguousarray(docs, dtype=np.float32))
        # the tie rule of every search (index/sharded.order): the figure is the one `pipeline retrieve` gives
        scores, ids = search_ordered(index, qv, min(self.top_k, len(pids)), "ip")
        with tempfile.TemporaryDirectory() as tmp:
            run_path = Path(tmp) / "val.trec"
            write_run(run_path, qids, pids, scores, ids, "validation")
            result = evaluate_run(read_run(run_path), qrels, self.eval_cfg, measures=self.measures)
        out = {f"val_{k}": v for k, v in result["metrics"].items()}
        out["val_metric"] = out[f"val_{self.metric_key}"]
        out["val_seconds"] = time.time() - t0
        # how the passages were encoded (their rate counts a conversion in), and why not faster
        out["validation_rate"] = n_docs / max(encode_s, 1e-9)
        out["validation_encoder"] = _encoder_line(shares, world)
        return out

    def _encode(self, model, texts: list[str], side: str, total: int, world: int, device, precision: str,
                runner) -> np.ndarray:
        """This rank's `texts` as vectors, with progress ("encoding passages" / "encoding queries") of
        `total`: with several workers rank 0 counts every worker's (its own scaled by the workers, which
        encode side by side) and the last update follows the exchange."""
        what = "encoding passages" if side == "doc" else "encoding queries"
        chunk = max(self.batch_size * 16, 256)  # progress after every chunk (the sink prints every few s)
        out = []
        progress.update(what, 0, total)
        for s in range(0, len(texts), chunk):
            out.append(model.embed(texts[s:s + chunk], side, batch_size=self.batch_size, device=device,
                                   precision=precision, runner=runner))
            done = sum(len(v) for v in out) * world
            if world == 1 or done < total:
                progress.update(what, done, total)
        return np.concatenate(out) if out else np.zeros((0, model.dim), dtype=np.float32)

    def _passage_work(self, model, corpus, manifest) -> np.ndarray:
        """Each passage's share of the encoding work (`passage_work`), computed at the first validation of
        a run and kept: the dev corpus and the tokenizer do not change while it trains."""
        tok, prefix, max_len = model.token_spec("doc")
        key = (manifest.get("fingerprint"), corpus.num_rows, id(tok), prefix, max_len)
        if self._work is None or self._work[0] != key:
            self._work = (key, passage_work(model, corpus, manifest["title_join"]))
        return self._work[1]

    def _openvino(self, model, backend: str, precision: str, device, why: str | None):
        """(backend, runner, precision, why): the model as OpenVINO's tower with this step's weights,
        converted at the first validation and refreshed at the later ones (RefreshableTower), or
        converted each time where it cannot be refreshed (and the line says why); torch, and why, where
        the conversion failed or its check did not pass (auto)."""
        import torch

        from ..models.backends import RefreshableTower, graph_cached, tower_runner

        tower = self._refreshable
        stuck = tower is not None and tower.reason is not None and tower.is_of(model, "doc")  # cannot be refreshed
        if not stuck and (tower is None or not tower.fits(model, "doc")):
            progress.update("reading the model's OpenVINO graph" if graph_cached(model, "doc")
                            else "converting the model for OpenVINO", 0, 1)
            self._refreshable = RefreshableTower(model, "doc")
        used, runner, precision, note = tower_runner(model, "doc", backend, precision, torch.get_num_threads(), device,
                                                     keep=False, option="validation",
                                                     refreshable=None if stuck else self._refreshable)
        if used != "openvino":
            return used, runner, precision, note or why  # a failed conversion or check: torch, and why
        tower = self._refreshable
        if tower.reason:
            return used, runner, precision, f"converted at every validation: {tower.reason}"
        if tower.uses > 1:
            line = ("read from the export cache at the first validation" if tower.source == "cache"
                    else "converted at the first validation")
        else:
            line = ("the converted graph of this architecture read from the export cache" if tower.source == "cache"
                    else "converted for OpenVINO at this validation")
        return used, runner, precision, "; ".join([f"{line}, this step's weights written in", *([note] if note else [])])


def passage_work(model, corpus, title_join: str, chunk: int = 8192) -> np.ndarray:
    """Each passage's share of the encoding work, roughly: the tokens the model encodes of it (tokenising
    is ~1 % of encoding them) plus a per-passage cost, `corpus` (pid, title, text rows) read `chunk` rows
    at a time so a large dev set's texts are never all held at once. Every rank computes the same figures."""
    from ..data.manifest import join_titles
    from ..models.tokens import tokenize_sorted

    tok, prefix, max_len = model.token_spec("doc")
    out = np.empty(corpus.num_rows, dtype=np.float64)
    for s in range(0, corpus.num_rows, chunk):
        rows = corpus.slice(s, chunk)
        texts = join_titles(rows["title"], rows["text"], title_join).to_pylist()
        out[s:s + len(texts)] = tokenize_sorted(tok, texts, prefix, max_len, sort_by_length=False)["lengths"]
    return out + 16


class _RankFailed(RuntimeError):
    """A rank's share of the validation failed; every rank raises it at the same exchange."""


def _balanced(work: np.ndarray, world: int) -> list[tuple[int, int]]:
    """Contiguous (lo, hi) rows per rank, cut where the cumulative `work` crosses each rank's equal part
    (a row goes to the rank holding its midpoint); rank order concatenates back to 0..n."""
    if len(work) == 0:
        return [(0, 0)] * world
    work = np.asarray(work, dtype=np.float64)
    mid, total = np.cumsum(work) - work / 2, float(work.sum())
    cuts = [0] + [int(np.searchsorted(mid, total * r / world)) for r in range(1, world)] + [len(work)]
    return [(cuts[r], cuts[r + 1]) for r in range(world)]


def _gathered(all_gather, obj: dict, rank: int) -> list[dict]:
    """Every rank's `obj` in rank order; any rank's {"error": …} raises on every rank, naming it."""
    shares = all_gather(obj)
    failed = [(r, s["error"]) for r, s in enumerate(shares) if "error" in s]
    if failed:
        raise _RankFailed("validation failed on " + "; ".join(f"rank {r}: {e}" for r, e in failed)
                           + (f" (this is rank {rank})" if all(r != rank for r, _ in failed) else ""))
    return shares


def _encoder_line(shares: list[dict], world: int) -> str:
    """`torch bf16 (why)`, or with several workers `torch bf16 on 2 workers (why)`; workers that encoded
    differently (other hardware) are each named."""
    kinds = sorted({s["encoder"] for s in shares})
    whys = sorted({s["why"] for s in shares if s["why"]})
    text = kinds[0] if len(kinds) == 1 else "mixed: " + ", ".join(kinds)
    if world > 1:
        text += f" on {world} workers"
    return text + (f" ({'; '.join(whys)})" if whys else "")


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
