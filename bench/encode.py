"""Encoding speed on real text, side by side in one run, and driver memory flatness.

Throughput (default: the bundled Python FAQ answers, or a BEIR folder given with
--beir; `--repeat k` encodes k copies for a longer run), same model, threads, batch
size and max length everywhere, passages/s of:
  1. sentence-transformers `encode`, fp32 and with bf16 autocast;
  2. a plain in-process loop of our `BiEncoder.embed` (length-sorted batches), fp32 and bf16;
  3. `pipeline encode` (Ray Data encoder actors writing their own shards), fp32 and
     `encode.precision=auto` (bf16 on CPUs with AMX/AVX512-BF16), end to end (actor start and
     model load included) and steady state (the actors' own encode time); with auto precision
     both `encode.tokenize=actor` (in the actor) and `stage` (a CPU task stage ahead of the
     actors, which leave it `encode.tokenize_cpus`), side by side;
  4. the CPU backends side by side on the same tokens (OpenVINO fp32 / bf16, which
     encode.backend=auto runs on a CPU; ONNX Runtime fp32 with its BERT fusions;
     torch.compile fp32), each with its minimum cosine to torch's fp32 vectors;
  5. the other CPU embedders, in-process, each with its own tokenising and batching: fastembed
     (ONNX Runtime) on the same model exported to ONNX here and loaded from that folder (nothing
     downloaded; skipped with one line where fastembed is not installed), and sentence-transformers'
     own backend="onnx" / "openvino" (each skipped with one line where its optimum package does not
     import);
  6. whole processes as users run them: sentence-transformers, fastembed (from the ONNX folder of 5),
     and `pipeline encode` per precision, backend and runner, with the defaults' ratio to each
     (`--whole-process-only`: these alone, the defaults and their two levers, each --rounds times);
with each row's GFLOP/s against this CPU's measured matmul peak,
and the ratios pipeline / sentence-transformers fp32 and Ray Data / plain loop, the
cosine of bf16 to fp32 vectors, and nDCG@10 (queries and documents encoded in the same
precision, exact search) of fp32 and bf16 when qrels are there.

Memory: driver peak RSS/USS and Ray processes' PSS for a synthetic corpus at several sizes.

    python bench/encode.py                                  # FAQ x3, MiniLM, then memory
    python bench/encode.py --beir ~/data/scifact --repeat 1 --skip-memory
    python bench/encode.py --skip-throughput --rss-n 1000 --rss-mults 1,10,30
"""

from __future__ import annotations

from machine import print_cpu, scratch  # bench/machine.py (run as python bench/<name>.py)

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
ROOT = Path(__file__).resolve().parents[1]
FAQ = ROOT / "pipeline" / "resources" / "python_faq"
WORDS = ("the of and to in is was for on as with by he at from his an were are which this be has or had "
         "python retrieval dense passage query index vector model train encoder ray data shard corpus").split()


def make_corpus(folder: Path, n: int, part_rows: int) -> Path:
    from pipeline.data.ingest import ingest

    rng = random.Random(0)
    src = folder / f"collection-{n}.tsv"
    with open(src, "w") as f:
        for i in range(n):
            f.write(f"{i}\t{' '.join(rng.choice(WORDS) for _ in range(rng.randint(40, 90)))}\n")
    out = folder / f"corpus-{n}"
    ingest([src], "msmarco", out, part_rows=part_rows, progress=False)
    return out


def ray_encode(corpus: Path, out: Path, model_dir: str, batch: int, max_len: int, actors: int | None,
               cpus: float | None, threads: int, precision: str = "fp32", tokenize: str = "auto",
               shard_rows: int = 2048, backend: str = "torch") -> dict:
    from pipeline.config import load_config
    from pipeline.index.encode import encode_corpus

    shape = ([f"encode.num_actors={actors}"] if actors else []) + ([f"encode.cpus_per_actor={cpus}"] if cpus else [])
    cfg = load_config(None, [f"model.name_or_path={model_dir}", f"model.doc_max_length={max_len}",
                             f"encode.batch_size={batch}", f"encode.torch_threads={threads}",
                             f"encode.precision={precision}", f"encode.tokenize={tokenize}", f"encode.shard_rows={shard_rows}",
                             f"encode.backend={backend}", "encode.show_progress=false", *shape])
    t0 = time.perf_counter()
    summary = encode_corpus(corpus, out, cfg)
    summary["wall"] = time.perf_counter() - t0
    markers = [json.loads(p.read_text()) for p in out.glob("shard-*.done")]
    summary["actor_seconds"] = sum(m.get("seconds", 0.0) for m in markers)
    summary["precisions"] = sorted({m.get("precision") for m in markers})
    summary["tokenize_seconds"] = sum(m.get("tokenize_seconds", 0.0) for m in markers)
    return summary


# sentence-transformers as a user runs it: a whole process that loads the model and encodes the texts
ST_PROCESS = ("import json, sys, torch; torch.set_num_threads(int(sys.argv[3])); "
              "from sentence_transformers import SentenceTransformer; "
              "m = SentenceTransformer(sys.argv[1], device='cpu'); m.max_seq_length = int(sys.argv[4]); "
              "m.encode(json.load(open(sys.argv[2])), batch_size=int(sys.argv[5]))")


