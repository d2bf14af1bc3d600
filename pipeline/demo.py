"""`pipeline demo` / `make demo`: the whole flow on the bundled Python FAQ corpus.

ingest (BEIR layout) -> encode with Ray Data (MiniLM from the installed package)
-> exact inner-product FAISS index -> retrieve -> evaluate, then one table, saved
as `report.md` and `results.json` in the output folder. Steps whose output is
complete are reused (pass --fresh to recompute).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from importlib import resources
from pathlib import Path

from .config import PipelineConfig
from .io_utils import write_json_atomic, write_text_atomic


def demo_data_dir() -> Path:
    return Path(str(resources.files("pipeline") / "resources" / "python_faq"))


def run_demo(out: Path, cfg: PipelineConfig, fresh: bool = False) -> dict:
    from .data.ingest import ingest
    from .data.manifest import MANIFEST_NAME
    from .eval.metrics import evaluate_files
    from .eval.report import format_table
    from .index.encode import encode_corpus
    from .index.faiss_index import META_FILE, build_index
    from .index.retrieve import retrieve

    t0 = time.time()
    if fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    # 2 cores: one encoder actor on one CPU leaves room for Ray Data's read task.
    if cfg.encode.num_actors == 1 and cfg.encode.cpus_per_actor == 1.0 and cfg.ray.address is None:
        cfg = replace(cfg, encode=replace(cfg.encode, batch_size=32))
    data = demo_data_dir()
    corpus, emb, index, run = out / "corpus", out / "embeddings", out / "index", out / "run.trec"
    print(f"[demo] Python FAQ corpus ({data}) -> {out}", flush=True)
    if not (corpus / MANIFEST_NAME).exists():
        ingest([data], "beir", corpus, overwrite=True)
    encode_corpus(corpus, emb, cfg)
    if not (index / META_FILE).exists() or fresh:
        build_index(emb, index, cfg.index)
    retrieve(index, corpus / "queries.tsv", run, cfg)
    rows, results = {}, {}
    for split in ("all", "test"):
        res = evaluate_files(run, corpus / "qrels" / f"{split}.trec", cfg.eval)
        label = f"MiniLM zero-shot ({split}, {res['queries']['evaluated']} q)"
        rows[label] = res["metrics"]
        results[split] = res
    table = format_table(rows)
    manifest = json.loads((corpus / MANIFEST_NAME).read_text())
    md = ("# Demo: zero-shot dense retrieval on the Python FAQ\n\n"
          f"Corpus: {manifest['variant']}, {manifest['rows']} passages, fingerprint {manifest['fingerprint']}; "
          f"model: {cfg.model.name_or_path}; index: {cfg.index.factory}.\n\n"
          + format_table(rows, markdown=True) + "\n")
    write_text_atomic(out / "report.md", md)
    write_json_atomic(out / "results.json", results)
    print("\n" + table + "\n")
    print(f"[demo] done in {time.time() - t0:.0f}s; report: {out / 'report.md'}", flush=True)
    return results
