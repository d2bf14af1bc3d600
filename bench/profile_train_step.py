"""One training step taken apart: `pipeline train`'s step (DPR, cos/0.05, as train/loop.py runs it) against
sentence-transformers' (MultipleNegativesRankingLoss at scale 20, as its trainer runs it) on the same batches
of long documents, at the same batch size, max length, threads, learning rate, warmup and clipping, in fp32
and bf16 (autocast where each trainer puts it: ours around the towers' forward, the HF Trainer's around the
forward and the loss).

Per configuration, the mean milliseconds per step (manual timers; torch runs synchronously on a CPU) of:
  collate    tokenising the batch (ours: BiEncoder.tokenize; theirs: SentenceTransformer.preprocess, what its
             data collator calls)
  forward    both towers (ours: a document batch of at least 2 x train.length_group_rows rows in length groups)
  attn fwd   of which the attention function (threshold-dropout, transformers' SDPA or eager attention), timed
             around its calls
  gather     ours: Method.assemble (gather_docs and the fp32 cast); theirs: nothing
  loss       the loss on the vectors
  backward   loss.backward()
  attn bwd   of which attention's backward: from the gradient reaching its output to the gradients leaving its
             query, key and value (marks on both sides; the CPU's autograd engine runs the nodes made between
             them in that span)
  clip       clip_grad_norm_
  optimizer  zero_grad, optimizer.step and the schedule (ours: build_optimizer; theirs: the HF Trainer's)
  step       the sum
and the document batch's padding share as that step pads it.

Configurations: attention by threshold-dropout (`train.attention`'s default on CPU workers:
pipeline/models/attention.py), SDPA (transformers' default) or eager (`attn_implementation`, set on the loaded
towers); our length groups on (train.length_group_rows = --group-rows) and off (0); documents long (the FAQ's
answers joined and cut at --long-tokens, bench/train.py's long set, or a BEIR folder's with --corpus) and even
(every document at --max-len tokens: groups save no padding there, so the row shows what two passes of 16
rows cost against one of 32).

    python bench/profile_train_step.py                        # MiniLM, batch 32, max length 256, 5 steps
    python bench/profile_train_step.py --steps 2 --batch 4 --group-rows 2 --threads 1   # a smoke run
    python bench/profile_train_step.py --corpus ~/data/nfcorpus --top 15   # + each config's costliest ops
"""

from __future__ import annotations

from machine import print_cpu  # bench/machine.py (run as python bench/<name>.py)

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

PHASES = ("collate", "forward", "attn fwd", "gather", "loss", "backward", "attn bwd", "clip", "optimizer")


class AttentionClock:
    """Seconds spent in a model's attention function, forward and backward (see `attention_timed`)."""

    def __init__(self):
        self.forward = self.backward = 0.0
        self.calls = 0
        self._grad_at_output = None

    def mark(self, where: str) -> None:
        now = time.perf_counter()
        if where == "output":
            self._grad_at_output = now
        elif self._grad_at_output is not None:
            self.backward += now - self._grad_at_output
            self._grad_at_output = None


def _mark_fn():
    import torch

    class Mark(torch.autograd.Function):
        """Identity whose backward notes the time on the clock: at attention's output, its backward starts;
        at its query / key / value (one node for the three), it has ended."""

        @staticmethod
        def forward(ctx, clock, where, *xs):
            ctx.clock, ctx.where = clock, where
            return tuple(x.view_as(x) for x in xs)

        @staticmethod
        def backward(ctx, *grads):
            ctx.clock.mark(ctx.where)
            return (None, None, *grads)

    return Mark


@contextlib.contextmanager
def attention_timed(tower, clock: AttentionClock):
    """Within this block the attention function `tower` calls (transformers' AttentionInterface entry for its
    attn_implementation, or the modelling module's eager_attention_forward) runs between timers and marks."""
    import torch
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    mark = _mark_fn()

    def timed(fn):
        def attention(module, query, key, value, *args, **kwargs):
            grad = torch.is_grad_enabled() and query.requires_grad
            if grad:
                query, key, value = mark.apply(clock, "input", query, key, value)
            t0 = time.perf_counter()
            out, weights = fn(module, query, key, value, *args, **kwargs)
            clock.forward += time.perf_counter() - t0
            clock.calls += 1
            if grad:
                (out,) = mark.apply(clock, "output", out)
            return out, weights
        return attention

    impl = tower.config._attn_implementation
    undo = []
    if impl == "eager":
        for mod in {sys.modules[type(m).__module__] for m in tower.modules()}:
            if callable(getattr(mod, "eager_attention_forward", None)):
                orig = mod.eager_attention_forward
                mod.eager_attention_forward = timed(orig)
                undo.append(lambda mod=mod, orig=orig: setattr(mod, "eager_attention_forward", orig))
    elif impl in ALL_ATTENTION_FUNCTIONS:
        local = ALL_ATTENTION_FUNCTIONS._local_mapping
        had, kept = impl in local, local.get(impl)
        ALL_ATTENTION_FUNCTIONS[impl] = timed(ALL_ATTENTION_FUNCTIONS[impl])
        undo.append(lambda: local.__setitem__(impl, kept) if had else local.pop(impl, None))
    try:
        yield
    finally:
        for fn in undo:
            fn()