# fastembed as a user runs it: a whole process that registers the model's ONNX folder (made once by
# fastembed_folder, as a user's own export) and embeds the texts
FE_PROCESS = ("import json, sys; from fastembed import TextEmbedding; "
              "from fastembed.common.model_description import ModelSource, PoolingType; "
              "a = json.loads(sys.argv[1]); "
              "TextEmbedding.add_custom_model(model='local/bench-encode', pooling=PoolingType[a['pooling']], "
              "normalization=a['normalize'], sources=ModelSource(hf='local/bench-encode'), dim=a['dim'], "
              "model_file='model.onnx'); "
              "fe = TextEmbedding('local/bench-encode', specific_model_path=a['folder'], threads=a['threads'], "
              "cache_dir=a['cache']); "
              "list(fe.embed(json.load(open(a['texts'])), batch_size=a['batch']))")


def whole_process(argv: list[str]) -> tuple[float, str]:
    """Wall time of a command from its start to its exit (Python start, imports, Ray or not, the
    model load, the work), and its last line."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("RAY_ADDRESS", None)
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"{' '.join(argv[:6])} ... failed (exit {r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-3000:]}")
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    return wall, lines[-1] if lines else ""


def _ray_pss() -> int:
    """Proportional set size of every Ray process: shared object-store pages counted once."""
    import psutil

    total = 0
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if "ray::" in cmd or "raylet" in cmd or "gcs_server" in cmd:
                total += p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied, TypeError, AttributeError):
            pass
    return total


def child_rss(args) -> None:
    """Subprocess: encode one corpus, print peak driver RSS and peak Ray-process RSS as JSON."""
    import resource

    import ray

    from pipeline.runtime_env import setup_offline_env

    setup_offline_env()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    import psutil

    peak = {"ray": 0, "driver_uss": 0}
    stop = threading.Event()
    me = psutil.Process()

    def watch():
        while not stop.is_set():
            peak["ray"] = max(peak["ray"], _ray_pss())
            # USS: the driver's private memory, without the object-store pages it maps to read results
            peak["driver_uss"] = max(peak["driver_uss"], me.memory_full_info().uss)
            time.sleep(0.2)

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    s = ray_encode(Path(args.corpus), Path(args.out), args.model, args.batch, args.max_length, 1, 1.0, args.threads)
    stop.set()
    th.join()
    driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("RSS " + json.dumps({"driver": driver, "driver_uss": peak["driver_uss"], "ray": peak["ray"],
                               "rows": s["rows"], "wall": s["wall"]}))


def beir_copy(src: Path, dst: Path, repeat: int, max_docs: int = 0) -> Path:
    """A BEIR folder whose corpus is `repeat` copies of `src`'s (copies 2.. get new ids), of its first
    `max_docs` documents when that is set."""
    import shutil

    dst.mkdir(parents=True, exist_ok=True)
    lines = (src / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    lines = lines[:max_docs] if max_docs else lines
    with open(dst / "corpus.jsonl", "w", encoding="utf-8") as f:
        for j in range(repeat):
            for line in lines:
                doc = json.loads(line)
                if j:
                    doc["_id"] = f"{doc['_id']}~{j}"
                f.write(json.dumps(doc) + "\n")
    shutil.copy(src / "queries.jsonl", dst / "queries.jsonl")
    shutil.copytree(src / "qrels", dst / "qrels", dirs_exist_ok=True)
    return dst


def corpus_texts(corpus: Path) -> tuple[list[str], list[str]]:
    import pyarrow.parquet as pq

    from pipeline.data.manifest import join_title, load_manifest

    manifest = load_manifest(corpus)
    pids, texts = [], []
    for part in manifest["parts"]:
        t = pq.read_table(corpus / part["file"])
        pids += [str(p) for p in t["pid"].to_pylist()]
        texts += [join_title(a, b, manifest["title_join"]) for a, b in zip(t["title"].to_pylist(), t["text"].to_pylist())]
    return pids, texts


def backend_runners(model, texts: list[str], threads: int, tmp: Path, compile_torch: bool) -> dict:
    """{label: (runner for BiEncoder.embed_tokens, precision, seconds spent making it)} for the CPU
    backends measured side by side: OpenVINO (what encode.backend=auto runs here) in fp32 and bf16,
    ONNX Runtime fp32 with its BERT fusions (attention / layer norm / GELU, as optimum's optimiser
    does), and torch.compile fp32."""
    import torch

    from pipeline.models.backends import OpenVinoTower, _Tower, _input_names, _probe_batches
    from pipeline.models.precision import cpu_has_bf16

    out = {}
    for prec in ("fp32",) + (("bf16",) if cpu_has_bf16() else ()):
        t0 = time.perf_counter()
        tower = OpenVinoTower(model, "doc", prec, threads, cache=tmp / "exports")
        out[f"OpenVINO {prec}"] = (tower, prec, time.perf_counter() - t0)
    names = _input_names(model, "doc")
    try:
        import onnxruntime as ort
        from onnxruntime.transformers import optimizer

        t0 = time.perf_counter()
        onnx_path = tmp / "tower.onnx"
        example = tuple(torch.from_numpy(_probe_batches(model, "doc")[0][n]) for n in names)
        with torch.no_grad():
            torch.onnx.export(_Tower(model, "doc").eval(), example, str(onnx_path), input_names=names,
                              output_names=["vectors"], opset_version=17, dynamo=False,
                              dynamic_axes={**{n: {0: "batch", 1: "width"} for n in names}, "vectors": {0: "batch"}})
        cfg = model.doc_encoder.config
        fused = optimizer.optimize_model(str(onnx_path), model_type="bert", num_heads=cfg.num_attention_heads,
                                         hidden_size=cfg.hidden_size)
        fused.save_model_to_file(str(tmp / "tower-fused.onnx"))
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(str(tmp / "tower-fused.onnx"), so, providers=["CPUExecutionProvider"])
        out["ONNX Runtime fp32 (BERT fusions)"] = (lambda b: sess.run(None, {n: b[n] for n in names})[0], "fp32",
                                                   time.perf_counter() - t0)
    except ImportError as e:
        print(f"(ONNX Runtime rows skipped: {e}; pip install onnxruntime onnx)", flush=True)
    if compile_torch:
        t0 = time.perf_counter()
        compiled = torch.compile(_Tower(model, "doc").eval(), dynamic=True)

        def run_compiled(b):
            with torch.inference_mode():
                return compiled(*(torch.from_numpy(b[n]) for n in names)).float().numpy()

        tok, prefix, max_len = model.token_spec("doc")
        from pipeline.models.tokens import tokenize_sorted

        model.embed_tokens(tokenize_sorted(tok, texts[:256], prefix, max_len), "doc", runner=run_compiled)  # compiles
        out["torch.compile fp32"] = (run_compiled, "fp32", time.perf_counter() - t0)
    return out


def fastembed_folder(model, model_dir: Path, max_len: int, out: Path) -> Path:
    """The model's document tower as fastembed loads a local model: `model.onnx` (the transformer exported
    by torch.onnx, last_hidden_state out: fastembed pools and normalises in numpy, as it runs its own
    MiniLM export) beside the tokenizer files, tokenizer_config.json's model_max_length set to `max_len`
    (fastembed truncates there, not at sentence-transformers' max_seq_length)."""
    import shutil

    import torch

    from pipeline.models.backends import _input_names, _probe_batches

    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json", "vocab.txt"):
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, out / name)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps({**cfg, "model_max_length": max_len}))
    names = _input_names(model, "doc")
    tower = model.doc_encoder.eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tower = tower

        def forward(self, *arrays):
            return self.tower(**dict(zip(names, arrays))).last_hidden_state

    example = tuple(torch.from_numpy(_probe_batches(model, "doc")[0][n]) for n in names)
    with torch.no_grad():
        torch.onnx.export(Hidden(), example, str(out / "model.onnx"), input_names=names,
                          output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                          dynamic_axes={**{n: {0: "batch", 1: "width"} for n in names},
                                        "last_hidden_state": {0: "batch", 1: "width"}})
    return out


