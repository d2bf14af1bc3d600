"""Training examples for a job: `build_examples` builds them from `data.source` (or reuses them when
the sources are unchanged) into an examples store.

Sources, each in a module of its own:
- `dpr_json.py`: DPR retriever training JSON, streamed object by object (the texts form).
- `qrels_examples.py`: an ingested corpus + its queries + a qrels split, one example per (query,
  relevant passage), hard negatives from a TREC run (`run_negatives.py`; the ids form).

The store (`examples/part-*.parquet` + `passages.arrow` + `examples.json`), its two forms, its
readers and its checks are in `examples_store.py`. Every name these modules define that callers
used to import from here is still importable from here.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from ..errors import PipelineError
from ..io_utils import sha256_file
from ..progress import inherit as inherit_progress
from .dpr_json import dpr_json_examples, iter_json_array  # noqa: F401
from .examples_store import (EXAMPLES_META, ID_SCHEMA, PASSAGES_FILE, SCHEMA, check_store,  # noqa: F401
                             iter_example_tables, open_passages, read_examples_table, resolve_examples,
                             store_pids_digest, write_examples)
from .manifest import load_manifest
from .qrels_examples import pick_positives, qrels_example_tables, qrels_examples  # noqa: F401


def _read_ahead(items: Iterator, depth: int = 2) -> Iterator:
    """`items`, produced by a thread of their own at most `depth` ahead of the consumer. The
    producer's error is raised here; a consumer that stops early stops (and closes) the producer."""
    import queue
    import threading

    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    on_behalf = inherit_progress()  # the producer's progress goes where the consumer's would

    def produce() -> None:
        try:
            with on_behalf():
                for item in items:
                    while not stop.is_set():
                        try:
                            q.put((item, None), timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        break
        except BaseException as e:  # handed to the consumer, raised there
            q.put((end, e))
            return
        finally:
            if hasattr(items, "close"):
                items.close()  # a generator's cleanup (e.g. its scratch folder) runs now
        q.put((end, None))

    worker = threading.Thread(target=produce, name="examples-read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            item, error = q.get()
            if item is end:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting on a full queue
            try:
                q.get(timeout=0.1)
            except queue.Empty:
                pass
        worker.join()


def build_examples(data_cfg, out: str | Path, progress: bool = True, needs_teacher: bool = False) -> dict:
    """Build (or reuse, when the sources are unchanged) the training examples for `data_cfg`. `needs_teacher`:
    the method trains on a teacher's scores (data.teacher_scores, or a columns file's label column)."""
    from ..errors import ConfigError

    if data_cfg.teacher_scores and data_cfg.source not in ("tevatron", "msmarco-id-triples"):
        raise ConfigError(f"data.teacher_scores is joined by (query id, document id) with data.source=tevatron or "
                          f"msmarco-id-triples; data.source={data_cfg.source} names no document ids (a columns file "
                          "carries its teacher's scores in its label column)")
    if needs_teacher and not data_cfg.teacher_scores and data_cfg.source != "columns":
        raise ConfigError("distillation needs the teacher's scores: data.teacher_scores=PATH (with data.source=tevatron) "
                          "or a columns file with a label column")
    from .training_files import SOURCES as FILE_SOURCES
    from .training_files import training_file_examples

    out = Path(out)
    if data_cfg.source == "msmarco-id-triples":
        if not (data_cfg.path and data_cfg.corpus and data_cfg.queries):
            raise PipelineError("data.source=msmarco-id-triples needs data.path (the id triples), data.corpus (the "
                                "ingested collection) and data.queries (qid<TAB>text)")
        manifest = load_manifest(Path(data_cfg.corpus))
        sources = [data_cfg.path, data_cfg.queries]
        meta = {"source": "msmarco-id-triples", "path": str(Path(data_cfg.path).resolve()),
                "corpus": str(Path(data_cfg.corpus).resolve()), "corpus_fingerprint": manifest["fingerprint"],
                "queries": str(data_cfg.queries), "title_join": manifest["title_join"]}
        if data_cfg.teacher_scores:
            meta.update(teacher_scores=str(Path(data_cfg.teacher_scores).resolve()),
                        teacher_format=data_cfg.teacher_format)
            sources.append(data_cfg.teacher_scores)
    elif data_cfg.source in FILE_SOURCES:
        if not data_cfg.path:
            raise PipelineError(f"data.source={data_cfg.source} needs data.path (the training file)")
        sources = []
        meta = {"source": data_cfg.source, "path": str(Path(data_cfg.path).resolve())}
        if data_cfg.source == "tevatron":
            meta["title_join"] = data_cfg.title_join
        if data_cfg.teacher_scores:
            meta.update(teacher_scores=str(Path(data_cfg.teacher_scores).resolve()),
                        teacher_format=data_cfg.teacher_format)
            sources.append(data_cfg.teacher_scores)
        if needs_teacher:
            meta["teacher"] = True
    elif data_cfg.source == "dpr-json":
        if not data_cfg.path:
            raise PipelineError("data.source=dpr-json needs data.path (the DPR training JSON)")
        sources = [data_cfg.path]
        meta = {"source": "dpr-json", "path": str(Path(data_cfg.path).resolve()), "title_join": data_cfg.title_join,
                "negatives": data_cfg.negatives}
    else:
        if not data_cfg.corpus:
            raise PipelineError("data.source=qrels needs data.corpus (an ingested corpus folder)")
        corpus = Path(data_cfg.corpus)
        manifest = load_manifest(corpus)
        queries = data_cfg.queries or str(corpus / "queries.tsv")
        qrels = data_cfg.qrels or str(corpus / "qrels" / "train.trec")
        sources = [queries, qrels] + ([data_cfg.negatives_run] if data_cfg.negatives_run else [])
        meta = {"source": "qrels", "corpus": str(corpus.resolve()), "corpus_fingerprint": manifest["fingerprint"],
                "variant": manifest["variant"], "title_join": manifest["title_join"], "queries": str(queries),
                "qrels": str(qrels), "negatives_run": data_cfg.negatives_run, "depth": data_cfg.negatives_depth,
                "rel_level": data_cfg.rel_level}
        if data_cfg.positives_per_query:  # absent otherwise: examples built before the key existed stay reusable
            meta.update(positives_per_query=data_cfg.positives_per_query, positives_seed=data_cfg.positives_seed,
                        positives_rule="highest grade first, ties drawn by (positives_seed, qid)")
    meta["need_negatives"] = data_cfg.hard_negatives > 0
    if data_cfg.source == "qrels" and data_cfg.missing_negatives != "skip" and data_cfg.hard_negatives > 0:
        # absent for skip: examples built before the key existed stay reusable
        meta.update(missing_negatives=data_cfg.missing_negatives, negatives_seed=data_cfg.positives_seed)
    meta["sources_sha256"] = {str(s): sha256_file(s) for s in sources if Path(s).exists()}
    if data_cfg.source in FILE_SOURCES and Path(data_cfg.path).exists():  # a file, or a folder's every file
        from ..io_utils import sha256_files

        p = Path(data_cfg.path)
        meta["sources_sha256"][str(p)] = sha256_file(p) if p.is_file() else \
            sha256_files(f for f in sorted(p.rglob("*")) if f.is_file())
    meta_path = out / EXAMPLES_META
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        if {k: old.get(k) for k in meta} == meta:
            check_store(out, old, full=True)  # reused (a resume, a re-run): every byte as it was built
            return old
    skipped: dict = {}
    teacher = False
    if data_cfg.source == "msmarco-id-triples":
        from .training_files import msmarco_id_triple_tables

        out.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".passages-", dir=out.parent))
        try:
            store = scratch / PASSAGES_FILE
            counts: dict = {}
            teacher_map = None
            if data_cfg.teacher_scores:
                from .training_files import read_teacher_scores

                teacher_map, _ = read_teacher_scores(data_cfg.teacher_scores, data_cfg.teacher_format)
            examples = msmarco_id_triple_tables(data_cfg.path, data_cfg.corpus, data_cfg.queries, store, skipped,
                                                counts, teacher=teacher_map)
            result = write_examples(examples, out, meta, skipped=skipped, passages=store,
                                    teacher=teacher_map is not None)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if progress:
            skip = f", skipped {skipped}" if skipped else ""
            print(f"[train-data] {result['examples']:,} examples from msmarco-id-triples{skip} naming "
                  f"{result['passages_rows']:,} distinct passages -> {out}", flush=True)
        return result
    if data_cfg.source in FILE_SOURCES:
        examples = training_file_examples(data_cfg.source, data_cfg.path, data_cfg.title_join, skipped,
                                          need_negatives=data_cfg.hard_negatives > 0 and not data_cfg.teacher_scores)
        if data_cfg.teacher_scores:
            from .training_files import read_teacher_scores, with_teacher

            scores, lines = read_teacher_scores(data_cfg.teacher_scores, data_cfg.teacher_format)
            examples = with_teacher(examples, scores, skipped)
            teacher = True
            if progress:
                print(f"[train-data] teacher scores: {len(scores):,} (query, document) pairs from {lines:,} lines of "
                      f"{data_cfg.teacher_scores} ({data_cfg.teacher_format})", flush=True)
        teacher = teacher or (data_cfg.source == "columns" and needs_teacher)
    elif data_cfg.source == "dpr-json":
        examples = dpr_json_examples(data_cfg.path, data_cfg.title_join, data_cfg.negatives, skipped,
                                     need_negatives=data_cfg.hard_negatives > 0)
    else:
        # The ids form: each passage's text stored once, the examples name its row (a 500k-pair set
        # of 1 positive + 10 negatives would otherwise carry 5.5M texts, most of them repeats). The
        # next batch of 2,000 is looked up while this one is written (a thread; DPR JSON comes an
        # example at a time, where a hand-off per item would cost more).
        out.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".passages-", dir=out.parent))
        try:
            store = scratch / PASSAGES_FILE
            drawn: dict = {}
            examples = _read_ahead(qrels_example_tables(
                data_cfg.corpus, queries, qrels, data_cfg.negatives_run, data_cfg.negatives_depth, data_cfg.rel_level,
                skipped=skipped, need_negatives=data_cfg.hard_negatives > 0, store_path=store,
                per_query=data_cfg.positives_per_query, positives_seed=data_cfg.positives_seed,
                missing_negatives=data_cfg.missing_negatives, drawn=drawn))
            result = write_examples(examples, out, meta, skipped=skipped, passages=store, counts=drawn)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if progress:
            skip = f", skipped {skipped}" if skipped else ""
            rule = (f"positives: grade >= {data_cfg.rel_level}, "
                    + (f"{data_cfg.positives_per_query} per query (highest grade, ties drawn with positives_seed "
                       f"{data_cfg.positives_seed})" if data_cfg.positives_per_query else "every one")
                    + (f"; hard negatives: top {data_cfg.negatives_depth} of {data_cfg.negatives_run} minus judged"
                       + (", drawn at random from the corpus for a query the run has none for"
                          if data_cfg.missing_negatives == "random" and data_cfg.hard_negatives else "")
                       if data_cfg.negatives_run else "; no hard negatives"))
            if drawn.get("random_negatives"):
                skip += f", {drawn['random_negatives']:,} with random negatives (the run has none for their query)"
            print(f"[train-data] {result['examples']:,} examples from {meta['source']} ({rule}){skip} "
                  f"naming {result['passages_rows']:,} distinct passages -> {out}", flush=True)
        return result
    result = write_examples(examples, out, meta, skipped=skipped, teacher=teacher)
    if progress:
        skip = f", skipped {skipped}" if skipped else ""
        print(f"[train-data] {result['examples']:,} examples from {meta['source']}{skip} -> {out}", flush=True)
    return result
