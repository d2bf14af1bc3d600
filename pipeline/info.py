"""`pipeline info PATH`: what a project folder or file is, from the formats this tool writes.

Recognised (by the files each writer leaves; nothing is loaded beyond JSON and line counts, but for
the vectors of a complete embedding set up to SCAN_VECTORS_BYTES, which are scanned for NaN/inf):

    corpus       manifest.json (+ corpus/part-*.parquet)              data/ingest.py, data/manifest.py
    embeddings   embeddings.json + shard-*.done/.npy/.pids.txt         index/encode.py, index/shards.py
    index        index.json + index.faiss (+ pyserini index/docid)    index/faiss_index.py
    run          a TREC run file (+ <run>.meta.json)                   index/retrieve.py
    qrels        a TREC qrels file
    training     <run_dir>/step-*/, summary.json, config.yaml, model/  train/trainer.py, models/checkpoint.py
    checkpoint   state.json (+ model/, history.json)                  models/checkpoint.py
    sweep        events.jsonl / summary.json with trials, best.yaml    tune/results.py
    model        modules.json (sentence-transformers) / config.json    models/st_layout.py
    metrics      evaluate / compare / sts JSON                         cli/evaluation.py

A folder that is none of these lists what it holds that is (one level down), or says what
was looked for.
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import PipelineError

LOOKED_FOR = ("a corpus (manifest.json)", "embeddings (embeddings.json)", "an index (index.json + index.faiss)",
              "a training run (step-*/ checkpoints, summary.json, config.yaml)", "a checkpoint (state.json)",
              "a sweep (events.jsonl or summary.json with trials)", "a model (modules.json or config.json)",
              "a TREC run or qrels file", "a metrics JSON (evaluate, compare, sts)")


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _n(x) -> str:
    return f"{x:,}" if isinstance(x, int) else str(x)


def _train_metrics(m: dict) -> str:
    """Validation measures and the loss of a training report (not timings, lr, counters)."""
    keep = {k: v for k, v in m.items() if isinstance(v, (int, float)) and (k.startswith("val_") or k == "loss")
            and k not in ("val_seconds",)}
    return _fmt_metrics(keep)


def _fmt_metrics(m: dict) -> str:
    return ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in m.items())


# --------------------------------------------------------------------------- folders


def _corpus(d: Path) -> dict | None:
    m = _json(d / "manifest.json")
    if not isinstance(m, dict) or "parts" not in m or "variant" not in m:
        return None
    parts = m.get("parts") or []
    missing = [p["file"] for p in parts if isinstance(p, dict) and not (d / p.get("file", "")).exists()]
    src = m.get("ir_datasets")
    if not src:
        srcs = m.get("sources") or []
        src = ", ".join(str(s.get("path") or s.get("ir_datasets")) for s in srcs[:3]) + (" ..." if len(srcs) > 3 else "")
    fields = {
        "passages": f"{_n(m.get('rows'))} in {len(parts)} part(s)"
                    + (f", {m['skipped']['count']} skipped (empty)" if (m.get("skipped") or {}).get("count") else ""),
        "variant": f"{m['variant']} (title join {m.get('title_join')!r}, format {m.get('format', '?')})",
        "source": ("ir_datasets " if m.get("ir_datasets") else "") + src,
        "fingerprint": m.get("fingerprint"),
    }
    if m.get("queries"):
        fields["queries"] = f"{_n(m['queries'].get('count'))} (queries.tsv, from {m['queries'].get('source')})"
    if m.get("qrels"):
        fields["qrels"] = ", ".join(f"{s} ({_n(q.get('judgements'))} judgements)" for s, q in m["qrels"].items())
    fields["complete"] = "yes" if not missing else f"NO: missing {', '.join(missing[:3])}"
    return {"kind": "corpus", "fields": fields}


SCAN_VECTORS_BYTES = 4 * 2**30  # a complete set up to this size is scanned for non-finite values


def _vectors_problem(d: Path, names: list[str]) -> str | None:
    """Why the vectors of a complete set cannot be indexed (a truncated shard, a NaN or inf), else
    None; a set larger than SCAN_VECTORS_BYTES is not read (`pipeline index` checks every vector)."""
    from .index.shards import iter_shards

    size = sum((d / f"{n}.npy").stat().st_size for n in names if (d / f"{n}.npy").exists())
    if size > SCAN_VECTORS_BYTES:
        return None
    try:
        for _ in iter_shards(d):
            pass
    except PipelineError as e:
        return str(e)
    return None


def _embeddings(d: Path) -> dict | None:
    meta = _json(d / "embeddings.json")
    if not isinstance(meta, dict) or "shards" not in meta:
        return None
    names = meta.get("shard_names") or []
    done = {p.name[:-len(".done")]: _json(p) for p in d.glob("shard-*.done")}
    have = [n for n in names if n in done]
    rows_done = sum((done[n] or {}).get("end", 0) - (done[n] or {}).get("start", 0) for n in have)
    model = meta.get("model") or {}
    state = "yes" if meta.get("complete") else (f"no: {len(names) - len(have)} of {len(names)} shards missing "
                                                 "(run `pipeline encode` again to finish)")
    if meta.get("complete"):
        problem = _vectors_problem(d, names)
        if problem:
            state = f"NO, DAMAGED: {problem}"
    return {"kind": "embeddings", "fields": {
        "shards": f"{len(have)} of {meta.get('shards')} done ({_n(rows_done)} of {_n(meta.get('rows'))} rows)",
        "vectors": f"dim {meta.get('dim')}, stored {meta.get('dtype')}, encoded in {meta.get('precision')}",
        "model": _model_line(model),
        "corpus": f"{meta.get('corpus')} ({meta.get('variant')}, fingerprint {meta.get('corpus_fingerprint')})",
        "complete": state,
    }}


def _model_line(model) -> str | None:
    """`minilm (digest 1a2b3c4d5e6f) at /path`: the recorded model, as an index or embedding set names it."""
    if not isinstance(model, dict):
        return model
    if not model.get("digest"):
        return model.get("path")
    name = model.get("name") or model.get("path")
    return f"{name} (digest {model['digest'][:12]})" + (f" at {model['path']}" if model.get("path") != name else "")


def _index(d: Path) -> dict | None:
    meta = _json(d / "index.json")
    if not isinstance(meta, dict) or "ntotal" not in meta:
        return None
    model = meta.get("model") or {}
    faiss_file = d / "index.faiss"
    parts = meta.get("parts") or []
    if parts:
        from .index.sharded import part_problem

        sizes = [(d / p["name"] / "index.faiss") for p in parts]
        bad = [f"{p['name']} {part_problem(d / p['name'], p, meta)}" for p in parts
               if part_problem(d / p["name"], p, meta)]
        lo, hi = min(p["rows"] for p in parts), max(p["rows"] for p in parts)
        held = (f", {len(parts)} parts of {_n(lo) if lo == hi else f'{_n(lo)}-{_n(hi)}'} "
                f"vectors ({sum(f.stat().st_size for f in sizes if f.exists()) / 1e6:,.1f} MB in all"
                + (", one quantizer shared" if meta.get("shared_quantizer") else "") + ")"
                + (f"; BROKEN: {'; '.join(bad)}" if bad else ""))
    else:
        held = (f", index.faiss {faiss_file.stat().st_size / 1e6:,.1f} MB" if faiss_file.exists() else
                ", index.faiss MISSING")
    fields = {
        "type": f"{meta.get('factory')} ({meta.get('metric')})",
        "vectors": f"{_n(meta.get('ntotal'))} x dim {meta.get('dim')}" + held,
        "model": _model_line(model),
        "corpus": f"{meta.get('corpus')} ({meta.get('variant')}, fingerprint {meta.get('corpus_fingerprint')})",
        "documents encoded in": f"{meta.get('precision_resolved') or meta.get('precision') or 'fp32'}"
                                + (f" by {meta['backend_resolved']}" if meta.get("backend_resolved") else "")
                                + (f" (encode.precision={meta['precision']})" if meta.get("precision_resolved")
                                   and meta.get("precision") != meta.get("precision_resolved") else ""),
        "queries encoded in": f"{meta.get('query_precision') or 'fp32'} by torch (retrieve, Searcher and QueryEncoder alike, whatever "
                              "the documents' precision)",
    }
    if (d / "index").exists() and (d / "docid").exists():
        fields["pyserini"] = "index + docid present (FaissSearcher layout)"
    return {"kind": "index", "fields": fields}


def _checkpoint(d: Path) -> dict | None:
    from .models.checkpoint import read_state

    if not (d / "state.json").exists():
        return None
    state = read_state(d)
    raw = state or _json(d / "state.json") or {}
    fields = {"step": f"{raw.get('step')} of {raw.get('total_steps')} (epoch {raw.get('epoch')})",
              "complete": "yes" if state else "NO (a file it lists is missing or has another size)"}
    if raw.get("metrics"):
        fields["metrics"] = _train_metrics(raw["metrics"])
    return {"kind": "checkpoint", "fields": fields}


def _training(d: Path) -> dict | None:
    from .models.checkpoint import CHECKPOINT_RE, list_checkpoints

    steps = [c for c in d.iterdir() if c.is_dir() and CHECKPOINT_RE.match(c.name)] if d.is_dir() else []
    summary = _json(d / "summary.json")
    summary = summary if isinstance(summary, dict) and "method" in summary else None
    if not steps and summary is None and not ((d / "config.yaml").exists() and (d / "examples").is_dir()):
        return None
    complete = list_checkpoints(d)
    fields: dict = {}
    method = summary.get("method") if summary else None
    if method is None and (d / "config.yaml").exists():
        import yaml

        try:
            method = ((yaml.safe_load((d / "config.yaml").read_text()) or {}).get("loss") or {}).get("name")
        except yaml.YAMLError:
            method = None
    fields["method"] = method or "?"
    if summary:
        fields["steps"] = f"{summary.get('steps')} of {summary.get('total_steps')} (finished" + (
            ", stopped early)" if summary.get("stopped_early") else ")")
        fields["batch"] = f"{summary.get('global_batch')} ({summary.get('world_size')} worker(s) x " \
                          f"{summary.get('batch_per_worker')}), {_n(summary.get('examples'))} examples"
        if summary.get("final_metrics"):
            fields["final metrics"] = _train_metrics(summary["final_metrics"])
        fields["wall time"] = f"{summary.get('wall_seconds')} s"
        if summary.get("precision") or summary.get("attention"):
            fields["trained in"] = ", ".join(
                ([summary["precision"]] if summary.get("precision") else [])
                + ([f"attention {summary['attention']}"] if summary.get("attention") else []))
    elif complete:
        from .models.checkpoint import read_state

        st = read_state(complete[-1][1]) or {}
        fields["steps"] = f"{st.get('step')} of {st.get('total_steps')} done (not finished: `pipeline train` with " \
                          "the same config resumes)"
        if st.get("metrics"):
            fields["last metrics"] = _train_metrics(st["metrics"])
    else:
        fields["steps"] = "no complete checkpoint yet"
    fields["checkpoints"] = (", ".join(p.name for _, p in complete[-3:]) + (f" ({len(complete)} complete)"
                             if len(complete) > 3 else "")) if complete else "none complete"
    if len(steps) > len(complete):
        fields["checkpoints"] += f"; {len(steps) - len(complete)} incomplete"
    model = d / "model"
    fields["final model"] = str(model) if model.is_dir() and summary else (
        f"{model} (present, but no summary.json yet)" if model.is_dir() else "not exported yet")
    return {"kind": "training run", "fields": fields}


def _sweep(d: Path) -> dict | None:
    summary = _json(d / "summary.json")
    if isinstance(summary, dict) and "trials" in summary and "statuses" in summary:
        best = summary.get("best") or {}
        fields = {"trials": f"{summary['trials']} (" + ", ".join(f"{k} {v}" for k, v in summary["statuses"].items()
                                                               if v) + ")",
                  "metric": f"{summary.get('metric')} ({summary.get('mode')})"}
        if best:
            fields["best"] = f"{best.get('trial')}: {summary.get('metric')} {best.get('metric')} at step " \
                             f"{best.get('steps')}, " + ", ".join(f"{k}={v}" for k, v in (best.get("params") or {}).items())
            if (d / "best.yaml").exists():
                fields["best config"] = str(d / "best.yaml")
        return {"kind": "sweep", "fields": fields}
    events = d / "events.jsonl"
    if events.exists():
        trials, results = set(), 0
        for line in events.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if isinstance(e, dict):
                trials.add(e.get("trial"))
                results += e.get("event") == "result"
        return {"kind": "sweep", "fields": {"trials": f"{len(trials - {None})} seen, {results} results reported",
                                            "state": "running or interrupted (no summary.json yet; "
                                                     "`pipeline tune --resume` continues it)"}}
    return None


def _model(d: Path) -> dict | None:
    modules = _json(d / "modules.json")
    if isinstance(modules, list):
        kinds = [str(m.get("type", "?")).rsplit(".", 1)[-1] for m in modules if isinstance(m, dict)]
        fields = {"format": "sentence-transformers", "modules": " -> ".join(kinds)}
        for m in modules:
            if isinstance(m, dict) and str(m.get("type", "")).endswith("Pooling"):
                pool = _json(d / m.get("path", "") / "config.json") or {}
                mode = [k[len("pooling_mode_"):] for k, v in pool.items() if k.startswith("pooling_mode_") and v]
                fields["pooling"] = ", ".join(mode) or "?"
                if pool.get("word_embedding_dimension"):
                    fields["dim"] = pool["word_embedding_dimension"]
        st = _json(d / "sentence_bert_config.json") or {}
        if st.get("max_seq_length"):
            fields["max length"] = st["max_seq_length"]
        return {"kind": "model", "fields": fields}
    cfg = _json(d / "config.json")
    if isinstance(cfg, dict) and ("model_type" in cfg or "architectures" in cfg):
        return {"kind": "model", "fields": {"format": "Hugging Face", "type": cfg.get("model_type"),
                                            "hidden size": cfg.get("hidden_size")}}
    if (d / "biencoder.json").exists():
        return {"kind": "model", "fields": {"format": "pipeline (older layout: biencoder.json)"}}
    return None


FOLDER_KINDS = (_corpus, _embeddings, _index, _training, _checkpoint, _sweep, _model)


# --------------------------------------------------------------------------- files


def _trec_file(p: Path) -> dict | None:
    """A TREC run (6 columns) or qrels (4 columns): counted by streaming the file."""
    try:
        with open(p, encoding="utf-8") as f:
            first = f.readline().split()
            if len(first) not in (4, 6):
                return None
            n, per_q, docs = 0, {}, set()
            f.seek(0)
            for line in f:
                parts = line.split()
                if not parts:
                    continue
                if len(parts) != len(first):
                    return None
                n += 1
                per_q[parts[0]] = per_q.get(parts[0], 0) + 1
                if len(first) == 4:
                    docs.add(parts[2])
    except (OSError, UnicodeDecodeError):
        return None
    if len(first) == 6:
        if first[1] != "Q0":
            return None
        fields = {"queries": _n(len(per_q)), "rows": _n(n),
                  "depth": f"{max(per_q.values(), default=0)} per query at most"
                           + (f" ({min(per_q.values())} at least)" if per_q else "")}
        meta = _json(Path(str(p) + ".meta.json"))
        if isinstance(meta, dict):
            model = meta.get("model") if isinstance(meta.get("model"), dict) else {}
            if meta.get("index") or model.get("name") != "bm25":
                fields["index"] = meta.get("index")
            else:  # a BM25 run (pipeline bm25): no index, its scorer instead
                fields["scored by"] = (f"BM25 ({model.get('library')}, {model.get('method')}, k1 {model.get('k1')}, "
                                       f"b {model.get('b')})")
            searched = meta.get("n_queries")
            if isinstance(searched, int) and searched > len(per_q):
                fields["queries"] += f" of {_n(searched)} searched ({_n(searched - len(per_q))} with no hit)"
            if meta.get("qrels"):
                fields["queries judged in"] = meta.get("qrels")
            fields["queries from"] = meta.get("queries")
            fields["corpus"] = f"{meta.get('variant')} (fingerprint {meta.get('corpus_fingerprint')})"
        return {"kind": "run", "fields": fields}
    return {"kind": "qrels", "fields": {"queries": _n(len(per_q)), "judgements": _n(n), "documents": _n(len(docs))}}


def _json_file(p: Path) -> dict | None:
    data = _json(p)
    if not isinstance(data, dict):
        return None
    if "runs" in data and "baseline" in data:
        return {"kind": "comparison (pipeline compare)", "fields": {
            "runs": ", ".join(data["runs"]), "baseline": data["baseline"], "qrels": data.get("qrels"),
            "queries": data.get("queries"), "tests": ", ".join(data.get("tests") or []),
            **{f"{label}": _fmt_metrics(m) for label, m in (data.get("metrics") or {}).items()}}}
    if isinstance(data.get("metrics"), dict):
        fields = {"metrics": _fmt_metrics(data["metrics"])}
        if isinstance(data.get("queries"), dict):
            fields["queries"] = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in data["queries"].items())
        for k in ("run", "qrels", "qa"):
            if data.get(k):
                fields[k] = data[k]
        return {"kind": "metrics (pipeline evaluate)", "fields": fields}
    if {"spearman", "pearson", "pairs"} <= set(data):
        return {"kind": "metrics (pipeline sts)", "fields": {
            "Spearman": f"{100 * data['spearman']:.2f}", "Pearson": f"{100 * data['pearson']:.2f}",
            "pairs": data["pairs"], "model": data.get("model")}}
    if "trials" in data and "statuses" in data:
        return _sweep(p.parent)
    if "method" in data and "steps" in data:
        return _training(p.parent)
    if "parts" in data and "variant" in data:
        return _corpus(p.parent)
    if "ntotal" in data:
        return _index(p.parent)
    if "shard_names" in data:
        return _embeddings(p.parent)
    return None


# --------------------------------------------------------------------------- entry points


def describe(path: str | Path, depth: int = 2) -> list[dict]:
    """[{path, kind, fields}] for `path` itself, or for what a plain folder holds (`depth` levels
    down, at most 500 entries a folder)."""
    p = Path(path)
    if not p.exists():
        raise PipelineError(f"{p}: no such file or folder")
    if p.is_file():
        found = (_json_file(p) if p.suffix == ".json" else None) or _trec_file(p)
        return [{"path": str(p), **found}] if found else []
    out = []
    for fn in FOLDER_KINDS:
        found = fn(p)
        if found:
            out.append({"path": str(p), **found})
            break
    if out and out[0]["kind"] in ("embeddings", "index", "checkpoint", "model", "sweep", "training run"):
        return out
    if depth < 1:
        return out
    import itertools

    for child in sorted(itertools.islice(p.iterdir(), 500)):  # what a project (or corpus) folder holds
        if child.name.startswith(".") or child.name in ("corpus", "model", "examples", "plots", "qrels"):
            continue
        if child.is_dir():
            for fn in FOLDER_KINDS:
                found = fn(child)
                if found:
                    out.append({"path": str(child), **found})
                    break
            else:
                out += describe(child, depth - 1) if depth > 1 else []
        elif child.suffix == ".json" and not child.name.endswith(".meta.json") and child.name not in (
                "manifest.json", "summary.json"):
            found = _json_file(child)
            if found:
                out.append({"path": str(child), **found})
        elif child.suffix in (".trec", ".run", ".txt", ".tsv", "") and child.stat().st_size < 2e9 \
                and child.name not in ("queries.tsv", "pids.txt"):
            found = _trec_file(child)
            if found:
                out.append({"path": str(child), **found})
    return out


def format_info(items: list[dict]) -> str:
    lines = []
    for it in items:
        lines.append(f"{it['path']}  [{it['kind']}]")
        width = max((len(k) for k in it["fields"]), default=0)
        for k, v in it["fields"].items():
            lines.append(f"  {k.ljust(width)}  {v}")
    return "\n".join(lines)


def info(path: str | Path) -> str:
    items = describe(path)
    if not items:
        kind = "file" if Path(path).is_file() else "folder"
        raise PipelineError(f"{path}: not a {kind} this tool recognises; looked for " + "; ".join(LOOKED_FOR))
    return format_info(items)