FASTEMBED_PROCESS: dict = {}  # what the fastembed whole-process row needs, once other_embedders made its folder


def other_embedders(model, model_dir: Path, threads: int, batch: int, max_len: int, tmp: Path) -> dict:
    """{label: (encode(texts) -> float32 vectors, seconds spent making it)} for the other CPU embedders a
    user would reach for, in this process, nothing downloaded: fastembed (ONNX Runtime) on the same MiniLM
    exported to ONNX here, and sentence-transformers' own backend="onnx" / "openvino". One line per row that
    cannot run here, saying why."""
    import importlib.util

    import numpy as np

    out = {}
    try:
        from fastembed import TextEmbedding
        from fastembed.common.model_description import ModelSource, PoolingType
    except ImportError as e:
        print(f"(fastembed row skipped: {e}; see docs/performance.md for installing it beside this project's "
              f"huggingface_hub)", flush=True)
    else:
        head = model.doc_head
        pooling = {"mean": PoolingType.MEAN, "cls": PoolingType.CLS}.get(head.pooling)
        files = [f for f in ("tokenizer.json", "tokenizer_config.json") if not (model_dir / f).exists()]
        if files:
            print(f"(fastembed row skipped: the model's folder has no {' or '.join(files)}, which fastembed "
                  f"reads)", flush=True)
        elif pooling is None or len(head.token_dense) or len(head.sentence_dense) or model.cfg.doc_prefix:
            print(f"(fastembed row skipped: fastembed pools by mean or CLS with nothing after it and no prefix; "
                  f"this model pools {head.pooling!r}, with Dense layers or a document prefix)", flush=True)
        else:
            t0 = time.perf_counter()
            folder = fastembed_folder(model, model_dir, max_len, tmp / "fastembed-model")
            name = "local/bench-encode"  # a name of our own: registered here, loaded from `folder`, never fetched
            TextEmbedding.add_custom_model(model=name, pooling=pooling, normalization=head.normalize,
                                           sources=ModelSource(hf=name), dim=int(model.dim), model_file="model.onnx")
            fe = TextEmbedding(name, specific_model_path=str(folder), threads=threads,
                               cache_dir=str(tmp / "fastembed-cache"))
            out["fastembed fp32 (ONNX Runtime, the same model exported)"] = (
                lambda texts: np.stack(list(fe.embed(texts, batch_size=batch))).astype(np.float32),
                time.perf_counter() - t0)
            FASTEMBED_PROCESS.update(folder=str(folder), pooling=pooling.name, normalize=bool(head.normalize),
                                     dim=int(model.dim), threads=threads, batch=batch,
                                     cache=str(tmp / "fastembed-cache"))
    for backend, module in (("onnx", "optimum.onnxruntime"), ("openvino", "optimum.intel.openvino")):
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # a parent package missing
            found = False
        if not found:
            print(f"(sentence-transformers backend={backend!r} row skipped: {module} is not importable; "
                  f"`pip install sentence-transformers[{backend}]` needs an optimum release that supports this "
                  f"transformers, see docs/performance.md)", flush=True)
            continue
        import shutil

        from sentence_transformers import SentenceTransformer

        t0 = time.perf_counter()
        copy = tmp / f"st-{backend}-model"  # the export is made in a copy, never in the installed model's folder
        shutil.copytree(model_dir, copy, dirs_exist_ok=True)
        try:
            st = SentenceTransformer(str(copy), device="cpu", backend=backend)
        except Exception as e:  # noqa: BLE001 (a bench row: say why and go on)
            print(f"(sentence-transformers backend={backend!r} row skipped: {str(e).splitlines()[0]})", flush=True)
            continue
        st.max_seq_length = max_len
        out[f"sentence-transformers backend={backend} fp32"] = (
            lambda texts, st=st: np.asarray(st.encode(texts, batch_size=batch), dtype=np.float32),
            time.perf_counter() - t0)
    return out


