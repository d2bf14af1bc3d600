"""The GPU check (#63): what the first lent GPU must tell us, in one command that imports no Ray and needs no
faiss, downloads nothing and carries no weights (every model is built from a config with random weights).

    bash scripts/gpu_check.sh                 # on the GPU machine (under 8 minutes)
    bash scripts/gpu_check.sh --device cpu    # the same code path on a CPU, small sizes (CI keeps it working)

Prints one table:
- the in-process paths on the device against the CPU: a BiEncoder's fp32 vectors (min cosine), bf16 and fp16
  vectors (min cosine), DPR's and DAR's losses of one batch (deterministic: eval mode, DAR without its random
  draws) and the loss after one AdamW step on each device;
- encoder throughput in bf16 (autocast) of a MiniLM-sized (6 x 384) and a BERT-base-sized (12 x 768) encoder, in
  tokens/s and passages/s at 128 and 256 tokens, and the hours that implies for 21,015,324 Wikipedia passages;
- a DPR training step (in-batch negatives, AdamW, bf16 autocast) at batch 128 (query 32, passage 256 tokens):
  its time and peak GPU memory, for both sizes, without and with gradient caching (chunks of 32);
- what it skipped and why (Ray's runners, faiss-gpu).
`--json PATH` writes the same figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
WIKI = 21_015_324
WORDS = ("the of and to in a is that for on with as by at from this it an be are was or which not but have "
         "list tuple dict set string number python query passage document retrieval dense index vector train").split()


def _vocab_dir(folder: Path) -> Path:
    """A WordPiece tokenizer of a small made-up vocabulary (nothing downloaded)."""
    from transformers import BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(WORDS)) + [chr(c) for c in range(97, 123)] \
        + [f"##{chr(c)}" for c in range(97, 123)] + [str(d) for d in range(10)]
    # (the vocabulary as a mapping: transformers 5 reads `vocab_file` only through from_pretrained)
    BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}).save_pretrained(str(folder))
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return folder


def _model_dir(folder: Path, layers: int, hidden: int, heads: int, vocab: Path, seed: int = 0) -> Path:
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    folder.mkdir(parents=True, exist_ok=True)
    for f in vocab.iterdir():
        shutil.copy(f, folder / f.name)
    torch.manual_seed(seed)
    size = len((vocab / "vocab.txt").read_text().split())
    BertModel(BertConfig(vocab_size=size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         intermediate_size=4 * hidden, max_position_embeddings=512)).save_pretrained(str(folder))
    return folder


def _texts(n: int, words: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(n)]


class Table:
    def __init__(self):
        self.rows: list[tuple[str, str, str]] = []

    def add(self, check: str, result: str, note: str = "") -> None:
        self.rows.append((check, result, note))
        print(f"  {check}: {result}" + (f" ({note})" if note else ""), flush=True)

    def markdown(self) -> str:
        out = ["| check | result | note |", "|---|---|---|"]
        out += [f"| {a} | {b} | {c} |" for a, b, c in self.rows]
        return "\n".join(out)


def equality(table: Table, device: str, work: Path, small: bool) -> dict:
    """The in-process paths on `device` against the CPU's."""
    import numpy as np
    import torch

    from pipeline.config import ModelConfig
    from pipeline.losses.configs import DARConfig, LossConfig
    from pipeline.losses.dar import dar_batch_loss
    from pipeline.losses.dpr import dpr_batch_loss
    from pipeline.models import BiEncoder

    vocab = _vocab_dir(work / "vocab")
    model_dir = _model_dir(work / "eq-model", 2, 64, 2, vocab)
    cfg = ModelConfig(name_or_path=str(model_dir), pooling="mean", normalize=True)
    texts = _texts(64 if small else 512, 40, 1)
    cpu = BiEncoder.load(cfg)
    ref = cpu.embed(texts, "doc", batch_size=32, device="cpu", precision="fp32")
    dev = BiEncoder.load(cfg).to(device)
    out = {}

    def min_cos(a, b):
        return float(np.min(np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))

    for precision in ("fp32", "bf16", "fp16"):
        if precision != "fp32" and device == "cpu" and precision == "fp16":
            table.add(f"encode {precision} vs CPU fp32", "skipped", "fp16 is a GPU precision")
            continue
        try:
            got = dev.embed(texts, "doc", batch_size=32, device=device, precision=precision)
            c = min_cos(got, ref)
            out[f"min_cosine_{precision}"] = c
            bar = 0.99999 if precision == "fp32" else 0.99
            table.add(f"encode {precision} vs CPU fp32 (min cosine, {len(texts)} passages)", f"{c:.6f}",
                      "pass" if c >= bar else f"FAIL (below {bar})")
        except Exception as e:  # a precision this device refuses
            table.add(f"encode {precision} vs CPU fp32", "error", f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
    # one batch's losses, deterministic (eval mode; DAR's validation form draws nothing), then one AdamW step
    queries, docs = _texts(16, 8, 2), _texts(16, 40, 3)
    results = {}
    for where in ("cpu", device):
        torch.manual_seed(0)
        m = BiEncoder.load(cfg).to(where)
        m.eval()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        q_tok = {k: v.to(where) for k, v in m.tokenize(queries, "query").items()}
        d_tok = {k: v.to(where) for k, v in m.tokenize(docs, "doc").items()}
        q, d = m(q_tok, d_tok)
        batch = {"q": q, "docs": d, "pos_idx": torch.arange(16, device=where), "n_pos": 16, "hard_per_query": 0}
        dpr, _ = dpr_batch_loss(batch, LossConfig(similarity="cos", temperature=0.05), training=True)
        dar, _ = dar_batch_loss(batch, DARConfig(similarity="cos", temperature=0.05), training=False)
        opt.zero_grad()
        dpr.backward()
        opt.step()
        q2, d2 = m(q_tok, d_tok)
        after, _ = dpr_batch_loss({**batch, "q": q2, "docs": d2}, LossConfig(similarity="cos", temperature=0.05))
        results[where] = (dpr.item(), dar.item(), after.item())
    for i, name in enumerate(("DPR loss", "DAR loss (deterministic form)", "DPR loss after one AdamW step")):
        a, b = results["cpu"][i], results[device][i]
        rel = abs(a - b) / max(abs(a), 1e-12)
        out[name] = {"cpu": a, device: b, "relative_difference": rel}
        table.add(f"{name}: {device} vs CPU", f"{b:.6f} vs {a:.6f}", "pass" if rel <= 1e-4 else f"FAIL ({rel:.1e})")
    return out


def _encoder(layers: int, hidden: int, heads: int, device: str):
    """A BERT of this size with random weights (transformers only: no pipeline import, so the figures come even
    where a pure-Python dependency of the package is missing) and its mean pooling, as the BiEncoder pools."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                                 num_attention_heads=heads, intermediate_size=4 * hidden,
                                 max_position_embeddings=512)).to(device)

    def encode(ids):
        mask = torch.ones_like(ids)
        h = model(input_ids=ids, attention_mask=mask).last_hidden_state
        return torch.nn.functional.normalize((h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True), dim=-1)

    return model, encode


SIZES = [("MiniLM-sized (6 x 384)", 6, 384, 12), ("BERT-base-sized (12 x 768)", 12, 768, 12)]


def throughput(table: Table, device: str, work: Path, small: bool) -> dict:
    import torch

    out = {}
    for name, layers, hidden, heads in (SIZES if not small else [("tiny (2 x 64)", 2, 64, 2)]):
        model, encode = _encoder(layers, hidden, heads, device)
        model.eval()
        for length in (128, 256):
            batch = 256 if device == "cuda" else 16
            ids = torch.randint(1000, 29000, (batch, length), device=device)
            rounds = 3 if small else 20
            with torch.inference_mode(), torch.autocast(device_type=device, dtype=torch.bfloat16):
                encode(ids)  # warm-up
                if device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.time()
                for _ in range(rounds):
                    encode(ids)
                if device == "cuda":
                    torch.cuda.synchronize()
            pps = rounds * batch / (time.time() - t0)
            hours = WIKI / pps / 3600
            key = f"{name} @ {length} tokens"
            out[key] = {"passages_per_s": pps, "tokens_per_s": pps * length, "wikipedia_hours": hours}
            table.add(f"encode bf16, {key}", f"{pps:,.0f} passages/s, {pps * length:,.0f} tokens/s",
                      f"21,015,324 passages: {hours:.2f} h on one such {device.upper()}")
        del model
    return out


def train_step(table: Table, device: str, work: Path, small: bool) -> dict:
    """A DPR step at batch 128 (query 32, passage 256 tokens, bf16 autocast, AdamW): its time and peak GPU memory,
    without gradient caching and with it (train/grad_cache.py, chunks of 32 rows: the package's own code, where it
    imports)."""
    import torch

    batch = 128 if not small else 8
    out = {}
    for name, layers, hidden, heads in (SIZES if not small else [("tiny (2 x 64)", 2, 64, 2)]):
        for cached in (False, True):
            try:
                step_s, peak = _one_step(device, work, layers, hidden, heads, batch, cached)
            except ImportError as e:  # the package's pure-Python dependency missing on this machine
                table.add(f"DPR step with gradient caching, {name}", "skipped", f"cannot import the package ({e})")
                continue
            key = f"{name}{', gradient caching (chunks of 32)' if cached else ''}"
            out[key] = {"step_seconds": step_s, "peak_gib": peak, "batch": batch}
            table.add(f"DPR step, {key}, batch {batch} (query 32, passage 256 tokens, bf16 autocast, AdamW)",
                      f"{step_s * 1000:.0f} ms a step" + (f", peak {peak:.2f} GiB" if not math.isnan(peak) else ""))
            if device == "cuda":
                torch.cuda.empty_cache()
    return out


def _one_step(device: str, work: Path, layers: int, hidden: int, heads: int, batch: int, cached: bool):
    import contextlib

    import torch

    if cached:  # the BiEncoder and its gradient cache, as train.grad_cache runs them
        from pipeline.config import ModelConfig
        from pipeline.models import BiEncoder
        from pipeline.train.grad_cache import GradCache, recording

        model = BiEncoder.load(ModelConfig(name_or_path=str(_model_dir(work / f"step-{layers}-{hidden}", layers, hidden,
                                                                       heads, _vocab_dir(work / "vocab"))),
                                           pooling="mean", normalize=True)).to(device)
        size = len((work / "vocab" / "vocab.txt").read_text().split())
        cache = GradCache(32, 32, device)

        def encode_pair(qi, di):
            tok = lambda ids: {"input_ids": ids, "attention_mask": torch.ones_like(ids),  # noqa: E731
                               "token_type_ids": torch.zeros_like(ids)}
            with recording(model, cache):
                return model(tok(qi), tok(di))
    else:
        model, encode = _encoder(layers, hidden, heads, device)
        size = 30522

        def encode_pair(qi, di):
            return encode(qi), encode(di)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    qi = torch.randint(5, size, (batch, 32), device=device)
    di = torch.randint(5, size, (batch, 256), device=device)
    autocast = lambda: torch.autocast(device_type=device, dtype=torch.bfloat16)  # noqa: E731
    times = []
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for i in range(4 if batch > 8 else 2):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.time()
        with autocast():
            q, d = encode_pair(qi, di)
        s = (q.float() @ d.float().T) / 0.05  # DPR's in-batch NLL, cos / 0.05 (docs/METHODS.md §1)
        loss = torch.nn.functional.cross_entropy(s, torch.arange(batch, device=device))
        opt.zero_grad()
        loss.backward()
        if cached:
            cache.replay(model, autocast, 1)
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.time() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    del model, opt
    with contextlib.suppress(Exception):
        torch.cuda.empty_cache()
    return sum(times) / len(times), peak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when torch sees one")
    ap.add_argument("--json", help="write the figures here as JSON")
    args = ap.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda, but torch sees no GPU here", file=sys.stderr)
        return 2
    small = device == "cpu"
    table = Table()
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    bf16 = torch.cuda.is_bf16_supported() if device == "cuda" else None
    print(f"gpu_check on {name} (torch {torch.__version__}" + (f", CUDA {torch.version.cuda}, bf16 {bf16}"
                                                               if device == "cuda" else "") + ")", flush=True)
    figures = {"device": name, "torch": torch.__version__}
    t0 = time.time()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # (saving the check's random models: no "Writing model shards" bars)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        for part, fn in (("equality", equality), ("throughput", throughput), ("train_step", train_step)):
            try:
                figures[part] = fn(table, device, work, small)
            except Exception as e:  # the other parts still run, and the table says what failed
                table.add(part, "FAILED", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
                traceback.print_exc()
    skipped = [("Ray's runners (encode.runner=ray, train.runner=ray, retrieve.runner=ray)",
                "Ray is not installed here" if "ray" not in sys.modules and not _importable("ray")
                else "not part of this check: it runs the in-process paths"),
               ("FAISS on the GPU (index.use_gpu)", "faiss is not installed here" if not _importable("faiss")
                else "not part of this check"),
]
    for what, why in skipped:
        table.add(f"skipped: {what}", "—", why)
    table.add("Ray imported by this check", "yes" if "ray" in sys.modules else "no")
    print("\n" + table.markdown(), flush=True)
    print(f"\n{len(table.rows)} rows in {time.time() - t0:.0f}s", flush=True)
    figures["rows"] = table.rows
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(json.dumps(figures, indent=2, default=str))
    failed = [r for r in table.rows if r[1] in ("FAILED", "error") or r[2].startswith("FAIL")]
    return 1 if failed else 0


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    sys.exit(main())
