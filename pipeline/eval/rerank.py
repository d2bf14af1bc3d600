"""`pipeline rerank`: a run's (query, passage) pairs scored by a cross-encoder, written as a TREC run (#62).

The cross-encoder is a Hugging Face sequence-classification model in a local folder, as sentence-transformers'
`CrossEncoder` loads it (`AutoModelForSequenceClassification` + its tokenizer; nothing is downloaded). A pair is
the query and the passage (title-joined as the corpus's manifest says), tokenised as one sequence pair cut to
`--max-length` tokens (the passage is cut first); its score is the model's logit (one label), or the log-odds of
the last label against the first (two labels). Each query's passages are sorted by that score (ties by docid) and
cut to `--top-k` (default: every passage the run ranked), so the output is a reranked run that `evaluate` and
`compare` take as any run, and a teacher's scores for distillation (`data.teacher_scores`, format trec).

Batched (`--batch-size` pairs a forward pass) and resumable: queries are written, whole, to
`<out>.rerank-partial/scored.trec` as they are done, beside a `state.json` naming the run, the corpus, the queries
and the model by digest; a killed rerank run again with the same inputs scores only the queries not yet written,
and one with other inputs is refused. The output appears, atomically, when every query is scored.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from ..errors import ConfigError, InputError, PipelineError


def _state_key(run, corpus, queries, model_dir, max_length: int, top_k: int) -> dict:
    from ..data.manifest import load_manifest
    from ..io_utils import sha256_file
    from ..models.loading import model_digest

    return {"run": sha256_file(run), "corpus_fingerprint": load_manifest(corpus)["fingerprint"],
            "queries": sha256_file(queries), "model": model_digest(Path(model_dir)), "max_length": max_length,
            "top_k": top_k}


def load_cross_encoder(model_dir: str | Path, device: str = "cpu"):
    """(tokenizer, model) of a local sequence-classification folder; a folder that is not one is refused."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise InputError(path, None, "not a model folder (no config.json): give a local cross-encoder folder "
                                     "(a Hugging Face sequence-classification model, as CrossEncoder saves it)")
    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    if not getattr(config, "architectures", None) or not any("SequenceClassification" in a
                                                              for a in config.architectures):
        raise InputError(path, None, f"not a sequence-classification model (architectures {config.architectures}); "
                                     "a cross-encoder scores (query, passage) pairs with a classification head")
    if config.num_labels not in (1, 2):
        raise InputError(path, None, f"{config.num_labels} labels; a cross-encoder for ranking has 1 (a score) or 2")
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(str(path), local_files_only=True).to(device).eval()
    return tok, model


def score_pairs(tok, model, queries: list[str], passages: list[str], max_length: int, device: str = "cpu"):
    """The cross-encoder's score of each (query, passage) pair (a list of floats)."""
    import torch

    enc = tok(queries, passages, truncation="only_second", max_length=max_length, padding=True,
              return_tensors="pt")
    with torch.inference_mode():
        logits = model(**{k: v.to(device) for k, v in enc.items()}).logits.float()
    out = logits[:, 0] if logits.shape[1] == 1 else logits[:, -1] - logits[:, 0]
    return out.cpu().tolist()