def encoder_gflop(config, lengths) -> float:
    """GFLOP of one forward pass of a BERT-style encoder over texts of these token lengths (unpadded:
    the useful work; a multiply-add is 2 FLOP). Per layer and text of n tokens, hidden h, FFN width i:
    Q, K, V and output projections 8nh², the FFN 4nhi, attention scores and their use of V 4n²h."""
    import numpy as np

    n = np.asarray(lengths, dtype=np.float64)
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    return float(layers * (8 * n * h * h + 4 * n * h * i + 4 * n * n * h).sum() / 1e9)


def gemm_peak(threads: int, kinds=("fp32", "bf16")) -> dict[str, float]:
    """This CPU's measured matmul peak in GFLOP/s: the best rate of a 2048 x 2048 matrix product by
    torch.mm and numpy (fp32) and torch.mm (bf16), best of 5 each. It is the ceiling the encoders'
    rates are set against (a datasheet peak needs the core's vector width and boost clock, which a
    VM's /proc/cpuinfo does not tell); a backend with better kernels than these libraries' GEMMs can
    pass 100 %."""
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        if name not in kinds:
            out[name] = float("nan")  # (bf16 without native bf16 is emulated: minutes for nothing useful)
            continue
        a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
        torch.mm(a, b)
        best = min(timed(lambda: torch.mm(a, b))[0] for _ in range(5))
        if name == "fp32":  # numpy's BLAS (its own thread count: OPENBLAS/OMP_NUM_THREADS)
            na, nb = a.numpy(), b.numpy()
            na @ nb
            best = min(best, min(timed(lambda: na @ nb)[0] for _ in range(5)))
        out[name] = 2 * 2048 ** 3 / best / 1e9
    return out


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def load_vectors(emb: Path) -> tuple[list[str], "np.ndarray"]:
    import numpy as np

    from pipeline.index.shards import iter_shards

    pids, vecs = [], []
    for p, v in iter_shards(emb):
        pids += p
        vecs.append(np.asarray(v, dtype=np.float32))
    return pids, np.concatenate(vecs)


def ndcg10(corpus: Path, model, pids: list[str], docs, precision: str, tmp: Path, split: str) -> float | None:
    """nDCG@10 of exact inner-product search, queries encoded in `precision`."""
    import numpy as np

    from pipeline.config import load_config
    from pipeline.data.readers import load_queries
    from pipeline.eval.metrics import evaluate_files
    from pipeline.eval.runs import write_run

    qrels = corpus / "qrels" / f"{split}.trec"
    if not qrels.exists() or not (corpus / "queries.tsv").exists():
        return None
    queries = load_queries(corpus / "queries.tsv")
    judged = {line.split()[0] for line in qrels.read_text().splitlines() if line.strip()}
    qids = [q for q in queries if q in judged]
    qv = model.embed([queries[q] for q in qids], "query", batch_size=64, precision=precision)
    scores = qv @ docs.T
    top = np.argsort(-scores, axis=1, kind="stable")[:, :10]
    run = tmp / f"run-{precision}.trec"
    write_run(run, qids, pids, np.take_along_axis(scores, top, 1), top, "bench")
    return evaluate_files(run, qrels, load_config(None, []).eval)["metrics"].get("nDCG@10")


