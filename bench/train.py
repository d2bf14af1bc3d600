"""Training speed: our loop vs a plain PyTorch loop, DAR vs DPR step cost, and `pipeline train` vs
sentence-transformers' own trainer.

Prints, from one run on the same machine (each measurement in a fresh subprocess):
  (a) steps/s of `pipeline.train` (Ray Train, 1 worker) vs a plain single-process loop
      doing the same steps (same model, batch, lengths, threads, loss), and the ratio;
  (b) DAR step time / DPR step time in the plain loop (paper: 1.11x), and the peak memory
      of each (CUDA max allocated on GPU, peak RSS on CPU) with their ratio.

    python bench/train.py                 # tiny random BERT (hidden 256, 4 layers), CPU
    python bench/train.py --model minilm --steps 20

With --vs-st: fine-tuning MiniLM on the bundled FAQ's training pairs as whole processes, as users run
them, side by side: sentence-transformers' SentenceTransformerTrainer with MultipleNegativesRankingLoss
(fp32, and bf16=True where the CPU has native bf16) against `pipeline train` (DPR, cos/0.05 = MNRL's scale
20; fp32, its default train.amp=auto, the defaults with train.attention=sdpa (the attention lever apart), and
bf16 where native) at the same pairs, batch, lengths, learning rate, warmup, gradient clipping, epochs and threads. Each row: whole-process wall, training seconds,
steps/s, examples/s, GFLOP/s of the training against this CPU's measured matmul peak, and the fine-tuned
model's test nDCG@10 (every model encoded and searched the same way), and the padding share of its
document batches as that trainer pads them (sentence-transformers: each batch to its longest text, counted
in its data collator; ours: length-sorted groups of train.length_group_rows, counted from the run's batch
log). Two training sets, `--sets faq,long` (the default, both):
  faq   the FAQ's question -> answer pairs (answers of 7 to 940 tokens, many short: much padding);
  long  abstract-length documents (`--long-tokens 200,256`): each FAQ answer followed by the answers after
        it, cut at a length drawn per document between the two bounds (built from the shipped FAQ: no data
        outside the repository); or, with `--corpus BEIR_FOLDER`, a BEIR folder of yours (corpus.jsonl,
        queries.jsonl, qrels/train.tsv and qrels/test.tsv, e.g. NFCorpus), its `--positives-per-query`
        highest-graded positives per training query (default 1).

    python bench/train.py --vs-st --epochs 10
    python bench/train.py --vs-st --sets long --corpus ~/data/nfcorpus --epochs 1
"""

from __future__ import annotations

from machine import print_cpu, scratch  # bench/machine.py (run as python bench/<name>.py)

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
WORDS = ("the of and to in is was for on as with by he at from his an were are which this be has or had "
         "python retrieval dense passage query index vector model train encoder ray data shard corpus").split()


def make_corpus(folder: Path, n: int) -> Path:
    from pipeline.data.ingest import ingest

    rng = random.Random(0)
    (folder / "collection.tsv").write_text("".join(
        f"{i}\t{' '.join(rng.choice(WORDS) for _ in range(rng.randint(40, 90)))}\n" for i in range(n)))
    (folder / "queries.tsv").write_text("".join(
        f"q{i}\t{' '.join(rng.choice(WORDS) for _ in range(8))}\n" for i in range(n)))
    (folder / "qrels.trec").write_text("".join(f"q{i} 0 {i} 1\n" for i in range(n)))
    out = folder / "corpus"
    ingest([folder / "collection.tsv"], "msmarco", out, queries=folder / "queries.tsv",
           qrels={"train": folder / "qrels.trec"}, progress=False)
    return out


def job_overrides(args, corpus: Path, storage: Path, loss: str, name: str) -> list[str]:
    return [f"model.name_or_path={args.model_dir}", "model.pooling=mean", f"model.query_max_length={args.qlen}",
            f"model.doc_max_length={args.dlen}", f"data.corpus={corpus}", f"loss.name={loss}",
            f"train.batch_size={args.batch}", f"train.max_steps={args.steps}", "train.num_workers=1",
            "train.cpus_per_worker=1", f"train.torch_threads={args.threads}", f"train.storage_path={storage}",
            f"train.name={name}", f"train.report_every={args.steps}", "data.shuffle_window=1", "optim.lr=1e-4"]


