"""Batches capped by padded tokens on a CPU, and validation inside training against encode's encoder.

Side by side in one process, same model, threads, precision and tokens: passages/s of

  1. our torch encoder (`BiEncoder.embed_tokens`) with 64-row batches (rows only, what every CPU run did
     before `CPU_BATCH_TOKENS`) and with the padded-token cap (several caps);
  2. the same for OpenVINO's tower (`encode.backend=auto` on a CPU);
  3. sentence-transformers' `encode` on the same model and texts (batch 64, its own length sort);

on three corpora: the bundled FAQ's 176 passages (7-256 tokens, the demo's validation set), 1,500
FAQ-like passages (lengths drawn from the FAQ's, words from it) and 3,000 short ones (40-80 words)
(`--sizes`). The default cap depends on the threads (`cpu_batch_tokens`: half on one thread).
Then validation inside training (`Validator`: the encoder it picks, its own rate, any conversion
included; several validations with the weights changing between them, as in a run: the first converts
the model for OpenVINO, or reads the architecture's graph from the export cache, the later ones write the
weights in; OpenVINO rows for an empty cache and for the graph a first run kept there) against the steady
rate of the encoder `pipeline encode` runs on the same passages, on the FAQ and on the FAQ with distractors
up to 1,500 passages.

    python bench/batching.py                 # MiniLM, 2 threads, precision auto
    python bench/batching.py --precision fp32 --caps 2048,4096,8192
    python bench/batching.py --threads 1 --caps 1024,4096 --sizes 400,600 --skip-st --dev-sizes ''   # one worker's thread
"""

from __future__ import annotations

from machine import print_cpu  # bench/machine.py (run as python bench/<name>.py)

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def faq_corpus(folder: Path) -> Path:
    from pipeline.data.bundled import python_faq_dir
    from pipeline.data.ingest import ingest

    out = folder / "faq"
    ingest([python_faq_dir()], "beir", out, progress=False)
    return out


def corpus_texts(corpus: Path) -> list[str]:
    import pyarrow.parquet as pq

    from pipeline.data.manifest import join_title, load_manifest

    manifest, texts = load_manifest(corpus), []
    for part in manifest["parts"]:
        t = pq.read_table(corpus / part["file"])
        texts += [join_title(a, b, manifest["title_join"]) for a, b in zip(t["title"].to_pylist(), t["text"].to_pylist())]
    return texts


def synthetic(texts: list[str], n: int, short: bool) -> list[str]:
    import numpy as np

    rng = np.random.default_rng(0)
    words = " ".join(texts).split()
    sizes = rng.integers(40, 81, n) if short else rng.choice([len(t.split()) for t in texts], n)
    return [" ".join(words[s:s + k]) for s, k in zip(rng.integers(0, len(words) - 300, n), sizes)]