WHOLE_ROWS = (("fp32", "torch", "local"), ("fp32", "auto", "local"), ("auto", "torch", "local"), ("auto", "auto", "local"),
              ("auto", "auto", "ray"), ("int8", "auto", "local"), ("int8", "auto", "local-again"))
# --whole-process-only: what a user has against the defaults, and the defaults' two levers (bf16, the backend)
WHOLE_ONLY_ROWS = (("fp32", "torch", "local"), ("auto", "torch", "local"), ("auto", "auto", "local"))


def whole_processes(args, tmp: Path, corpus: Path, texts: list[str], auto: str, keep_best, rows, rounds: int) -> None:
    """Whole processes, as users run them (Python start, imports, the model load, Ray or not, the work):
    sentence-transformers, fastembed (when other_embedders made its folder) and `pipeline encode` per
    (precision, backend, runner) of `rows`, `rounds` times in turn (the best of each kept). The CLI's export
    cache is the one the backend rows (or the warm-up) converted into, as a user's second run of the model."""
    from pipeline.models.loading import resolve_model_path

    n, T, B, L = len(texts), args.threads, args.batch, args.max_length
    texts_file = tmp / "texts.json"
    texts_file.write_text(json.dumps(texts))
    env_cache = os.environ.get("PIPELINE_EXPORT_CACHE")
    os.environ["PIPELINE_EXPORT_CACHE"] = str(tmp / "exports")
    for rnd in range(rounds):
        st_wall, _ = whole_process([sys.executable, "-c", ST_PROCESS, str(resolve_model_path(args.model)),
                                    str(texts_file), str(T), str(L), str(B)])
        keep_best("sentence-transformers fp32 (whole process)", n / st_wall)
        print(f"sentence-transformers fp32 (whole process): {st_wall:.1f}s", flush=True)
        if FASTEMBED_PROCESS:  # fastembed the same way (its ONNX folder made before, as a user's own export)
            fe_wall, _ = whole_process([sys.executable, "-c", FE_PROCESS,
                                        json.dumps({**FASTEMBED_PROCESS, "texts": str(texts_file)})])
            keep_best("fastembed fp32 (whole process)", n / fe_wall)
            print(f"fastembed fp32 (whole process): {fe_wall:.1f}s", flush=True)
        for prec, backend, runner in rows:
            again = runner.endswith("-again")  # int8's second run: the quantised tower from the cache
            runner = runner.removesuffix("-again")
            out = tmp / f"cli-{prec}-{backend}-{runner}{'-again' if again else ''}{f'-{rnd}' if rnd else ''}"
            wall, line = whole_process(
                [sys.executable, "-m", "pipeline.cli", "encode", "--corpus", str(corpus), "--out", str(out),
                 "--model", args.model, f"model.doc_max_length={L}", f"encode.batch_size={B}",
                 f"encode.torch_threads={T}", f"encode.precision={prec}", f"encode.backend={backend}",
                 f"encode.runner={runner}", "encode.show_progress=false"]
                + ([f"encode.shard_rows={args.shard_rows}"] if args.shard_rows else []))  # else the CLI's own
            used = line[line.find(" by ") + 4:].split(" ", 1)[0] if " by " in line else backend
            int8 = (" (opt-in, calibrated on the first 300 passages" + (", cached" if again else ", quantised now")
                    + ")") if prec == "int8" else ""
            label = (f"`pipeline encode` {prec}{f'={auto}' if prec == 'auto' else ''}{int8} backend={backend}"
                     f"{f'={used}' if backend == 'auto' else ''} runner={runner} (whole process)")
            keep_best(label, n / wall)
            split = line[line.find("(start-up"):line.find(")", line.find("(start-up")) + 1] if "(start-up" in line else ""
            print(f"{label}: {wall:.1f}s {split}", flush=True)
    if env_cache is None:
        os.environ.pop("PIPELINE_EXPORT_CACHE", None)
    else:
        os.environ["PIPELINE_EXPORT_CACHE"] = env_cache