def rerank(run: str | Path, corpus: str | Path, queries: str | Path, model_dir: str | Path, out: str | Path,
           batch_size: int = 32, max_length: int = 512, top_k: int = 0, device: str = "cpu", overwrite: bool = False,
           tag: str = "rerank", progress: bool = True) -> dict:
    """Score every (query, passage) pair of `run` with the cross-encoder (see the module doc)."""
    from ..data.corpus import fetch_passages
    from ..data.readers import load_queries
    from ..eval.runs import read_run
    from ..io_utils import atomic_path, check_output, write_json_atomic

    if batch_size < 1 or max_length < 8:
        raise ConfigError("--batch-size >= 1 and --max-length >= 8")
    check_output(out, "run", overwrite=overwrite)
    t0 = time.time()
    ranked = read_run(run)
    qtexts = load_queries(queries)
    missing = [q for q in ranked if q not in qtexts]
    if missing:
        raise InputError(queries, None, f"{len(missing)} of the run's queries are not in it, e.g. {missing[0]!r}")
    partial = Path(str(out) + ".rerank-partial")
    key = _state_key(run, corpus, queries, model_dir, max_length, top_k)
    done: set[str] = set()
    if partial.exists():
        try:
            state = json.loads((partial / "state.json").read_text())
        except (OSError, ValueError):
            state = None
        if state != key:
            raise PipelineError(f"{partial}: a killed rerank of other inputs (run, corpus, queries, model or "
                                "settings); remove it to start again, or give another --out")
        scored = partial / "scored.trec"
        if scored.exists():  # whole queries only: a query is written in one go; a torn last line is cut
            text = scored.read_text(encoding="utf-8")
            text = text[: text.rfind("\n") + 1]
            lines = text.splitlines()
            qids = [ln.split()[0] for ln in lines]
            last = qids[-1] if qids else None
            want = {q: len(d) if not top_k else min(top_k, len(d)) for q, d in ranked.items()}
            if last is not None and qids.count(last) != want.get(last):
                lines = [ln for ln, q in zip(lines, qids) if q != last]  # a query cut short: scored again
            scored.write_text("".join(ln + "\n" for ln in lines), encoding="utf-8")
            done = {ln.split()[0] for ln in lines}
    else:
        partial.mkdir(parents=True)
        write_json_atomic(partial / "state.json", key)
    todo = [q for q in ranked if q not in done]
    tok, model = load_cross_encoder(model_dir, device)
    texts = fetch_passages(corpus, {d for q in todo for d in ranked[q]}, join=None)
    absent = sorted({d for q in todo for d in ranked[q] if d not in texts})
    if absent:
        raise InputError(run, None, f"{len(absent)} passages of the run are not in the corpus {corpus}, e.g. "
                                    f"{absent[0]!r}: a run of another corpus")
    pairs = sum(len(ranked[q]) for q in todo)
    n, t_score = 0, time.time()
    with open(partial / "scored.trec", "a", encoding="utf-8") as f:
        for i, q in enumerate(todo, 1):
            docs = sorted(ranked[q])
            scores = []
            for s in range(0, len(docs), batch_size):
                chunk = docs[s:s + batch_size]
                scores += score_pairs(tok, model, [qtexts[q]] * len(chunk), [texts[d] for d in chunk], max_length,
                                      device)
            order = sorted(zip(docs, scores), key=lambda x: (-x[1], x[0]))
            if top_k:
                order = order[:top_k]
            f.write("".join(f"{q} Q0 {d} {r} {s:.6f} {tag}\n" for r, (d, s) in enumerate(order, 1)))
            f.flush()
            os.fsync(f.fileno())
            n += len(docs)
            if progress and (i == len(todo) or i % 50 == 0):
                rate = n / max(time.time() - t_score, 1e-9)
                eta = (pairs - n) / max(rate, 1e-9)
                print(f"[rerank] {i:,}/{len(todo):,} queries, {n:,}/{pairs:,} pairs, {rate:.0f} pairs/s, "
                      f"ETA {eta:.0f}s", flush=True)
    with atomic_path(out) as tmp:
        shutil.copyfile(partial / "scored.trec", tmp)
    meta = {"reranked": str(Path(run).resolve()), "model": str(Path(model_dir).resolve()), "model_digest": key["model"],
            "corpus_fingerprint": key["corpus_fingerprint"], "queries": str(Path(queries).resolve()),
            "n_queries": len(ranked), "top_k": top_k or None, "max_length": max_length,
            "resumed_queries": len(done), "seconds": round(time.time() - t0, 2)}
    write_json_atomic(str(out) + ".meta.json", meta)
    shutil.rmtree(partial, ignore_errors=True)
    if progress:
        print(f"[rerank] done: {len(ranked):,} queries ({len(done):,} from a killed run), {pairs:,} pairs scored in "
              f"{time.time() - t0:.1f}s -> {out}", flush=True)
    return meta