def plain(args, loss_name: str) -> dict:
    """The same steps as the Ray loop, in one process: tokenise, forward, loss, backward, step."""
    import torch

    from pipeline.losses import get_loss
    from pipeline.losses.dist import gather_docs
    from pipeline.models import BiEncoder
    from pipeline.train.config import load_train_config
    from pipeline.train.optim import build_optimizer, warmup_linear
    from pipeline.train.trainer import resolve_job

    job = resolve_job(load_train_config(None, job_overrides(args, Path(args.ingested), Path(args.storage), loss_name,
                                                            "plain")), progress=False)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from pipeline.data.training import build_examples

    build_examples(job.data, Path(args.storage) / "plain_examples", progress=False)
    from pipeline.data.training import read_examples_table

    rows = read_examples_table(Path(args.storage) / "plain_examples").to_pylist()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = BiEncoder.load(job.model).to(device).train()
    opt = build_optimizer(model.parameters(), job.optim)
    sched = warmup_linear(opt, 0, args.steps)
    fn = get_loss(loss_name)
    B = args.batch
    times = []
    for step in range(args.steps + args.warmup):
        batch = rows[(step * B) % (len(rows) - B):][:B]
        t0 = time.perf_counter()
        q_tok = {k: v.to(device) for k, v in model.tokenize([r["query"] for r in batch], "query").items()}
        d_tok = {k: v.to(device) for k, v in model.tokenize([r["positive"] for r in batch], "doc").items()}
        q, d = model(q_tok, d_tok)
        docs, pos_idx, G = gather_docs(d, None)
        loss, _ = fn(q, docs, pos_idx, job.loss, training=True, n_pos=G)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), job.optim.grad_clip)
        opt.step()
        sched.step()
        if device == "cuda":
            torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() if device == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {"steps_per_s": len(times) / sum(times), "step_s": sum(times) / len(times), "peak_bytes": peak,
            "memory": "cuda max allocated" if device == "cuda" else "peak RSS"}


def ray_loop(args) -> dict:
    import ray

    from pipeline.train.config import load_train_config
    from pipeline.train.trainer import train

    ray.init(num_cpus=2, include_dashboard=True, dashboard_host="127.0.0.1", log_to_driver=False,
             _node_ip_address="127.0.0.1")
    job = load_train_config(None, job_overrides(args, Path(args.ingested), Path(args.storage), "dpr", "ray")
                            + [f"train.max_steps={args.steps + args.warmup}"])
    s = train(job, progress=False)
    hist = [h for h in s["history"] if "loss" in h]
    # steady state: the loop's own clock for the last report window (excludes start-up and warm-up)
    return {"steps_per_s": hist[-1]["steps_per_s"], "loop_seconds": s["final_metrics"]["train_seconds"],
            "wall_seconds": s["wall_seconds"]}


# ------------------------------------------------------------------ vs sentence-transformers' trainer

ST_SCRIPT = """
import json, sys, time
t0 = time.time()
import torch
from datasets import Dataset
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])
pairs = json.load(open(cfg["pairs"]))
model = SentenceTransformer(cfg["model"], device="cpu")
model.max_seq_length = cfg["max_len"]
data = Dataset.from_dict({"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]})
args = SentenceTransformerTrainingArguments(output_dir=cfg["out"] + "/ckpt", num_train_epochs=cfg["epochs"],
    per_device_train_batch_size=cfg["batch"], learning_rate=cfg["lr"], warmup_steps=cfg["warmup"], max_grad_norm=cfg["clip"],
    bf16=cfg["bf16"], use_cpu=True, seed=0, dataloader_drop_last=True, save_strategy="no", report_to="none",
    logging_steps=10**6, disable_tqdm=True)
trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data,
                                     loss=MultipleNegativesRankingLoss(model, scale=1 / cfg["tau"]))
# the document batches' padding, counted where this trainer pads them: its data collator tokenises each
# column of a batch to the batch's longest text (the loader runs in this process: no workers)
padding = {"tokens": 0, "padded": 0}
class CountingCollator(type(trainer.data_collator)):
    def __call__(self, features):
        batch = super().__call__(features)
        mask = batch.get("positive_attention_mask")
        if mask is not None:
            padding["tokens"] += int(mask.sum())
            padding["padded"] += mask.numel()
        return batch
trainer.data_collator.__class__ = CountingCollator
t1 = time.time()
out = trainer.train()
t2 = time.time()
model.save(cfg["out"] + "/model")
print("RESULT " + json.dumps({"train_seconds": t2 - t1, "steps": out.global_step, "startup_seconds": t1 - t0,
                              "doc_tokens": padding["tokens"], "doc_padded": padding["padded"]}))
"""