def rates_table(args, model, texts: list[str], auto: str, rates: dict, cosines: dict) -> None:
    """Every row's rate, its ratio to sentence-transformers fp32 (in-process rows to its in-process rate, whole
    processes to its whole process) and its GFLOP/s against this CPU's measured matmul peak; then the
    defaults' whole-process ratio to each embedder a user already has."""
    n, T = len(texts), args.threads
    base = rates.get("sentence-transformers fp32")
    whole = rates["sentence-transformers fp32 (whole process)"]
    tok, prefix, max_len = model.token_spec("doc")
    lengths = [len(x) for x in tok([prefix + t for t in texts], truncation=True, max_length=max_len)["input_ids"]]
    gflop = encoder_gflop(model.doc_encoder.config, lengths) / n  # per passage
    from pipeline.models.precision import cpu_has_bf16

    peak = gemm_peak(T, ("fp32", "bf16") if cpu_has_bf16() else ("fp32",))  # emulated bf16: minutes, no use
    print(f"\nwork: {gflop:.2f} GFLOP per passage ({sum(lengths) / n:.0f} tokens on average); this CPU's measured "
          f"matmul peak with {T} threads: fp32 {peak['fp32']:.0f} GFLOP/s (best of torch.mm and numpy), bf16 "
          f"{peak['bf16']:.0f} GFLOP/s (torch.mm), 2048x2048", flush=True)
    for label, rate in rates.items():
        ref, ref_name = (whole, "whole process") if "whole process" in label else (base, "in-process")
        kind = "bf16" if "bf16" in label else "fp32"  # (int8 rows: against the fp32 peak too)
        print(f"{label:84s} {rate:8.1f} psg/s   {rate / ref:5.2f}x sentence-transformers fp32 ({ref_name})   "
              f"{rate * gflop:6.1f} GFLOP/s = {100 * rate * gflop / peak[kind]:3.0f}% of the {kind} peak"
              + (f"   min cosine vs fp32 {cosines[label]:.6f}" if label in cosines else ""), flush=True)
    defaults = next(label for label in rates if label.startswith(f"`pipeline encode` auto={auto} backend=auto")
                    and "runner=local" in label)
    for other in ("sentence-transformers fp32 (whole process)", "fastembed fp32 (whole process)"):
        if other in rates:  # what a user has against the CLI's defaults, each as its own whole process
            print(f"`pipeline encode` defaults / {other}: {rates[defaults] / rates[other]:.2f}x")