def best_rate(fn, n: int, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return n / min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--precision", default="auto", help="auto (bf16 where native), fp32 or bf16")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=64, help="rows per batch (the row cap)")
    ap.add_argument("--caps", default="2048,4096,8192", help="padded-token caps to compare with rows only")
    ap.add_argument("--rounds", type=int, default=2, help="each row measured this many times, best kept")
    ap.add_argument("--skip-st", action="store_true", help="no sentence-transformers row")
    ap.add_argument("--dev-sizes", default="176,1500", help="validation sets: the FAQ, then with distractors up to n")
    ap.add_argument("--validations", type=int, default=4,
                    help="validations per run (OpenVINO: the first converts or reads the cached graph, the later ones write "
                         "the weights in)")
    ap.add_argument("--skip-encoders", action="store_true", help="only the validation rows")
    ap.add_argument("--sizes", default="1500,3000",
                    help="the encoder rows' synthetic corpora: FAQ-like passages, short passages (0: left out)")
    args = ap.parse_args()

    import torch

    from pipeline.config import ModelConfig
    from pipeline.models.backends import openvino_available, tower_runner
    from pipeline.models.encoder import BiEncoder
    from pipeline.models.precision import resolve_precision
    from pipeline.models.tokens import cpu_batch_tokens

    print_cpu()
    torch.set_num_threads(args.threads)
    precision = resolve_precision(args.precision, "cpu")
    default_cap = cpu_batch_tokens(args.threads)
    caps = sorted({int(c) for c in args.caps.split(",") if c} | {default_cap})
    model = BiEncoder.load(ModelConfig(name_or_path=args.model))
    print(f"model {args.model}, {args.threads} threads, precision {precision}, row cap {args.batch}, "
          f"default token cap {default_cap:,}, best of {args.rounds}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = faq_corpus(Path(tmp))
        faq = corpus_texts(corpus)
        with torch.inference_mode(), model.inference_lengths():
            # OpenVINO's tower of the model as loaded: the encoder `pipeline encode` runs on a CPU
            runner = tower_runner(model, "doc", "openvino", precision, args.threads, "cpu", keep=False)[1] \
                if openvino_available() else None
            if not args.skip_encoders:
                like, short = (int(x) for x in args.sizes.split(","))
                sets = [("FAQ passages", faq)] + ([(f"FAQ-like x{like:,}", synthetic(faq, like, False))] if like else []) \
                    + ([(f"short x{short:,} (40-80 words)", synthetic(faq, short, True))] if short else [])
                encoder_rows(model, runner, sets, caps, precision, args)
        validation_against_encode(model, runner, corpus, args, [int(x) for x in args.dev_sizes.split(",") if x])


def encoder_rows(model, runner, sets, caps: list[int], precision: str, args) -> None:
    """Per corpus: torch's and OpenVINO's rates with rows-only batches and each cap, and sentence-transformers'."""
    from pipeline.models.tokens import tokenize_sorted

    for name, texts in sets:
        tok, prefix, max_len = model.token_spec("doc")
        tokens = tokenize_sorted(tok, texts, prefix, max_len)
        print(f"\n{name}: {len(texts):,} passages, {int(tokens['lengths'].sum()):,} tokens "
              f"({int(tokens['lengths'].min())}-{int(tokens['lengths'].max())} per passage)")
        print(f"  {'encoder':<30}{'rows only':>11}" + "".join(f"{f'cap {c:,}':>19}" for c in caps))
        backends = [("torch " + precision, None)] + ([(f"openvino {runner.precision}", runner)] if runner else [])
        for label, run in backends:
            rates = {cap: best_rate(lambda cap=cap: model.embed_tokens(tokens, "doc", args.batch, "cpu", precision,
                                                                       run, max_tokens=cap), len(texts), args.rounds)
                     for cap in [0] + caps}
            print(f"  {label:<30}{rates[0]:>9.1f}/s" + "".join(f"{rates[c]:>10.1f}/s ({rates[c] / rates[0]:.2f}x)"
                                                             for c in caps), flush=True)
        if not args.skip_st:
            st_rate = st_encode_rate(args.model, texts, args.batch, precision, args.rounds)
            print(f"  {'sentence-transformers encode':<30}{st_rate:>9.1f}/s (batch {args.batch}, its own "
                  f"length sort{', bf16 autocast' if precision == 'bf16' else ''})", flush=True)


def st_encode_rate(model_name: str, texts: list[str], batch: int, precision: str, rounds: int) -> float:
    import contextlib

    import torch
    from sentence_transformers import SentenceTransformer

    from pipeline.models.loading import resolve_model_path

    st = SentenceTransformer(str(resolve_model_path(model_name)), device="cpu")
    st.max_seq_length = 256
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" else contextlib.nullcontext

    def run():
        with ctx():
            st.encode(texts, batch_size=batch, show_progress_bar=False)
    return best_rate(run, len(texts), rounds)


def dev_set_with_distractors(folder: Path, n: int) -> Path:
    """The FAQ with FAQ-like distractor passages up to `n` passages (same queries and qrels)."""
    import json
    import shutil

    from pipeline.data.bundled import python_faq_dir
    from pipeline.data.ingest import ingest

    src, beir = python_faq_dir(), folder / f"faq-{n}-beir"
    shutil.copytree(src / "qrels", beir / "qrels")
    shutil.copy(src / "queries.jsonl", beir / "queries.jsonl")
    lines = (src / "corpus.jsonl").read_text().splitlines()
    texts = [json.loads(line)["text"] for line in lines]
    extra = synthetic(texts, max(0, n - len(lines)), False)
    (beir / "corpus.jsonl").write_text("\n".join(lines + [json.dumps({"_id": f"x-{i}", "title": "", "text": t})
                                                          for i, t in enumerate(extra)]) + "\n")
    out = folder / f"faq-{n}"
    ingest([beir], "beir", out, progress=False)
    return out


def validation_against_encode(model, runner, corpus: Path, args, sizes: list[int]) -> None:
    """Validations as a run makes them (one Validator, the model changing between them), against the steady
    rate of the encoder `pipeline encode` runs (`runner`: OpenVINO's tower where installed) on the same passages."""
    import torch

    from pipeline.index.validate import Validator
    from pipeline.models.precision import resolve_precision
    from pipeline.models.tokens import tokenize_sorted

    if not sizes:
        return
    precision = resolve_precision(args.precision, "cpu")
    print(f"\nvalidation inside training (one Validator, {args.validations} validations, the weights nudged between "
          "them as training would; rate with any conversion included) against encode's encoder steady on the same "
          "passages:")
    for n in sizes:
        dev = corpus if n <= 176 else dev_set_with_distractors(corpus.parent, n)
        texts = corpus_texts(dev)
        with torch.inference_mode(), model.inference_lengths():
            tok, prefix, max_len = model.token_spec("doc")
            tokens = tokenize_sorted(tok, texts, prefix, max_len)
            encode_rate = best_rate(lambda: model.embed_tokens(tokens, "doc", args.batch, "cpu", precision, runner),
                                    len(texts), args.rounds)
        print(f"  {len(texts):,} passages: encode's encoder ({'openvino' if runner else 'torch'} {precision}) "
              f"{encode_rate:.1f}/s")
        kept = {k: v.detach().clone() for k, v in model.state_dict().items()}
        # OpenVINO: a first run of the architecture (an empty export cache: converted at the first validation)
        # and a later one (its graph kept in the cache by the first: nothing converted)
        caches, saved_cache = {}, os.environ.get("PIPELINE_EXPORT_CACHE")
        # (auto on an empty cache converts only from OPENVINO_MIN_PASSAGES; its "cached" row reads the graph
        # the openvino rows kept, as a later run reads what `pipeline encode` or an earlier run kept)
        for backend, graph in (("openvino", "cold"), ("openvino", "cached"), ("auto", "cold"), ("auto", "cached"),
                               ("torch", None)):
            if graph == "cold":
                caches[backend] = tempfile.mkdtemp(prefix="bench-export-cache-")
            if graph:
                os.environ["PIPELINE_EXPORT_CACHE"] = caches["openvino" if graph == "cached" else backend]
            validator = Validator(str(dev), qrels=str(dev / "qrels" / "test.trec"), metric="nDCG@10",
                                  batch_size=args.batch, precision=args.precision, backend=backend)
            generator = torch.Generator().manual_seed(0)
            rates = []
            for _ in range(args.validations):
                result = validator(model, device="cpu")
                rates.append(result["validation_rate"])
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(torch.randn(p.shape, generator=generator) * 1e-3)
            model.load_state_dict(kept)
            cells = [("first", rates[:1]), ("second", rates[1:2]), ("later", rates[2:])]
            row = f"{backend} ({'graph ' + graph if graph else 'no graph'})"
            print(f"    validation.backend={row:<23}" + "".join(
                f" {label} {sum(r) / len(r):5.1f}/s ({sum(r) / len(r) / encode_rate:.2f}x)," for label, r in cells if r)
                + f"  last nDCG@10 {result['val_metric']:.4f}  ({result['validation_encoder']})", flush=True)
        for folder in caches.values():  # the bench's own caches (a graph each), not the user's
            shutil.rmtree(folder, ignore_errors=True)
        if saved_cache is None:
            os.environ.pop("PIPELINE_EXPORT_CACHE", None)
        else:
            os.environ["PIPELINE_EXPORT_CACHE"] = saved_cache


if __name__ == "__main__":
    main()
