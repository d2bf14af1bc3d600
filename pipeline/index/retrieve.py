"""`pipeline retrieve`: queries -> query vectors -> FAISS top-k -> a standard TREC run file."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..config import ModelConfig, PipelineConfig
from ..data.readers import load_queries
from ..errors import ConfigError, InputError, NonFiniteError, PipelineError
from ..eval.runs import RunOutput, RunWriter
from ..io_utils import write_json_atomic
from ..models.precision import query_precision
from .faiss_index import LoadedIndex
from .shards import first_bad_row


def query_model_config(index_meta: dict, override: ModelConfig | None, where: str = "the index") -> ModelConfig:
    """The model that encoded the corpus, unless the caller names another: found by its recorded name
    (an alias resolves anywhere), else its recorded path, and checked against its recorded digest
    (models/loading.locate_recorded_model)."""
    from ..models.loading import locate_recorded_model

    if override is not None:
        return override
    saved = ModelConfig(**dict(index_meta["model_config"]))
    record = index_meta.get("model") if isinstance(index_meta.get("model"), dict) else {}
    return replace(saved, name_or_path=locate_recorded_model(saved.name_or_path, record, where))


def _check_query_dim(dim: int | None, index: LoadedIndex, index_dir, model) -> None:
    if dim is None or dim == index.index.d:
        return
    name = getattr(getattr(model, "cfg", None), "name_or_path", None) or "the query model"
    corpus_model = (index.meta.get("model_config") or {}).get("name_or_path", "see its index.json")
    raise PipelineError(f"the query model ({name}) gives {dim}-dimensional vectors but the index at {index_dir} "
                        f"holds {index.index.d}-dimensional ones; query with the model that encoded the corpus "
                        f"({corpus_model})")


def check_query_vectors(vectors, names) -> None:
    """Refuse a query vector holding a NaN, an inf or a component beyond ±MAX_COMPONENT (shards.py says
    why), naming its query (`names[i]` names row i): FAISS would score it NaN or inf and the query's
    results would be dropped or ranked by garbage, without a word."""
    import numpy as np

    bad = first_bad_row(np.asarray(vectors))
    if bad is not None:
        raise NonFiniteError(f"query {names[bad[0]]}: its vector holds {bad[1]}; no search can rank by it "
                             "(the query model is broken?); nothing was written")


def open_for_retrieve(index_dir, cfg: PipelineConfig):
    """The index as `retrieve.runner` searches it: one part as always; several parts one at a time (local: the
    memory of one part) or held by search actors on Ray (ray); the memory each will take checked first."""
    from .faiss_index import load_index
    from .sharded import ShardedIndex, check_search_memory

    runner = getattr(cfg.retrieve, "runner", "local")
    index = load_index(index_dir, cfg.index, resident=False)
    if not isinstance(index, ShardedIndex):
        return index
    if runner == "ray":
        from .search_actors import RaySearch

        return RaySearch(index, cfg)
    check_search_memory(index, f"retrieve from {index_dir}", cfg.index.max_ram_fraction)
    return index


def retrieve(index_dir: str | Path, queries_path: str | Path, run_path: str | Path, cfg: PipelineConfig,
             queries_format: str = "auto", model_cfg: ModelConfig | None = None, model=None,
             progress: bool = True, overwrite: bool = True, only_judged: str | Path | None = None,
             queries_label: str | None = None) -> dict:
    """Encode queries, search the index and write a TREC run (+ `<run>.meta.json`). With `only_judged` (a qrels
    file), only the queries it judges are searched (e.g. a BEIR queries file holding every split's queries).
    `queries_label` names the queries in the run's meta in place of their file's path (an ir_datasets identifier
    read through a temporary file).

    `run_path` must be new or a run this tool wrote (replaced only with `overwrite`;
    the CLI asks for `--overwrite`); a directory or another file there is refused
    before anything is computed. Run again as it was run, it keeps the run there when the new
    one has the same lines (`eval.runs.RunOutput`) and says so.
    """
    t0 = time.time()
    k = cfg.retrieve.top_k
    if not isinstance(k, int) or k < 1:
        raise ConfigError(f"retrieve.top_k must be a positive integer, got {k!r}")
    queries_name = queries_label or str(Path(queries_path).resolve())
    output = RunOutput(run_path, overwrite, asked={
        "top_k": k, "queries": queries_name, "index": str(Path(index_dir).resolve()),
        "only_judged_by": str(Path(only_judged).resolve()) if only_judged is not None else None})
    index = open_for_retrieve(index_dir, cfg)
    queries = load_queries(queries_path, queries_format)
    if only_judged is not None:
        from ..data.readers import load_qrels

        judged = load_qrels(only_judged)
        missing = sorted(set(judged) - set(queries))
        if missing:
            raise InputError(only_judged, None, f"{len(missing)} judged queries are not in {queries_path}, e.g. "
                                                f"{missing[0]!r}")
        queries = {q: t for q, t in queries.items() if q in judged}
    if not queries:
        raise InputError(queries_path, None, "no queries (an empty queries file would give an empty run)")
    if model is None:
        from ..models import BiEncoder

        model = BiEncoder.load(query_model_config(index.meta, model_cfg, str(index_dir)))
    _check_query_dim(getattr(model, "dim", None), index, index_dir, model)
    qids = list(queries)
    bs = cfg.retrieve.batch_size
    precision = query_precision()  # the same for every index and every caller (models/precision.py)
    # the run is written batch by batch (memory holds one batch's hits), and appears only when complete
    from .sharded import ShardedIndex

    # an index of several parts searched one part at a time takes every query at once: each part is loaded once
    at_once = isinstance(index, ShardedIndex) and not index.resident
    with output.target() as target:
        with RunWriter(target, cfg.retrieve.run_tag) as run:
            held = []
            for s in range(0, len(qids), bs):
                vecs = model.embed([queries[q] for q in qids[s:s + bs]], "query", batch_size=bs, precision=precision)
                _check_query_dim(vecs.shape[1] if getattr(vecs, "ndim", 0) == 2 else None, index, index_dir, model)
                check_query_vectors(vecs, qids[s:s + bs])  # raised inside the writer: nothing is left at run_path
                if at_once:
                    held.append(np.asarray(vecs, dtype=np.float32))
                    continue
                scores, ids = index.search(vecs, k)
                run.write(qids[s:s + bs], index.pids, scores, ids)
            if at_once:
                scores, ids = index.search(np.concatenate(held), k)
                for s in range(0, len(qids), bs):
                    run.write(qids[s:s + bs], index.pids, scores[s:s + bs], ids[s:s + bs])
            if run.lines == 0:  # raised inside the writer: nothing is left at run_path
                raise PipelineError(f"{run_path}: the search found no passage for any of the {len(qids):,} queries "
                                    f"(index {index_dir}, {index.index.ntotal:,} vectors); an empty run is not written")
        if output.unchanged(target):
            if progress:
                print(f"[retrieve] unchanged: {run_path} already holds this run ({len(qids):,} queries, top {k}, the "
                      f"same {run.lines:,} lines); nothing was written", flush=True)
            return output.meta()
    lines = run.lines
    meta = {k2: index.meta.get(k2) for k2 in ("corpus_fingerprint", "variant", "title_join", "factory", "model")}
    meta.update({"queries": queries_name, "n_queries": len(qids), "top_k": k,
                 "only_judged_by": str(Path(only_judged).resolve()) if only_judged is not None else None,
                 "index": str(Path(index_dir).resolve()), "seconds": round(time.time() - t0, 2)})
    write_json_atomic(str(run_path) + ".meta.json", meta)
    if progress:
        print(f"[retrieve] done: {len(qids):,} queries, top {k}, {lines:,} run lines in "
              f"{time.time() - t0:.1f}s -> {run_path}", flush=True)
    return meta