def set_attention(tower, impl: str) -> None:
    from pipeline.models.attention import register

    register()  # threshold-dropout (train.attention's CPU default) among the names transformers accepts
    tower.set_attn_implementation(impl)
    if tower.config._attn_implementation != impl:
        raise SystemExit(f"error: the model kept attn_implementation={tower.config._attn_implementation!r}, not {impl!r}")


def even_texts(tok, texts: list[str], max_len: int) -> list[str]:
    """Each text repeated until it has at least `max_len` tokens: cut there, every row is `max_len` long."""
    out = []
    for t in texts:
        n = max(1, len(tok(t, add_special_tokens=False, verbose=False)["input_ids"]))
        out.append(" ".join([t] * (max_len // n + 1)))
    return out


def ours_runner(args, model_dir: str, impl: str, group_rows: int, total: int):
    """(step(queries, docs) -> ({phase: s}, (real, padded) doc tokens), tower) for `pipeline train`'s step."""
    import torch

    from pipeline.models import BiEncoder
    from pipeline.train.config import load_train_config
    from pipeline.train.methods import get_method
    from pipeline.train.methods.base import StepContext
    from pipeline.train.optim import build_optimizer, warmup_linear, warmup_steps
    from train import group_padding

    job = load_train_config(None, [f"model.name_or_path={model_dir}", "model.pooling=mean",
                                   f"model.query_max_length={args.max_len}", f"model.doc_max_length={args.max_len}",
                                   "loss.name=dpr", "loss.similarity=cos", "loss.temperature=0.05",
                                   f"optim.lr={args.lr}", "optim.warmup_ratio=0.1", "optim.grad_clip=1.0",
                                   f"train.batch_size={args.batch}", f"train.length_group_rows={group_rows}"])
    torch.manual_seed(0)
    model = BiEncoder.load(job.model)
    for tower in {id(model.doc_encoder): model.doc_encoder, id(model.query_encoder): model.query_encoder}.values():
        set_attention(tower, impl)
    model.length_group_rows = job.train.length_group_rows
    model.train()
    method = get_method("dpr")
    opt = build_optimizer(model.named_parameters(), job.optim)
    sched = warmup_linear(opt, warmup_steps(job.optim, total), total)
    autocast = ((lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.precision == "bf16"
                else contextlib.nullcontext)
    count = [0]

    def step(queries: list[str], docs: list[str]):
        t = {}
        t0 = time.perf_counter()
        q_tok, d_tok = model.tokenize(queries, "query"), model.tokenize(docs, "doc")
        t1 = time.perf_counter()
        with autocast():
            q, d = model(q_tok, d_tok)  # each tower once, as Method.forward does
        t2 = time.perf_counter()
        ctx = StepContext(job=job, device=torch.device("cpu"), rank=0, world=1, step=count[0],
                          rng=random.Random(count[0]))
        batch = method.assemble({"q": q, "pos": d[:len(queries)], "hard": d[len(queries):]}, ctx)
        t3 = time.perf_counter()
        loss, _ = method.loss(batch, job.loss, training=True)
        t4 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        t5 = time.perf_counter()
        loss.backward()
        t6 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), job.optim.grad_clip)
        t7 = time.perf_counter()
        opt.step()
        sched.step()
        t8 = time.perf_counter()
        count[0] += 1
        t.update(collate=t1 - t0, forward=t2 - t1, gather=t3 - t2, loss=t4 - t3, backward=t6 - t5, clip=t7 - t6,
                 optimizer=(t5 - t4) + (t8 - t7))
        lengths = d_tok["attention_mask"].sum(1).tolist()
        return t, (sum(lengths), group_padding(lengths, model.length_group_rows))

    return step, model.doc_encoder


def st_runner(args, model_dir: str, impl: str, total: int, tmp: Path):
    """The same for sentence-transformers: its preprocess, model, MNRL and the HF Trainer's optimizer."""
    import torch
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainingArguments
    from sentence_transformers.base.losses.merged_forward import embed_columns
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import Trainer, get_linear_schedule_with_warmup

    torch.manual_seed(0)
    st = SentenceTransformer(model_dir, device="cpu", model_kwargs={"attn_implementation": impl})
    st.max_seq_length = args.max_len
    tower = st[0].auto_model
    set_attention(tower, impl)
    st.train()
    mnrl = MultipleNegativesRankingLoss(st, scale=20.0)
    targs = SentenceTransformerTrainingArguments(output_dir=str(tmp / "st-args"), learning_rate=args.lr,
                                                 max_grad_norm=1.0, use_cpu=True, report_to="none")
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(targs, st)
    opt = cls([p for p in st.parameters() if p.requires_grad], **kwargs)
    sched = get_linear_schedule_with_warmup(opt, int(0.1 * total + 0.999), total)
    autocast = ((lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.precision == "bf16"
                else contextlib.nullcontext)

    def step(queries: list[str], docs: list[str]):
        t0 = time.perf_counter()
        feats = [st.preprocess(queries), st.preprocess(docs)]
        t1 = time.perf_counter()
        with autocast():  # the HF Trainer's autocast covers compute_loss: the forward and the loss
            embs = embed_columns(st, feats)
            t2 = time.perf_counter()
            loss = mnrl.compute_loss_from_embeddings(embs, None)
        t3 = time.perf_counter()
        loss.backward()
        t4 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(st.parameters(), 1.0)
        t5 = time.perf_counter()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        t6 = time.perf_counter()
        mask = feats[1]["attention_mask"]
        return ({"collate": t1 - t0, "forward": t2 - t1, "gather": 0.0, "loss": t3 - t2, "backward": t4 - t3,
                 "clip": t5 - t4, "optimizer": t6 - t5}, (int(mask.sum()), mask.numel()))

    return step, tower


def profile_config(args, label: str, make, batches: list[tuple[list[str], list[str]]]) -> dict:
    """Warm-up and measured steps of one configuration: mean seconds per phase, padding, its top ops."""
    step, tower = make()
    clock = AttentionClock()
    sums = dict.fromkeys(PHASES, 0.0)
    real = padded = 0
    with attention_timed(tower, clock):
        for i, (queries, docs) in enumerate(batches[:args.warmup + args.steps]):
            if i == args.warmup:
                clock.forward = clock.backward = 0.0
                clock.calls = 0
            t, (r, p) = step(queries, docs)
            if i >= args.warmup:
                for k, v in t.items():
                    sums[k] += v
                real, padded = real + r, padded + p
        if not clock.calls:
            print(f"  ({label}: the attention function was not found, attention not timed)", flush=True)
        sums["attn fwd"], sums["attn bwd"] = clock.forward, clock.backward
        top = None
        if args.top:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step(*batches[(args.warmup + args.steps) % len(batches)])
            top = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top)
    mean = {k: v / args.steps for k, v in sums.items()}
    mean["step"] = sum(v for k, v in mean.items() if not k.startswith("attn"))
    return {"label": label, "mean": mean, "padding": 1 - real / padded if padded else float("nan"), "top": top}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="minilm", help="'minilm' (default), 'tiny' (random BERT) or a model dir")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=256, help="max tokens of queries and documents")
    ap.add_argument("--steps", type=int, default=5, help="measured steps per configuration")
    ap.add_argument("--warmup", type=int, default=1, help="steps run first, not measured")
    ap.add_argument("--group-rows", type=int, default=None,
                    help="train.length_group_rows of the grouped rows (default: the trainer's default)")
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
    ap.add_argument("--precisions", default=None,
                    help="comma-separated, of fp32,bf16 (default: fp32, and bf16 where the CPU has native bf16)")
    ap.add_argument("--long-tokens", default="200,256", help="the built-in long documents' lengths, low,high")
    ap.add_argument("--corpus", help="a BEIR folder (corpus.jsonl, queries.jsonl, qrels/train.tsv) whose training "
                                     "pairs are the long documents instead")
    ap.add_argument("--top", type=int, default=0, help="also print each configuration's N costliest ops "
                                                       "(torch.profiler, one extra step)")
    args = ap.parse_args()
    print_cpu()  # the figures below depend on this CPU's ISA (bench/machine.py)
    from pipeline.runtime_env import setup_offline_env

    setup_offline_env()
    import torch
    from transformers import AutoTokenizer

    from pipeline.models.loading import resolve_model_path
    from pipeline.models.precision import cpu_has_bf16
    from pipeline.train.config import TrainConfig
    from train import check_vs_st_args, set_source, training_set

    if args.batch < 2 or args.steps < 1 or args.warmup < 0:
        raise SystemExit("error: need --batch >= 2, --steps >= 1, --warmup >= 0")
    group_rows = TrainConfig().length_group_rows if args.group_rows is None else args.group_rows
    precisions = (args.precisions.split(",") if args.precisions else ["fp32"] + (["bf16"] if cpu_has_bf16() else []))
    if not precisions or any(p not in ("fp32", "bf16") for p in precisions):
        raise SystemExit(f"error: --precisions {args.precisions!r}: of fp32,bf16")
    args.sets, args.positives_per_query = "long", 1
    check_vs_st_args(args)  # --long-tokens and --corpus, as bench/train.py --vs-st checks them
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench-profile-step-"))
    if args.model == "tiny":
        from pipeline.models.tiny import build_tiny_bert

        model_dir = str(build_tiny_bert(tmp / "tiny", hidden=256, layers=4, heads=4, intermediate=1024))
    else:
        model_dir = str(resolve_model_path(args.model))
    src, per_query, what = set_source("long", args, model_dir, tmp)
    _, pairs_file = training_set(src, tmp / "set", per_query)
    pairs = json.loads(pairs_file.read_text())
    random.Random(0).shuffle(pairs)
    n_batches = args.warmup + args.steps + 1
    pairs = (pairs * (args.batch * n_batches // max(1, len(pairs)) + 1))[:args.batch * n_batches]
    long_batches = [([q for q, _ in pairs[i:i + args.batch]], [d for _, d in pairs[i:i + args.batch]])
                    for i in range(0, len(pairs), args.batch)]
    tok = AutoTokenizer.from_pretrained(model_dir)
    even_batches = [(q, even_texts(tok, d, args.max_len)) for q, d in long_batches]
    print(f"\none training step, {what}; batch {args.batch}, max length {args.max_len}, {args.threads} threads, "
          f"lr {args.lr:g}, clip 1.0, length groups of {group_rows} rows (grouping from {2 * group_rows} rows); "
          f"mean of {args.steps} steps after {args.warmup} warm-up; milliseconds", flush=True)
    total = args.warmup + args.steps + (1 if args.top else 0)  # the schedules' length
    td = "threshold-dropout"
    configs = [
        (f"pipeline train, {td}, groups of {group_rows}", "long", lambda: ours_runner(args, model_dir, td, group_rows, total)),
        (f"pipeline train, sdpa, groups of {group_rows}", "long", lambda: ours_runner(args, model_dir, "sdpa", group_rows, total)),
        ("pipeline train, sdpa, one batch (groups 0)", "long", lambda: ours_runner(args, model_dir, "sdpa", 0, total)),
        (f"pipeline train, eager, groups of {group_rows}", "long", lambda: ours_runner(args, model_dir, "eager", group_rows, total)),
        (f"pipeline train, {td}, groups of {group_rows}", "even", lambda: ours_runner(args, model_dir, td, group_rows, total)),
        (f"pipeline train, sdpa, groups of {group_rows}", "even", lambda: ours_runner(args, model_dir, "sdpa", group_rows, total)),
        ("pipeline train, sdpa, one batch (groups 0)", "even", lambda: ours_runner(args, model_dir, "sdpa", 0, total)),
        ("sentence-transformers, sdpa", "long", lambda: st_runner(args, model_dir, "sdpa", total, tmp)),
        ("sentence-transformers, eager", "long", lambda: st_runner(args, model_dir, "eager", total, tmp)),
        ("sentence-transformers, sdpa", "even", lambda: st_runner(args, model_dir, "sdpa", total, tmp)),
    ]
    head = f"  {'configuration':50s} {'docs':4s} {'padding':>7s} " + " ".join(f"{p:>9s}" for p in PHASES) + \
        f" {'step':>9s} {'attention':>9s}"
    for precision in precisions:
        args.precision = precision
        print(f"\n{precision}:\n{head}", flush=True)
        for label, docs, make in configs:
            r = profile_config(args, label, make, long_batches if docs == "long" else even_batches)
            m = r["mean"]
            print(f"  {label:50s} {docs:4s} {r['padding']:7.1%} " + " ".join(f"{1000 * m[p]:9.1f}" for p in PHASES)
                  + f" {1000 * m['step']:9.1f} {(m['attn fwd'] + m['attn bwd']) / m['step']:9.1%}", flush=True)
            if r["top"]:
                print(r["top"], flush=True)


if __name__ == "__main__":
    main()
