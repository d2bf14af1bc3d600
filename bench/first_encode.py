"""What a user meets first: a whole `pipeline encode` process on a new machine (an empty export cache) and again
(the cache warm), against sentence-transformers' whole process on the same passages, side by side, in turns.

    python bench/first_encode.py                       # the bundled Python FAQ (176 answers), 3 rounds
    python bench/first_encode.py --beir ~/data/scifact --max-docs 1000 --rounds 2

Every process: fp32, 2 threads, batch 64, length 256 (the issue's setting), the installed MiniLM. Rows, each a
whole process from its start to its exit (Python, imports, model load, the work):
  1. sentence-transformers: `SentenceTransformer(path).encode(texts, batch_size=64)`;
  2. `pipeline encode` on an empty export cache (a new folder each round: a new machine), encode.precision=fp32;
  3. `pipeline encode` again with that cache (a second run);
  4. `pipeline encode encode.backend=torch` (no export at all);
  5. `pipeline encode encode.backend=openvino` on an empty cache (the export forced, whatever the corpus's size);
  6. `pipeline encode` with its own precision (`encode.precision=auto`: bf16 where the CPU has it natively, fp32
     elsewhere) on an empty cache: what a user's first run does on this CPU.
The best of the rounds is kept per row; the ratios are to row 1. The first encode's own summary line (what it
chose and what the one-time cost was) is printed with it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from encode import ST_PROCESS, beir_copy, corpus_texts  # noqa: E402  (bench/encode.py's)
from machine import cpu_line, scratch  # noqa: E402  (bench/machine.py)




def timed(argv: list[str], env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"{' '.join(argv[:5])} ... failed (exit {r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("[encode]")]
    return wall, "\n    ".join(lines[-3:])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--beir", type=Path, default=None, help="a BEIR folder (default: the bundled FAQ)")
    p.add_argument("--max-docs", type=int, default=0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--max-length", type=int, default=256)
    args = p.parse_args()
    print(cpu_line(), flush=True)
    from pipeline.data.bundled import python_faq_dir
    from pipeline.data.ingest import ingest
    from pipeline.models.loading import resolve_model_path

    tmp = scratch("bench-first-encode-")
    src = args.beir or python_faq_dir()
    folder = beir_copy(src, tmp / "beir", 1, args.max_docs) if args.max_docs else src
    corpus = tmp / "corpus"
    ingest([folder], "beir", corpus, progress=False, on_unknown_qrels="skip" if args.max_docs else "error")
    _, texts = corpus_texts(corpus)
    texts_file = tmp / "texts.json"
    texts_file.write_text(json.dumps(texts))
    model = str(resolve_model_path("minilm"))
    T, B, L = args.threads, args.batch, args.max_length
    print(f"{len(texts)} passages of {src}; fp32, {T} threads, batch {B}, length {L}; {args.rounds} rounds "
          "in turn, the best kept", flush=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("RAY_ADDRESS", None)
    enc = ["--model", "minilm", f"model.doc_max_length={L}", f"encode.batch_size={B}", f"encode.torch_threads={T}",
           "encode.precision=fp32", "encode.show_progress=false"]
    best: dict[str, float] = {}
    lines: dict[str, str] = {}

    def keep(label: str, wall: float, line: str = "") -> None:
        print(f"  {label}: {wall:.1f}s" + (f"\n    {line}" if line else ""), flush=True)
        if wall < best.get(label, float("inf")):
            best[label], lines[label] = wall, line

    for rnd in range(args.rounds):
        print(f"round {rnd + 1}:", flush=True)
        st, _ = timed([sys.executable, "-c", ST_PROCESS, model, str(texts_file), str(T), str(L), str(B)], env)
        keep("sentence-transformers (whole process)", st)
        cache = tmp / f"exports-{rnd}"  # empty: a new machine
        e = {**env, "PIPELINE_EXPORT_CACHE": str(cache)}
        cli = [sys.executable, "-m", "pipeline.cli", "encode", "--corpus", str(corpus)]
        w, line = timed(cli + ["--out", str(tmp / f"first-{rnd}")] + enc, e)
        keep("pipeline encode, first run (empty export cache)", w, line)
        w, line = timed(cli + ["--out", str(tmp / f"second-{rnd}")] + enc, e)
        keep("pipeline encode, second run (the cache as the first left it)", w, line)
        w, line = timed(cli + ["--out", str(tmp / f"torch-{rnd}")] + enc + ["encode.backend=torch"], e)
        keep("pipeline encode encode.backend=torch", w, line)
        e2 = {**env, "PIPELINE_EXPORT_CACHE": str(tmp / f"exports-forced-{rnd}")}
        w, line = timed(cli + ["--out", str(tmp / f"forced-{rnd}")] + enc + ["encode.backend=openvino"], e2)
        keep("pipeline encode encode.backend=openvino, empty export cache", w, line)
        e3 = {**env, "PIPELINE_EXPORT_CACHE": str(tmp / f"exports-auto-{rnd}")}
        auto = [a for a in enc if a != "encode.precision=fp32"]
        w, line = timed(cli + ["--out", str(tmp / f"auto-{rnd}")] + auto, e3)
        keep("pipeline encode, its own precision (auto), first run (empty export cache)", w, line)
    st = best["sentence-transformers (whole process)"]
    print(f"\n| whole process ({len(texts)} passages) | best of {args.rounds} | passages/s | x sentence-transformers |")
    print("|---|---:|---:|---:|")
    for label, wall in best.items():
        print(f"| {label} | {wall:.1f} s | {len(texts) / wall:.1f} | {st / wall:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