SETS = ("faq", "long")


def long_faq(folder: Path, model_dir: str, lo: int, hi: int) -> Path:
    """A BEIR folder of abstract-length documents made from the shipped FAQ alone (no data outside the
    repository): document i is answer i followed by the answers after it (corpus order, wrapping round),
    cut at a token boundary where it reaches a length drawn for it (seeded) between `lo` and `hi` tokens of
    the model's tokenizer, special tokens included. The FAQ's queries and qrels as they are: each judged
    document starts with its own answer, so the test figures still mean something."""
    import shutil

    from transformers import AutoTokenizer

    from pipeline.data.bundled import python_faq_dir

    src = python_faq_dir()
    tok = AutoTokenizer.from_pretrained(model_dir)
    docs = [json.loads(line) for line in (src / "corpus.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    answers = [d["text"] for d in docs]
    rng = random.Random(0)
    special = tok.num_special_tokens_to_add()
    folder.mkdir(parents=True)
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as f:
        for i, doc in enumerate(docs):
            keep = rng.randint(lo, hi) - special
            text, j = answers[i], i + 1
            while len(tok(text, add_special_tokens=False, verbose=False)["input_ids"]) < keep:
                text += " " + answers[j % len(answers)]
                j += 1
            ends = tok(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]
            f.write(json.dumps({**doc, "text": text[:ends[keep - 1][1]]}) + "\n")
    shutil.copy(src / "queries.jsonl", folder / "queries.jsonl")
    shutil.copytree(src / "qrels", folder / "qrels")
    return folder


def beir_subset(src: Path, dst: Path, max_pairs: int, per_query: int = 0) -> Path:
    """`src` with only the judgements of its qrels/train.tsv that make the first `max_pairs` training pairs (a
    quick check): the first `max_pairs` judgements, or, with `per_query` positives per query, every judgement
    of the first ceil(max_pairs / per_query) queries (so the pairs drawn from them are the same for both
    trainers); the corpus and queries linked, the other qrels copied."""
    import shutil

    dst.mkdir(parents=True)
    for name in ("corpus.jsonl", "queries.jsonl"):
        os.symlink(src.resolve() / name, dst / name)
    shutil.copytree(src / "qrels", dst / "qrels")
    lines = (src / "qrels" / "train.tsv").read_text(encoding="utf-8").splitlines()
    header = lines[:1] if lines and not lines[0].split()[-1].lstrip("-").isdigit() else []
    body = lines[len(header):]
    if per_query:
        keep_q, kept = -(-max_pairs // per_query), []
        seen: list[str] = []
        for ln in body:
            q = ln.split()[0] if ln.split() else ""
            if q not in seen:
                if len(seen) == keep_q:
                    continue
                seen.append(q)
            kept.append(ln)
        body = kept
    else:
        body = body[:max_pairs]
    (dst / "qrels" / "train.tsv").write_text("".join(f"{ln}\n" for ln in header + body), encoding="utf-8")
    return dst


def training_set(src: Path, folder: Path, per_query: int) -> tuple[Path, Path]:
    """A BEIR folder ingested, and its training pairs (query, title-joined positive) as JSON: the examples
    `pipeline train` builds from the same corpus and settings, so both trainers see the same pairs."""
    from pipeline.data.ingest import ingest
    from pipeline.data.training import build_examples, read_examples_table
    from pipeline.train.config import TrainDataConfig

    corpus = folder / "corpus"
    ingest([src], "beir", corpus, progress=False)
    build_examples(TrainDataConfig(source="qrels", corpus=str(corpus), positives_per_query=per_query),
                   folder / "examples", progress=False)
    rows = read_examples_table(folder / "examples").to_pylist()
    (folder / "pairs.json").write_text(json.dumps([[r["query"], r["positive"]] for r in rows]))
    return corpus, folder / "pairs.json"


def test_ndcg(model_dir: str, corpus: Path, max_len: int, per_query: bool = False):
    """Test nDCG@10 of a fine-tuned model, encoded and searched the same way for every row (torch fp32, exact
    search, queries and documents cut at the training's max length, whatever length each trainer's export
    declares); None where the corpus has no test qrels. With `per_query`: (the mean, {qid: nDCG@10})."""
    import numpy as np

    import pyarrow.parquet as pq

    from pipeline.config import EvalConfig, ModelConfig
    from pipeline.data.manifest import join_title, load_manifest
    from pipeline.data.readers import load_qrels, load_queries
    from pipeline.eval.metrics import evaluate_run
    from pipeline.models import BiEncoder

    if not (corpus / "qrels" / "test.trec").exists():
        return (None, None) if per_query else None
    model = BiEncoder.load(ModelConfig(name_or_path=model_dir, query_max_length=max_len, doc_max_length=max_len))
    manifest = load_manifest(corpus)
    pids, texts = [], []
    for part in manifest["parts"]:
        t = pq.read_table(corpus / part["file"])
        pids += t["pid"].to_pylist()
        texts += [join_title(a, b, manifest["title_join"]) for a, b in zip(t["title"].to_pylist(), t["text"].to_pylist())]
    docs = model.embed(texts, "doc", precision="fp32")
    qrels = load_qrels(corpus / "qrels" / "test.trec")
    queries = load_queries(corpus / "queries.tsv")
    qids = sorted(q for q in queries if q in qrels)
    qv = model.embed([queries[q] for q in qids], "query", precision="fp32")
    scores = qv @ docs.T
    run = {q: {pids[j]: float(scores[i, j]) for j in np.argsort(-scores[i])[:100]} for i, q in enumerate(qids)}
    result = evaluate_run(run, qrels, EvalConfig(per_query=per_query), measures=["nDCG@10"])
    if per_query:
        return result["metrics"]["nDCG@10"], {q: v["nDCG@10"] for q, v in result["per_query"].items()}
    return result["metrics"]["nDCG@10"]


def doc_lengths(model_dir: str, texts: list[str], max_len: int) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return [len(x) for x in tok(texts, truncation=True, max_length=max_len)["input_ids"]]


def training_gflop(model_dir: str, pairs_path: Path, max_len: int, epochs: int, batch: int) -> float:
    """GFLOP of the training: 3 x one forward pass (forward + backward) over every query and answer
    token of every step's batch (unpadded: the useful work; bench/encode.py's encoder_gflop)."""
    from encode import encoder_gflop
    from transformers import AutoConfig

    pairs = json.loads(pairs_path.read_text())
    n = len(pairs) // batch * batch  # the steps' examples (the last partial batch is dropped)
    lengths = doc_lengths(model_dir, [t for p in pairs[:n] for t in p], max_len)
    return 3 * epochs * encoder_gflop(AutoConfig.from_pretrained(model_dir), lengths)


def group_padding(lengths: list[int], group_rows: int) -> int:
    """Padded tokens of one tower's batch as `BiEncoder._forward` pads it in training: a batch of at least
    2 x group_rows rows in rows // group_rows length-sorted groups (torch.tensor_split of the stable sort),
    each to its own longest row; a smaller batch (or group_rows 0) to its single longest row."""
    import torch

    rows = len(lengths)
    if group_rows <= 0 or rows < 2 * group_rows:
        return rows * max(lengths)
    order = torch.argsort(torch.tensor(lengths), stable=True)
    return sum(len(g) * max(lengths[i] for i in g.tolist()) for g in torch.tensor_split(order, rows // group_rows))


def ours_padding(run: Path, model_dir: str) -> tuple[int, int]:
    """(real, padded) document tokens of a `pipeline train` run: every step's examples from its batch log
    (train.log_batches), their positives from the run's examples, padded by the run's own config
    (train.length_group_rows, model.doc_max_length)."""
    from pipeline.data.training import read_examples_table
    from pipeline.train.config import load_train_config

    job = load_train_config(run / "config.yaml")
    table = read_examples_table(run / "examples")
    positive = dict(zip(table["idx"].to_pylist(), table["positive"].to_pylist()))
    real = padded = 0
    for line in (run / "batch_log" / "rank0.jsonl").read_text().splitlines():
        texts = [(job.model.doc_prefix or "") + positive[i] for i in json.loads(line)["idx"]]
        lengths = doc_lengths(model_dir, texts, job.model.doc_max_length)
        real += sum(lengths)
        padded += group_padding(lengths, job.train.length_group_rows)
    return real, padded


def share(real: int, padded: int) -> str:
    return f"{1 - real / padded:5.1%}" if padded else "  n/a"


def set_source(name: str, args, model_dir: str, tmp: Path) -> tuple[Path, int, str]:
    """(BEIR folder, positives per query, what it is) of a training set of --sets."""
    from pipeline.data.bundled import python_faq_dir

    if name == "faq":
        return python_faq_dir(), 0, "the FAQ's question -> answer pairs"
    if args.corpus:
        return Path(args.corpus), args.positives_per_query, (f"{Path(args.corpus).name} (--corpus), "
                                                             f"{args.positives_per_query or 'every'} positive(s) per query")
    lo, hi = args.long_tokens
    return (long_faq(tmp / "long-beir", model_dir, lo, hi), 0,
            f"long documents: each FAQ answer followed by the next ones, cut at {lo}-{hi} tokens")


def check_vs_st_args(args) -> None:
    """Bad options as one `error:` line before anything runs."""
    args.sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    bad = [s for s in args.sets if s not in SETS]
    if bad or not args.sets:
        raise SystemExit(f"error: --sets {','.join(args.sets)}: unknown set {bad[0] if bad else '(none)'!r} "
                         f"(choose from {', '.join(SETS)})")
    try:
        lo, hi = (int(x) for x in args.long_tokens.split(","))
    except ValueError:
        raise SystemExit(f"error: --long-tokens {args.long_tokens!r}: two token counts, e.g. 200,256") from None
    if not 8 <= lo <= hi:
        raise SystemExit(f"error: --long-tokens {args.long_tokens!r}: need 8 <= low <= high")
    args.long_tokens = (lo, hi)
    if args.corpus:
        if "long" not in args.sets:
            raise SystemExit("error: --corpus replaces the long set: add long to --sets")
        folder = Path(args.corpus).expanduser()
        for need in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv"):
            if not (folder / need).is_file():
                raise SystemExit(f"error: --corpus {folder}: no {need} (a BEIR folder with a training split)")
        args.corpus = str(folder)


def vs_st(args) -> None:
    """The whole-process comparison with sentence-transformers' trainer (see the module doc)."""
    from encode import gemm_peak

    from pipeline.models.loading import resolve_model_path
    from pipeline.models.precision import cpu_has_bf16

    check_vs_st_args(args)
    tmp = scratch("bench-train-st-")
    model_dir = str(resolve_model_path("minilm"))
    native = cpu_has_bf16()
    peak = gemm_peak(args.threads, ("fp32", "bf16") if native else ("fp32",))
    print(f"\nMiniLM fine-tuned by each trainer as a whole process: batch {args.batch}, max length {args.max_len}, "
          f"lr {args.lr:g}, warmup 10%, gradient clip 1.0, cos/0.05, {args.epochs} epochs, {args.threads} threads; "
          f"matmul peak fp32 {peak['fp32']:.0f} / bf16 {peak['bf16']:.0f} GFLOP/s; "
          f"native bf16: {'yes' if native else 'no'}", flush=True)
    rows = [("sentence-transformers trainer, fp32", "st", False, ())]
    if native:
        rows.append(("sentence-transformers trainer, bf16=True", "st", True, ()))
    rows += [("pipeline train, train.amp=no (fp32)", "ours", "no", ()),
             ("pipeline train, default (train.amp=auto)", "ours", "auto", ()),
             # the attention lever apart: defaults but transformers' SDPA (torch's dropout draw) in training
             ("pipeline train, default, train.attention=sdpa", "ours", "auto", ("train.attention=sdpa",))]
    if native:
        rows.append(("pipeline train, train.amp=bf16", "ours", "bf16", ()))
    for set_name in args.sets:
        src, per_query, what = set_source(set_name, args, model_dir, tmp)
        if args.max_pairs:
            src = beir_subset(src, tmp / set_name / "subset", args.max_pairs, per_query)
        corpus, pairs = training_set(src, tmp / set_name, per_query)
        pair_list = json.loads(pairs.read_text())
        if len(pair_list) < args.batch:
            raise SystemExit(f"error: [{set_name}] {len(pair_list)} training pairs, fewer than one batch of "
                             f"{args.batch}: raise --max-pairs or lower --batch")
        lengths = doc_lengths(model_dir, [p for _, p in pair_list], args.max_len)
        gflop = training_gflop(model_dir, pairs, args.max_len, args.epochs, args.batch)
        print(f"\n[{set_name}] {what}: {len(pair_list)} training pairs, documents {min(lengths)} / "
              f"{sum(lengths) / len(lengths):.0f} / {max(lengths)} tokens (min / mean / max at max length "
              f"{args.max_len}); {gflop:,.0f} GFLOP of training", flush=True)
        results = [vs_st_row(args, label, kind, prec, tmp / set_name, corpus, pairs, per_query, model_dir, gflop,
                             peak, native, extra) for label, kind, prec, extra in rows]
        base = results[0]["wall"]
        print(f"\n[{set_name}] whole-process wall time against sentence-transformers' fp32 trainer (higher is faster), "
              f"and the padding share of each run's document batches as its trainer pads them:")
        for r in results:
            print(f"  {r['label']:44s} {base / r['wall']:5.2f}x   document padding {share(*r['padding'])}")


def vs_st_row(args, label: str, kind: str, prec, folder: Path, corpus: Path, pairs: Path, per_query: int,
              model_dir: str, gflop: float, peak: dict, native: bool, extra: tuple = ()) -> dict:
    """One trainer run as a whole process: its wall, training time, model's test nDCG@10 and padding (`extra`:
    more `pipeline train` overrides)."""
    out = folder / "-".join([kind, str(prec), *(e.replace("=", "-") for e in extra)])
    t0 = time.time()
    if kind == "st":
        cfg = {"threads": args.threads, "pairs": str(pairs), "model": model_dir, "max_len": args.max_len,
               "epochs": args.epochs, "batch": args.batch, "lr": args.lr, "warmup": 0.1, "clip": 1.0, "bf16": prec,
               "tau": 0.05, "out": str(out)}
        p = subprocess.run([sys.executable, "-c", ST_SCRIPT, json.dumps(cfg)], capture_output=True, text=True)
        wall = time.time() - t0
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if not line:
            print(p.stdout[-2000:], p.stderr[-3000:])
            raise SystemExit(f"{label} failed")
        r = json.loads(line[0][7:])
        model, train_s, steps = str(out / "model"), r["train_seconds"], r["steps"]
        padding = (r["doc_tokens"], r["doc_padded"])
    else:
        cmd = [sys.executable, "-m", "pipeline.cli", "train", "--config", "jobs/configs/dpr.yaml",
               f"data.corpus={corpus}", "validation.dev_split=0", "loss.similarity=cos", "loss.temperature=0.05",
               f"model.query_max_length={args.max_len}", f"model.doc_max_length={args.max_len}",
               f"train.epochs={args.epochs}", f"train.batch_size={args.batch}", "train.num_workers=1",
               f"train.torch_threads={args.threads}", f"optim.lr={args.lr}", "optim.warmup_ratio=0.1",
               "optim.grad_clip=1.0", "train.checkpoint_every=0", "train.report_every=10", f"train.amp={prec}",
               f"train.storage_path={out}", "train.name=run", "data.shuffle_window=1024", "train.log_batches=true",
               *extra]
        if per_query:
            cmd.append(f"data.positives_per_query={per_query}")
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
        wall = time.time() - t0
        if p.returncode != 0:
            print(p.stdout[-2000:], p.stderr[-3000:])
            raise SystemExit(f"{label} failed")
        summary = json.loads((out / "run" / "summary.json").read_text())
        model, train_s, steps = str(out / "run" / "model"), summary["time_split"]["training"], summary["steps"]
        padding = ours_padding(out / "run", model_dir)
    ndcg, per_query = test_ndcg(model, corpus, args.max_len, per_query=True)
    kind_peak = peak["bf16"] if prec in (True, "bf16") or (prec == "auto" and native) else peak["fp32"]
    print(f"  {label:44s} wall {wall:6.1f} s  training {train_s:6.1f} s  {steps / train_s:5.2f} steps/s  "
          f"{steps * args.batch / train_s:6.1f} examples/s  {gflop / train_s:6.1f} GFLOP/s "
          f"({100 * gflop / train_s / kind_peak:3.0f}% of peak)  document padding {share(*padding)}  "
          f"test nDCG@10 {'n/a' if ndcg is None else f'{ndcg:.4f}'}", flush=True)
    return {"label": label, "wall": wall, "train_seconds": train_s, "steps": steps, "ndcg": ndcg, "padding": padding,
            "per_query": per_query}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--qlen", type=int, default=32)
    ap.add_argument("--dlen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vs-st", action="store_true", help="whole-process comparison with sentence-transformers' trainer")
    ap.add_argument("--epochs", type=int, default=10, help="--vs-st: epochs over the FAQ's training pairs")
    ap.add_argument("--max-len", type=int, default=256, help="--vs-st: max tokens of queries and answers")
    ap.add_argument("--lr", type=float, default=2e-5, help="--vs-st: learning rate")
    ap.add_argument("--sets", default="faq,long",
                    help="--vs-st: training sets, comma-separated: faq (the FAQ's answers), long (abstract-length "
                         "documents, or --corpus)")
    ap.add_argument("--long-tokens", default="200,256",
                    help="--vs-st: the built-in long set's document lengths in tokens, low,high (each drawn between)")
    ap.add_argument("--corpus", help="--vs-st: a BEIR folder (corpus.jsonl, queries.jsonl, qrels/train.tsv, "
                                     "qrels/test.tsv for nDCG@10) as the long set instead of the built-in one")
    ap.add_argument("--positives-per-query", type=int, default=1,
                    help="--vs-st with --corpus: positives per training query, highest grade first (0 = every judged)")
    ap.add_argument("--max-pairs", type=int, default=0,
                    help="--vs-st: only the first N judgements of qrels/train.tsv (a quick check; 0 = all)")
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--ingested", help=argparse.SUPPRESS)  # --mode: the ingested corpus
    ap.add_argument("--storage", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    print_cpu()  # the figures below depend on this CPU's ISA (bench/machine.py)
    from pipeline.runtime_env import setup_offline_env

    setup_offline_env()
    if args.vs_st:
        if args.batch == 16 and "--batch" not in " ".join(sys.argv):
            args.batch = 32
        if args.threads == 1 and "--threads" not in " ".join(sys.argv):
            args.threads = os.cpu_count() or 2
        vs_st(args)
        return
    if args.mode:
        out = ray_loop(args) if args.mode == "ray" else plain(args, args.mode)
        print("RESULT " + json.dumps(out))
        return
    tmp = scratch("bench-train-")
    if args.model == "tiny":
        from pipeline.models.tiny import build_tiny_bert

        args.model_dir = str(build_tiny_bert(tmp / "tiny", hidden=256, layers=4, heads=4, intermediate=1024))
    else:
        from pipeline.models.loading import resolve_model_path

        args.model_dir = str(resolve_model_path(args.model))
    corpus = make_corpus(tmp, max(400, args.batch * (args.steps + args.warmup) * 2))
    res = {}
    for mode in ("dpr", "dar", "ray"):
        cmd = [sys.executable, __file__, "--mode", mode, "--ingested", str(corpus), "--storage", str(tmp / mode),
               "--model-dir", args.model_dir] + [f"--{k}={getattr(args, k)}" for k in
                                                 ("steps", "warmup", "batch", "qlen", "dlen", "threads")]
        p = subprocess.run(cmd, capture_output=True, text=True)
        line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        if not line:
            print(p.stdout[-3000:], p.stderr[-3000:])
            raise SystemExit(f"{mode} failed")
        res[mode] = json.loads(line[0][7:])
    dpr, dar, ray_r = res["dpr"], res["dar"], res["ray"]
    print(f"\nmodel {args.model}, batch {args.batch}, q/d max length {args.qlen}/{args.dlen}, {args.threads} torch thread(s), "
          f"{args.steps} measured steps after {args.warmup} warm-up")
    print("(a) Ray Train loop vs plain loop (DPR loss)")
    print(f"    plain loop           {dpr['steps_per_s']:7.2f} steps/s")
    print(f"    Ray Train, 1 worker  {ray_r['steps_per_s']:7.2f} steps/s (steady state; whole fit {ray_r['wall_seconds']:.1f}s)"
          f"   ratio {ray_r['steps_per_s'] / dpr['steps_per_s']:.2f}x")
    print("(b) DAR (n=7, w=0.1) vs DPR in the plain loop")
    print(f"    step time  DPR {dpr['step_s'] * 1000:7.1f} ms   DAR {dar['step_s'] * 1000:7.1f} ms   ratio {dar['step_s'] / dpr['step_s']:.3f}x")
    print(f"    {dpr['memory']}  DPR {dpr['peak_bytes'] / 2**20:7.0f} MiB   DAR {dar['peak_bytes'] / 2**20:7.0f} MiB   "
          f"ratio {dar['peak_bytes'] / dpr['peak_bytes']:.3f}x")


if __name__ == "__main__":
    main()