def throughput(args, tmp: Path) -> None:
    import numpy as np
    import ray
    import torch

    from pipeline.config import ModelConfig
    from pipeline.data.ingest import ingest
    from pipeline.models import BiEncoder
    from pipeline.models.loading import resolve_model_path
    from pipeline.models.precision import resolve_precision

    src = Path(args.beir) if args.beir else FAQ
    folder = beir_copy(src, tmp / "beir", args.repeat, args.max_docs) if args.repeat > 1 or args.max_docs else src
    corpus = tmp / "corpus"
    ingest([folder], "beir", corpus, part_rows=args.part_rows, progress=False,  # (judgements of documents
           on_unknown_qrels="skip" if args.max_docs else "error")  # --max-docs left out: dropped)
    pids, texts = corpus_texts(corpus)
    n, T, B, L = len(texts), args.threads, args.batch, args.max_length
    auto = resolve_precision("auto", "cpu")
    print(f"\n== encode throughput: {n} passages ({src.name}{f' first {args.max_docs}' if args.max_docs else ''} "
          f"x{args.repeat}), model {args.model}, {T} threads, batch {B}, max_len {L}; precision auto = {auto} here"
          + ("; whole processes only" if args.whole_process_only else "") + " ==", flush=True)
    torch.set_num_threads(T)
    rates: dict[str, float] = {}

    def keep_best(label: str, rate: float) -> None:  # best of the rounds: the machine may be shared
        rates[label] = max(rates.get(label, 0.0), rate)

    model = BiEncoder.load(ModelConfig(name_or_path=args.model, doc_max_length=L))
    if args.whole_process_only:
        from pipeline.models.backends import OpenVinoTower, openvino_available

        if openvino_available():  # the export the defaults read, converted once as on a user's first run
            OpenVinoTower(model, "doc", auto, T, cache=tmp / "exports")
        other_embedders(model, resolve_model_path(args.model), T, B, L, tmp)  # fastembed's ONNX folder
        whole_processes(args, tmp, corpus, texts, auto, keep_best, WHOLE_ONLY_ROWS, args.rounds)
        return rates_table(args, model, texts, auto, rates, {})
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(resolve_model_path(args.model)), device="cpu")
    st.max_seq_length = L
    st.encode(texts[:8], batch_size=B)
    model.embed(texts[:8], "doc", batch_size=B)
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    shapes: dict[str, dict] = {}
    for rnd in range(args.rounds):
        keep_best("sentence-transformers fp32", n / timed(lambda: st.encode(texts, batch_size=B))[0])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            keep_best("sentence-transformers bf16 autocast", n / timed(lambda: st.encode(texts, batch_size=B))[0])
        keep_best("plain loop (BiEncoder.embed) fp32",
                  n / timed(lambda: model.embed(texts, "doc", batch_size=B, precision="fp32"))[0])
        keep_best(f"plain loop (BiEncoder.embed) auto={auto}",
                  n / timed(lambda: model.embed(texts, "doc", batch_size=B, precision="auto"))[0])
        for prec, tok in (("fp32", "actor"), ("auto", "actor"), ("auto", "stage")):
            # the stage runs beside the actors: their default shape leaves it encode.tokenize_cpus
            r = ray_encode(corpus, tmp / f"emb-{prec}-{tok}-{rnd}", args.model, B, L, None, None, T, prec, tok,
                           args.shard_rows or 128)
            label = f"pipeline encode {prec}" + (f"={auto}" if prec == "auto" else "") + f" tokenize={tok}"
            keep_best(label + " (end to end)", n / r["wall"])
            if tok == "actor":  # the actors' own time covers read + tokenise + model + write
                keep_best(label + " (steady state)", n * r["actors"] / r["actor_seconds"])
            shapes[tok] = r
        print(f"[round {rnd + 1}/{args.rounds} done]", flush=True)
    ray.shutdown()
    del st

    # the CPU backends side by side, in this process, same tokens path as BiEncoder.embed
    from pipeline.models.tokens import tokenize_sorted

    tok, prefix, max_len = model.token_spec("doc")
    ref32 = model.embed(texts, "doc", batch_size=B, precision="fp32")
    cosines: dict[str, float] = {}
    for label, (runner, prec, made) in backend_runners(model, texts, T, tmp, not args.skip_compile).items():
        def run():
            return model.embed_tokens(tokenize_sorted(tok, texts, prefix, max_len), "doc", batch_size=B,
                                      precision=prec, runner=runner)
        run()  # warm (shapes seen once)
        secs, vecs = min((timed(run) for _ in range(args.rounds)), key=lambda x: x[0])
        cos = (vecs * ref32).sum(1) / np.linalg.norm(vecs, axis=1) / np.linalg.norm(ref32, axis=1)
        cosines[f"plain loop {label}"] = float(cos.min())
        keep_best(f"plain loop {label}", n / secs)
        print(f"plain loop {label}: {n / secs:.1f} psg/s, min cosine vs torch fp32 {cos.min():.6f} "
              f"(made in {made:.1f}s)", flush=True)

    # the other CPU embedders (fastembed, sentence-transformers' onnx / openvino backends), in this process
    # on the same texts, batch size and threads, each with its own tokenising and batching
    for label, (encode_fn, made) in other_embedders(model, resolve_model_path(args.model), T, B, L, tmp).items():
        encode_fn(texts[:8])  # warm
        secs, vecs = min((timed(lambda: encode_fn(texts)) for _ in range(args.rounds)), key=lambda x: x[0])
        cos = (vecs * ref32).sum(1) / np.linalg.norm(vecs, axis=1) / np.linalg.norm(ref32, axis=1)
        cosines[label] = float(cos.min())
        keep_best(label, n / secs)
        print(f"{label}: {n / secs:.1f} psg/s, min cosine vs torch fp32 {cos.min():.6f} (made in {made:.1f}s)",
              flush=True)

    whole_processes(args, tmp, corpus, texts, auto, keep_best, WHOLE_ROWS, 1)
    rates_table(args, model, texts, auto, rates, cosines)
    for tok, shape in shapes.items():
        print(f"(pipeline encode tokenize={tok}: {shape['actors']} actor(s) x {shape['cpus_per_actor']:g} CPUs, "
              f"{shape['torch_threads']} threads; precisions used {shape['precisions']}"
              + (f"; tokenising tasks spent {shape['tokenize_seconds']:.1f}s" if tok == "stage" else "") + ")")
    plain = rates[f"plain loop (BiEncoder.embed) auto={auto}"]
    for kind in ("end to end", "steady state"):
        print(f"Ray Data / plain loop ({kind}, auto, tokenize=actor): "
              f"{rates[f'pipeline encode auto={auto} tokenize=actor ({kind})'] / plain:.2f}x")
    stage, actor = (rates[f"pipeline encode auto={auto} tokenize={t} (end to end)"] for t in ("stage", "actor"))
    print(f"tokenize=stage / tokenize=actor (end to end, auto): {stage / actor:.2f}x")

    p32, v32 = load_vectors(tmp / "emb-fp32-actor-0")
    pa, va = load_vectors(tmp / "emb-auto-actor-0")
    ps, vs = load_vectors(tmp / "emb-auto-stage-0")
    assert p32 == pa == ps == pids
    print(f"tokenize=stage vs tokenize=actor vectors: max abs diff {np.abs(vs - va).max():.2e}")
    cos = (v32 * va).sum(1) / np.linalg.norm(v32, axis=1) / np.linalg.norm(va, axis=1)
    print(f"cosine {auto} vs fp32 vectors: min {cos.min():.6f}, mean {cos.mean():.6f}")
    keep = [i for i, p in enumerate(pids) if "~" not in p]  # the original corpus, not the copies
    split = args.split or next((s for s in ("test", "all") if (corpus / "qrels" / f"{s}.trec").exists()), "test")
    pd, vd = load_vectors(tmp / "cli-auto-auto-local")  # the CLI's defaults (backend auto)
    assert pd == pids
    cos = (v32 * vd).sum(1) / np.linalg.norm(v32, axis=1) / np.linalg.norm(vd, axis=1)
    print(f"cosine of the defaults' vectors (precision {auto}, backend auto) vs torch fp32: min {cos.min():.6f}, "
          f"mean {cos.mean():.6f}")
    p8, v8 = load_vectors(tmp / "cli-int8-auto-local")
    assert p8 == pids
    cos8 = (v32 * v8).sum(1) / np.linalg.norm(v32, axis=1) / np.linalg.norm(v8, axis=1)
    print(f"cosine of int8 (opt-in) vectors vs torch fp32: min {cos8.min():.6f}, mean {cos8.mean():.6f}")
    scores = {prec: ndcg10(corpus, model, [pids[i] for i in keep], v[keep], p, tmp, split)
              for prec, p, v in (("fp32", "fp32", v32), (auto, auto, va), ("defaults", auto, vd), ("int8", "fp32", v8))}
    if scores["int8"] is not None:
        print(f"nDCG@10 ({split} qrels) with int8 documents (queries fp32): {scores['int8']:.4f} "
              f"(diff {scores['int8'] - scores['fp32']:+.4f} vs fp32)")
    if scores["fp32"] is not None:
        print(f"nDCG@10 ({split} qrels, exact search): fp32 {scores['fp32']:.4f}, {auto} {scores[auto]:.4f} "
              f"(diff {scores[auto] - scores['fp32']:+.4f}), defaults (backend auto, {auto}) {scores['defaults']:.4f} "
              f"(diff {scores['defaults'] - scores['fp32']:+.4f}; queries encoded by torch in {auto})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="minilm", help="'minilm' (default), 'tiny' (random BERT) or a model dir")
    ap.add_argument("--beir", help="a BEIR folder (corpus.jsonl, queries.jsonl, qrels/); default: the bundled FAQ")
    ap.add_argument("--repeat", type=int, default=3, help="encode this many copies of the corpus (longer runs)")
    ap.add_argument("--rounds", type=int, default=2, help="measure every row this many times, keep the best")
    ap.add_argument("--max-docs", type=int, default=0, help="only the corpus's first N documents (0: all)")
    ap.add_argument("--whole-process-only", action="store_true",
                    help="only whole processes: sentence-transformers fp32, fastembed and `pipeline encode` "
                         "(torch fp32, torch auto, the defaults), --rounds times in turn")
    ap.add_argument("--split", help="qrels split for nDCG@10 (default: test, else all)")
    ap.add_argument("--part-rows", type=int, default=100_000)
    ap.add_argument("--shard-rows", type=int, default=0,
                    help="encode.shard_rows of the runs (default: 128 for the Ray Data rows, where several shards "
                         "let a tokenising stage run ahead; the CLI's own default for whole processes)")
    ap.add_argument("--rss-model", default="tiny", help="model of the memory runs (default: a tiny random BERT)")
    ap.add_argument("--rss-n", type=int, default=2000, help="base corpus size for the memory runs")
    ap.add_argument("--rss-mults", default="1,10", help="corpus sizes for the memory runs, as multiples of --rss-n")
    ap.add_argument("--skip-throughput", action="store_true", help="only the memory runs")
    ap.add_argument("--skip-memory", action="store_true", help="only the throughput runs")
    ap.add_argument("--skip-compile", action="store_true", help="no torch.compile row (its compile takes a while)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads, same for every row")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    print_cpu()  # the figures below depend on this CPU's ISA (bench/machine.py)
    from pipeline.runtime_env import setup_offline_env

    setup_offline_env()
    if args.child:
        return child_rss(args)

    tmp = scratch("bench-encode-")
    for attr in ("model", "rss_model"):
        if getattr(args, attr) == "tiny":
            from pipeline.models.tiny import build_tiny_bert

            setattr(args, attr, str(build_tiny_bert(tmp / "tiny", hidden=256, layers=4, heads=4, intermediate=1024)))
    if not args.skip_throughput:
        throughput(args, tmp)
    if not args.skip_memory:
        memory(args, tmp)


def memory(args, tmp: Path) -> None:
    mults = [int(m) for m in args.rss_mults.split(",")]
    print(f"\n== peak memory, corpus sizes {', '.join(f'{m}x' for m in mults)} of {args.rss_n} passages ==")
    rss = {}
    for m in mults:
        size = args.rss_n * m
        c = make_corpus(tmp, size, part_rows=max(1, args.rss_n // 2))
        proc = subprocess.run([sys.executable, __file__, "--child", "--corpus", str(c), "--out", str(tmp / f"rss-{size}"),
                               "--model", args.rss_model, "--batch", str(args.batch), "--max-length", str(args.max_length),
                               "--threads", str(args.threads)], capture_output=True, text=True)
        line = [l for l in proc.stdout.splitlines() if l.startswith("RSS ")]
        if not line:
            print(proc.stdout[-2000:], proc.stderr[-4000:])
            raise SystemExit("RSS child failed")
        rss[m] = json.loads(line[0][4:])
        print(f"{size:7d} passages ({m:>3}x): driver peak RSS {rss[m]['driver'] / 2**20:6.0f} MiB, "
              f"USS {rss[m]['driver_uss'] / 2**20:6.0f} MiB   Ray processes peak PSS {rss[m]['ray'] / 2**20:6.0f} MiB")
    base = rss[mults[0]]
    for m in mults[1:]:
        print(f"ratio {m}x / {mults[0]}x: driver RSS {rss[m]['driver'] / base['driver']:.2f}x, "
              f"USS {rss[m]['driver_uss'] / base['driver_uss']:.2f}x   Ray processes {rss[m]['ray'] / base['ray']:.2f}x")


if __name__ == "__main__":
    main()
