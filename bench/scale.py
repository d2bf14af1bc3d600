"""The whole spine at growing corpus size, through the CLI, with time and memory curves.

    python bench/scale.py --sizes 100k,1m                 # DPR-wiki and MS MARCO layouts, every stage
    python bench/scale.py --sizes 100k,1m,3m --formats dpr-wiki
    python bench/scale.py --sizes 100k --train-pairs 10k,500k --ance   # + training side and an ANCE refresh

For each corpus format and size N it generates a corpus in the real file layout (DPR `psgs_w100.tsv`:
`id  text  title`, 100-word passages with titles; MS MARCO `collection.tsv`: `pid  text`, ~56 words),
10,000 queries and their qrels (each query's words drawn from its relevant passage), all from a
fixed-seed Zipf word distribution and cached under `--work` (deterministic: same seed, same bytes).
It then runs every stage as a user would, `pipeline ingest`, `encode` (a tiny random BERT, so that the
stage's own overheads, not the encoder, are measured on a CPU), `index` (Flat, and IVF-PQ trained on a
bounded sample), `retrieve` (10k queries, top 1000), `evaluate` and `info`, each in its own process,
and samples every 0.2 s the resident memory of the command's process (the driver) and of each Ray
worker under it.

Printed and written (`bench/results/scale.json`, `scale.md`, `scale.png`): per stage and N the wall
time, rate, driver and largest-worker peak RSS, bytes written, and the fitted exponent of time vs N
(log-log least squares; 1.0 = linear, below 1 where fixed start-up still dominates), then the
extrapolation to 21,015,324 (Wikipedia) and 8,841,823 (MS MARCO) passages: on this machine from a
linear fit of the measured times (derived), and on the cluster with `docs/SCALING.md`'s GPU rates for
encoding (derived, assumption).

`--train-pairs` adds the training side (`pipeline train`, DPR, tiny BERT, one worker, hard negatives
from a generated TREC run) per number of query-positive pairs; `--ance` adds one ANCE refresh over the
largest MS MARCO-layout corpus with `--ance-queries` training queries. `--faults` adds the faults
at scale: an ingest of the largest corpus SIGKILLed half way and run again (same manifest, fingerprint
and parts as the uninterrupted one?), an index replacement of the largest corpus killed at several
moments (the old index or the new, complete, every time?), an index and an encode on a disk that
fills (a small tmpfs, when this user may mount one: a message, finished shards kept, a re-run on
a bigger disk resumes?).
"""

from __future__ import annotations

from machine import cpu_line, parse_size, print_cpu  # bench/machine.py (run as python bench/<name>.py)

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
PIPELINE = [sys.executable, "-m", "pipeline.cli"]
WIKI, MSMARCO = 21_015_324, 8_841_823
FILES = {"dpr-wiki": "psgs_w100.tsv", "msmarco": "collection.tsv"}
TARGET = {"dpr-wiki": ("Wikipedia (DPR)", WIKI), "msmarco": ("MS MARCO passage", MSMARCO)}
# docs/SCALING.md §2: MiniLM on one A10G (derived there from FLOPs and an assumed sustained throughput)
GPU_RATE = {"dpr-wiki": 5_550.0, "msmarco": 9_960.0}
GEN_VERSION = 1  # bump when the generator changes: cached corpora are re-made


def human(n: int) -> str:
    return f"{n // 1_000_000}m" if n % 1_000_000 == 0 else f"{n // 1_000}k" if n % 1_000 == 0 else str(n)


# ---------------------------------------------------------------- generation (cached, deterministic)

class Words:
    """A fixed vocabulary of pronounceable pseudo-words with Zipf frequencies."""

    def __init__(self, size: int = 30_000, seed: int = 7):
        rng = np.random.default_rng(seed)
        onset = "b c d f g h j k l m n p r s t v w z br ch cl dr fl gr pl sh st th tr".split()
        vowel = "a e i o u ai ea ee ie oo ou".split()
        words: set[str] = set()
        while len(words) < size:
            n = int(rng.integers(1, 4))
            words.add("".join(onset[rng.integers(len(onset))] + vowel[rng.integers(len(vowel))] for _ in range(n))
                      + ("" if rng.random() < 0.6 else onset[rng.integers(len(onset))]))
        self.vocab = sorted(words)
        rng.shuffle(self.vocab)
        ranks = np.arange(1, size + 1, dtype=np.float64)
        p = 1.0 / (ranks + 2.7)
        self.cdf = np.cumsum(p / p.sum())

    def sample(self, rng, shape) -> np.ndarray:
        return np.minimum(np.searchsorted(self.cdf, rng.random(shape)), len(self.vocab) - 1)

    def text(self, idx) -> str:
        v = self.vocab
        return " ".join([v[i] for i in idx])


def _digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:12]


def generate_corpus(fmt: str, n: int, n_queries: int, work: Path, words: Words) -> Path:
    """`<work>/gen/<fmt>-<N>/`: the corpus file, queries.tsv and qrels.tsv (TREC), made once."""
    folder = work / "gen" / f"{fmt}-{human(n)}"
    key = _digest(GEN_VERSION, fmt, n, n_queries)
    done = folder / "DONE"
    if done.exists() and done.read_text().strip() == key:
        return folder
    if folder.exists():
        shutil.rmtree(folder)  # the bench's own cache, incomplete or of another version
    folder.mkdir(parents=True)
    seed = int(key, 16) % 2**32
    rng = np.random.default_rng(seed)
    targets = np.sort(rng.choice(n, size=min(n_queries, n), replace=False))
    qorder = rng.permutation(len(targets))  # query i asks for passage targets[qorder[i]]
    qid_of = {int(t): f"q{int(i)}" for i, t in zip(np.argsort(qorder), targets)}
    queries: dict[str, str] = {}
    t0 = time.time()
    first_id = 1 if fmt == "dpr-wiki" else 0
    with open(folder / FILES[fmt], "w", encoding="utf-8") as f:
        if fmt == "dpr-wiki":
            f.write("id\ttext\ttitle\n")
        chunk = 20_000
        for lo in range(0, n, chunk):
            c = min(chunk, n - lo)
            if fmt == "dpr-wiki":
                lengths = np.full(c, 100)
            else:
                lengths = np.clip(np.rint(rng.normal(56, 22, c)), 8, 200).astype(int)
            body = words.sample(rng, (c, int(lengths.max())))
            titles = words.sample(rng, (c, 3))
            tlen = rng.integers(1, 4, c)
            lines = []
            for j in range(c):
                idx = body[j, :lengths[j]]
                text = words.text(idx)
                row = lo + j
                if fmt == "dpr-wiki":
                    title = words.text(titles[j, :tlen[j]]).title()
                    lines.append(f"{row + first_id}\t{text}\t{title}\n")
                else:
                    lines.append(f"{row + first_id}\t{text}\n")
                if row in qid_of:
                    pick = rng.choice(len(idx), size=min(8, len(idx)), replace=False)
                    queries[qid_of[row]] = words.text(idx[np.sort(pick)])
            f.writelines(lines)
            if lo // chunk % 25 == 0:
                print(f"  [gen] {fmt} {human(n)}: {lo + c:,}/{n:,} passages ({time.time() - t0:.0f}s)", flush=True)
    with open(folder / "queries.tsv", "w", encoding="utf-8") as fq, open(folder / "qrels.tsv", "w") as fr:
        for i in range(len(targets)):
            qid = f"q{i}"
            fq.write(f"{qid}\t{queries[qid]}\n")
        for row, qid in sorted(qid_of.items(), key=lambda kv: int(kv[1][1:])):
            fr.write(f"{qid} 0 {row + first_id} 1\n")
    done.write_text(key + "\n")
    print(f"  [gen] {fmt} {human(n)}: {n:,} passages, {len(targets):,} queries in {time.time() - t0:.0f}s "
          f"({du(folder) / 1e6:,.0f} MB)", flush=True)
    return folder


def generate_training(fmt: str, n_corpus: int, pairs: int, depth: int, work: Path,
                      words: Words) -> Path:
    """Training queries, qrels (one positive each) and a hard-negatives TREC run (`depth` per query)
    pointing into the generated corpus; `<work>/gen/train-<fmt>-<N>-<pairs>/`."""
    folder = work / "gen" / f"train-{fmt}-{human(n_corpus)}-{human(pairs)}"
    key = _digest(GEN_VERSION, "train", fmt, n_corpus, pairs, depth)
    done = folder / "DONE"
    if done.exists() and done.read_text().strip() == key:
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(int(key, 16) % 2**32)
    first_id = 1 if fmt == "dpr-wiki" else 0
    t0 = time.time()
    with open(folder / "queries.tsv", "w") as fq, open(folder / "qrels.tsv", "w") as fr, \
            open(folder / "negatives.trec", "w") as fn:
        chunk = 20_000
        for lo in range(0, pairs, chunk):
            c = min(chunk, pairs - lo)
            q = words.sample(rng, (c, 8))
            pos = rng.integers(0, n_corpus, c) + first_id
            negs = rng.integers(0, n_corpus, (c, depth)) + first_id
            scores = np.sort(rng.random((c, depth)), axis=1)[:, ::-1] * 10
            fq.writelines(f"t{lo + j}\t{words.text(q[j])}\n" for j in range(c))
            fr.writelines(f"t{lo + j} 0 {pos[j]} 1\n" for j in range(c))
            fn.writelines(f"t{lo + j} Q0 {negs[j, r]} {r + 1} {scores[j, r]:.4f} gen\n"
                          for j in range(c) for r in range(depth) if negs[j, r] != pos[j])
    done.write_text(key + "\n")
    print(f"  [gen] training set: {pairs:,} pairs, {depth} negatives each in {time.time() - t0:.0f}s", flush=True)
    return folder


# ---------------------------------------------------------------- measuring one command

def du(path: Path) -> int:
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def anon_rss(pid: int) -> int:
    """A process's anonymous resident bytes (RssAnon: its heap, tensors, private copies), without the
    file pages it maps (RssFile: e.g. a memory-mapped example store, shared with every process that
    maps it and reclaimable) or shared memory (Ray's object store)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_stage(name: str, argv: list[str], log: Path, outputs: list[Path], env: dict) -> dict:
    """Run one CLI command; time it, sample RSS of the command's process and of the Ray workers under it."""
    import psutil

    log.parent.mkdir(parents=True, exist_ok=True)
    peaks = {"driver": 0, "worker": 0, "worker_name": None, "total": 0, "worker_anon": 0}
    lines: list[tuple[float, str]] = []
    t0 = time.time()
    proc = psutil.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=ROOT, text=True,
                        bufsize=1)

    def read():
        with open(log, "w", buffering=1) as f:
            for line in proc.stdout:
                lines.append((time.time() - t0, line.rstrip("\n")))
                f.write(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while proc.poll() is None:
        try:
            driver = proc.memory_info().rss
            total = driver
            for child in proc.children(recursive=True):
                try:
                    rss = child.memory_info().rss
                    cmd = child.cmdline()
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                total += rss
                title = cmd[0] if cmd else ""
                if any("_child_main" in c for c in cmd[1:3]):  # train's example build (data.build_apart)
                    peaks["build"] = max(peaks.get("build", 0), rss)
                if title.startswith("ray::") and rss > peaks["worker"]:
                    peaks["worker"], peaks["worker_name"] = rss, title.split()[0]
                if title.startswith("ray::"):
                    peaks["worker_anon"] = max(peaks["worker_anon"], anon_rss(child.pid))
            peaks["driver"] = max(peaks["driver"], driver)
            peaks["total"] = max(peaks["total"], total)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            break
        time.sleep(0.2)
    rc = proc.wait()
    reader.join(timeout=10)
    wall = time.time() - t0
    if rc != 0:
        tail = "\n".join(text for _, text in lines[-15:])
        raise SystemExit(f"[scale] {name} failed (exit {rc}); log: {log}\n{tail}")
    summary = next((text for _, text in reversed(lines) if text.startswith("[")), "")
    return {"stage": name, "seconds": round(wall, 2), "driver_rss_mb": round(peaks["driver"] / 2**20, 1),
            "worker_rss_mb": round(peaks["worker"] / 2**20, 1), "worker": peaks["worker_name"],
            "worker_anon_mb": round(peaks["worker_anon"] / 2**20, 1),
            "all_processes_rss_mb": round(peaks["total"] / 2**20, 1),
            "build_child_rss_mb": round(peaks.get("build", 0) / 2**20, 1),
            "bytes_written": sum(du(p) for p in outputs), "summary": summary, "log": str(log),
            "lines": lines}


def fresh(*paths: Path) -> None:
    """The bench's own outputs of an earlier run are removed before a stage writes them again."""
    for p in paths:
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
        meta = Path(str(p) + ".meta.json")
        if meta.exists():
            meta.unlink()


def ivfpq_factory(n: int, dim: int) -> str:
    nlist = 1 << max(6, int(round(math.log2(4 * math.sqrt(n)))))
    m = next(m for m in (16, 8, 4, 2, 1) if dim % m == 0)
    return f"IVF{nlist},PQ{m}"


# ---------------------------------------------------------------- the spine at one size

def spine(fmt: str, n: int, gen: Path, work: Path, model: str, args, env: dict) -> list[dict]:
    w = work / "runs" / f"{fmt}-{human(n)}"
    w.mkdir(parents=True, exist_ok=True)
    corpus, emb, flat, ivf = w / "corpus", w / "emb", w / "flat", w / "ivfpq"
    run, run_ivf, ev = w / "run.trec", w / "run_ivfpq.trec", w / "eval.json"
    fresh(corpus, emb, flat, ivf, run, run_ivf, ev)
    qrels = corpus / "qrels" / "test.trec"
    logs = w / "logs"
    p = PIPELINE
    stages = [
        ("ingest", p + ["ingest", str(gen / FILES[fmt]), "--format", fmt, "--out", str(corpus),
                        "--queries", str(gen / "queries.tsv"), "--qrels", f"test={gen / 'qrels.tsv'}"], [corpus]),
        ("encode", p + ["encode", "--corpus", str(corpus), "--out", str(emb), "--model", model,
                        "model.doc_max_length=128"], [emb]),
        ("index Flat", p + ["index", "--embeddings", str(emb), "--out", str(flat)], [flat]),
        ("index IVF-PQ", None, [ivf]),
        ("retrieve Flat", p + ["retrieve", "--index", str(flat), "--queries", str(gen / "queries.tsv"),
                               "--out", str(run), "--top-k", str(args.top_k)], [run]),
        ("retrieve IVF-PQ", p + ["retrieve", "--index", str(ivf), "--queries", str(gen / "queries.tsv"),
                                 "--out", str(run_ivf), "--top-k", str(args.top_k), "index.nprobe=16"], [run_ivf]),
        ("evaluate", p + ["evaluate", "--run", str(run), "--qrels", str(qrels), "--json", str(ev),
                          "--measures", "RR@10 nDCG@10 R@100 R@1000"], [ev]),
        ("info", p + ["info", str(emb)], []),
    ]
    rows = []
    for name, argv, outs in stages:
        if name == "index IVF-PQ":
            dim = json.loads((emb / "embeddings.json").read_text())["dim"]
            factory = ivfpq_factory(n, dim)
            argv = p + ["index", "--embeddings", str(emb), "--out", str(ivf), "--factory", factory,
                        f"index.train_sample={args.train_sample}"]
        print(f"[scale] {fmt} {human(n)}: {name} ...", flush=True)
        r = run_stage(name, argv, logs / f"{name.replace(' ', '_')}.log", outs, env)
        r.update(format=fmt, n=n, rate=round(n / r["seconds"], 1))
        if name == "index IVF-PQ":
            r["factory"] = factory
        if name.startswith("retrieve") or name == "evaluate":
            r["rate_unit"] = "queries/s"
            r["rate"] = round(args.queries / r["seconds"], 1)
        print(f"[scale] {fmt} {human(n)}: {name}: {r['seconds']:.1f}s, driver {r['driver_rss_mb']:.0f} MB, "
              f"largest worker {r['worker_rss_mb']:.0f} MB, wrote {r['bytes_written'] / 1e6:,.1f} MB  | {r['summary']}",
              flush=True)
        rows.append(r)
    return rows


# ---------------------------------------------------------------- training side and ANCE

def train_at(pairs: int, corpus: Path, tset: Path, work: Path, model: str, args, env: dict) -> dict:
    runs = work / "train-runs"
    name = f"dpr-{human(pairs)}"
    fresh(runs / name)
    argv = PIPELINE + ["train", f"model.name_or_path={model}", "model.query_max_length=16",
                       "model.doc_max_length=96", "data.source=qrels", f"data.corpus={corpus}",
                       f"data.queries={tset / 'queries.tsv'}", f"data.qrels={tset / 'qrels.tsv'}",
                       f"data.negatives_run={tset / 'negatives.trec'}", "data.hard_negatives=1",
                       "data.negatives_depth=10", "loss.name=dpr", "train.num_workers=1",
                       "train.cpus_per_worker=1", f"train.batch_size={args.train_batch}",
                       f"train.max_steps={args.train_steps}", "train.epochs=1", "train.report_every=50",
                       f"train.checkpoint_every={args.train_steps}", f"train.storage_path={runs}", f"train.name={name}",
                       "validation.dev_split=0"]
    print(f"[scale] train {human(pairs)} pairs ...", flush=True)
    r = run_stage(f"train {human(pairs)}", argv, work / "logs" / f"train-{human(pairs)}.log", [runs / name], env)
    summary = json.loads((runs / name / "summary.json").read_text())
    fm = summary.get("final_metrics", {})
    first = next((t for t, text in r["lines"] if re.search(r"\[train\] \S+ step \d+/", text)), None)
    examples = next((t for t, text in r["lines"] if re.match(r"\[train-data\] [\d,]+ examples from", text)), None)
    r.update(pairs=pairs, steps=fm.get("train_steps_run"), time_split=summary.get("time_split"),
             steps_per_s=round(fm["train_steps_run"] / fm["train_seconds"], 2) if fm.get("train_seconds") else None,
             examples_built_s=round(examples, 1) if examples else None,
             first_report_s=round(first, 1) if first else None)
    print(f"[scale] train {human(pairs)}: {r['seconds']:.0f}s, examples built at {r['examples_built_s']}s, first "
          f"report at {r['first_report_s']}s, {r['steps_per_s']} steps/s, driver {r['driver_rss_mb']:.0f} MB, "
          f"largest worker {r['worker_rss_mb']:.0f} MB", flush=True)
    return r


# ---------------------------------------------------------------- report

def fit_exponent(ns, ts) -> float | None:
    if len(ns) < 2:
        return None
    x, y = np.log(np.asarray(ns, float)), np.log(np.asarray(ts, float))
    return float(np.polyfit(x, y, 1)[0])


def linear_at(ns, ys, target: float) -> float | None:
    if len(ns) < 2:
        return None
    b, a = np.polyfit(np.asarray(ns, float), np.asarray(ys, float), 1)
    return float(a + b * target)


def fmt_s(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def report(rows: list[dict], train: list[dict], ance: dict | None, args, command: str | None = None,
           cpu: str | None = None, faults: list[dict] | None = None) -> str:
    command = command or "python bench/scale.py " + " ".join(sys.argv[1:])
    out = ["# Scale bench\n", f"{cpu or cpu_line()}; {round(__import__('psutil').virtual_memory().total / 2**30)} GiB RAM.",
           f"Command: `{command}`; tiny random BERT "
           f"(hidden 32, 2 layers); {args.queries:,} queries, top {args.top_k}.\n"]
    fits = {}
    for fmt in dict.fromkeys(r["format"] for r in rows):
        label, target = TARGET[fmt]
        out += [f"## {label} layout (`{FILES[fmt]}`)\n",
                "| stage | N | wall | rate | driver peak RSS | largest Ray worker | bytes written |",
                "|---|---:|---:|---:|---:|---:|---:|"]
        stages = list(dict.fromkeys(r["stage"] for r in rows if r["format"] == fmt))
        for st in stages:
            for r in (x for x in rows if x["format"] == fmt and x["stage"] == st):
                unit = r.get("rate_unit", "passages/s")
                out.append(f"| {st}{' ' + r['factory'] if r.get('factory') else ''} | {human(r['n'])} | "
                           f"{fmt_s(r['seconds'])} | {r['rate']:,.0f} {unit} | {r['driver_rss_mb']:,.0f} MB | "
                           f"{r['worker_rss_mb']:,.0f} MB | {r['bytes_written'] / 1e6:,.1f} MB |")
        out += ["", "| stage | time exponent (1.0 = linear) | driver RSS, largest / smallest N | "
                    "less the index it builds or searches | "
                    f"here at {target / 1e6:.1f}M (derived: linear fit) | driver RSS at {target / 1e6:.1f}M (derived) "
                    "| cluster (derived) |", "|---|---:|---:|---:|---:|---:|---|"]

        def index_mb(r: dict) -> float | None:
            """The bytes of the index an index or retrieve stage holds (its file: what it must hold)."""
            if not r["stage"].startswith(("index ", "retrieve ")):
                return None
            name = "index " + r["stage"].split(" ", 1)[1]
            built = next((x for x in rows if x["format"] == r["format"] and x["n"] == r["n"] and x["stage"] == name), None)
            return built["bytes_written"] / 2**20 if built else None
        for st in stages:
            sel = sorted((x for x in rows if x["format"] == fmt and x["stage"] == st), key=lambda x: x["n"])
            ns, ts = [x["n"] for x in sel], [x["seconds"] for x in sel]
            e = fit_exponent(ns, ts)
            here = linear_at(ns, ts, target)
            if here is not None and here < ts[-1]:  # no growth with N (work set by the queries): as measured
                here = ts[-1]
            mem = linear_at(ns, [x["driver_rss_mb"] for x in sel], target)
            growth = sel[-1]["driver_rss_mb"] / max(sel[0]["driver_rss_mb"], 1)
            cluster = "as here (head node CPU)"
            if st == "encode":
                cluster = (f"{fmt_s(target / GPU_RATE[fmt])} on one A10G with MiniLM "
                           f"({GPU_RATE[fmt]:,.0f} psg/s, SCALING.md §2), ÷ GPUs")
            less = None
            if index_mb(sel[0]) is not None and index_mb(sel[-1]) is not None:
                less = (sel[-1]["driver_rss_mb"] - index_mb(sel[-1])) / max(sel[0]["driver_rss_mb"] - index_mb(sel[0]), 1)
            fits[(fmt, st)] = {"exponent": e, "here_s": here, "driver_rss_mb": mem, "rss_growth": growth,
                               "rss_growth_less_index": less}
            out.append(f"| {st} | {'—' if e is None else f'{e:.2f}'} | {growth:.2f}x | "
                       f"{'—' if less is None else f'{less:.2f}x'} | "
                       f"{'—' if here is None else fmt_s(here)} | {'—' if mem is None else f'{mem:,.0f} MB'} | {cluster} |")
        out.append("")
    if train:
        out += ["## Training side (`pipeline train`, DPR, tiny BERT, 1 worker, 1 hard negative)\n",
                "| pairs | wall | examples built at | first report at | steps/s | driver peak RSS | example build "
                "(child process) | worker peak RSS | of it anonymous (not file pages) | all processes |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in train:
            out.append(f"| {human(r['pairs'])} | {fmt_s(r['seconds'])} | {r['examples_built_s'] if r['examples_built_s'] is not None else '—'} s | "
                       f"{r['first_report_s']} s | {r['steps_per_s']} | {r['driver_rss_mb']:,.0f} MB | "
                       f"{(str(round(r['build_child_rss_mb'])) + ' MB') if r.get('build_child_rss_mb') else 'in the driver'} | "
                       f"{r['worker_rss_mb']:,.0f} MB | "
                       f"{(format(r['worker_anon_mb'], ',.0f') + ' MB') if r.get('worker_anon_mb') else '—'} | "
                       f"{r['all_processes_rss_mb']:,.0f} MB |")
        out.append("")
    if train and len(train) > 1:
        a, b = train[0], train[-1]
        out += [f"{human(b['pairs'])} vs {human(a['pairs'])} pairs: driver peak RSS "
                f"{b['driver_rss_mb'] / a['driver_rss_mb']:.2f}x, worker {b['worker_rss_mb'] / max(a['worker_rss_mb'], 1):.2f}x"
                + (f" (anonymous memory {b['worker_anon_mb'] / max(a['worker_anon_mb'], 1):.2f}x: the rest is the "
                   "memory-mapped example store's file pages, shared and reclaimable)"
                   if a.get("worker_anon_mb") and b.get("worker_anon_mb") else "") + ", "
                f"first report {b['first_report_s'] - a['first_report_s']:+.1f} s, steps/s "
                f"{b['steps_per_s'] / a['steps_per_s']:.2f}x.\n"]
    if ance:
        out += ["## ANCE refresh at scale (`pipeline refresh --once`, tiny BERT, Flat, top 100)\n",
                "| passages | training queries | refresh wall | refresher's own clock (encode) | s per 1k passages "
                "| refresher RSS | trainer's version load (background) | its RSS | lookup per query |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
                f"| {ance['passages']:,} | {ance['training_queries']:,} | {fmt_s(ance['refresh_wall_s'])} | "
                f"{ance['refresh_seconds_meta']} s ({ance['encode_seconds_meta']} s) | "
                f"{ance['seconds_per_1000_passages']} | {ance['refresh_rss_mb']:,.0f} MB | "
                f"{ance['switch_load_seconds']} s | {ance['switch_rss_mb']:,.0f} MB | {ance['lookup_ms_per_query']} ms |", ""]
    if faults:
        out += ["## Faults at scale\n", "| fault | N | what was done | what was found | as it must be |",
                "|---|---:|---|---|:---:|"]
        for f in faults:
            out.append(f"| {f['fault']} | {human(f['n'])} | {f['done']} | {f['found']} | "
                       f"{'yes' if f['ok'] else '**no**' if f['ok'] is not None else 'skipped'} |")
        out.append("")
    out.append("Wall times are whole commands (Python start, Ray start where the stage uses Ray, the work, "
               "the writes). RSS is sampled every 0.2 s. Derived figures extrapolate a linear fit of the measured "
               "ones; cluster figures also take SCALING.md's assumed GPU rate for encoding.")
    return "\n".join(out), fits


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fmts = list(dict.fromkeys(r["format"] for r in rows))
    fig, axes = plt.subplots(1, len(fmts), figsize=(6.5 * len(fmts), 4.8), squeeze=False)
    for ax, fmt in zip(axes[0], fmts):
        for st in dict.fromkeys(r["stage"] for r in rows if r["format"] == fmt):
            sel = sorted((x for x in rows if x["format"] == fmt and x["stage"] == st), key=lambda x: x["n"])
            ax.plot([x["n"] for x in sel], [x["seconds"] for x in sel], marker="o", label=st)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("passages")
        ax.set_ylabel("wall time (s)")
        ax.set_title(f"{TARGET[fmt][0]} layout")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100k,1m", help="corpus sizes, e.g. 100k,1m,3m")
    ap.add_argument("--formats", default="dpr-wiki,msmarco", help="dpr-wiki, msmarco or both (comma-separated)")
    ap.add_argument("--queries", type=parse_size, default=10_000, help="queries per corpus (default 10k)")
    ap.add_argument("--top-k", type=int, default=1000)
    ap.add_argument("--train-sample", type=int, default=100_000, help="IVF training sample (index.train_sample)")
    ap.add_argument("--train-pairs", default="", help="training side: pair counts, e.g. 10k,500k (off by default)")
    ap.add_argument("--train-steps", type=int, default=300)
    ap.add_argument("--train-batch", type=int, default=16)
    ap.add_argument("--no-spine", action="store_true", help="skip the spine stages (training side / ANCE only)")
    ap.add_argument("--ance", action="store_true", help="one ANCE refresh over the largest MS MARCO-layout corpus")
    ap.add_argument("--ance-queries", type=parse_size, default=100_000)
    ap.add_argument("--faults", action="store_true", help="kills and full disks at scale (after the spine; "
                    "with --no-spine, on the outputs of an earlier spine run under --work)")
    ap.add_argument("--parts", default="", help="an index in parts against one part instead (bench/sharded.py): "
                                                "part counts, e.g. 1,2,4,8, over --rows synthetic vectors")
    ap.add_argument("--rows", default="2m", help="--parts: synthetic vectors (default 2m)")
    ap.add_argument("--dim", type=int, default=384, help="--parts: their dimension (default 384)")
    ap.add_argument("--work", default=str(ROOT / "runs" / "bench-scale"), help="generated data and stage outputs")
    ap.add_argument("--out", default=str(RESULTS), help="where scale.json, scale.md and scale.png go")
    ap.add_argument("--from-json", help="re-render scale.md and scale.png from a scale.json, run nothing")
    args = ap.parse_args()
    if args.parts:  # the sharded index's benchmark (bench/sharded.py), with this command's sizes
        import types

        import sharded

        sharded.run(types.SimpleNamespace(work=str(Path(args.work) / "sharded"), rows=parse_size(args.rows),
                                          dim=args.dim, shard_rows=100_000, parts=args.parts, queries=1000,
                                          top_k=100, no_ivf=False, out=args.out))
        return
    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        args.queries, args.top_k = data["queries"], data["top_k"]
        text, _ = report(data["stages"], data["training"], data["ance"], args, data["command"], data.get("cpu"),
                         faults=data.get("faults"))
        (out / "scale.md").write_text(text + "\n")
        if data["stages"]:
            plot(data["stages"], out / "scale.png")
        print(text)
        return
    sizes = sorted(parse_size(s) for s in args.sizes.split(",") if s.strip())
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    bad = [f for f in formats if f not in FILES]
    if bad:
        ap.error(f"--formats: unknown {bad}; choose from {sorted(FILES)}")
    print_cpu()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    sys.path.insert(0, str(ROOT))
    from pipeline.models.tiny import build_tiny_bert

    model = str(work / "tiny-bert")
    if not (Path(model) / "config.json").exists():
        build_tiny_bert(model)
    words = Words()
    rows: list[dict] = []
    t_all = time.time()
    for fmt in formats:
        for n in sizes:
            gen = generate_corpus(fmt, n, args.queries, work, words)
            if not args.no_spine:
                rows += spine(fmt, n, gen, work, model, args, env)
    train_rows = []
    if args.train_pairs:
        fmt = "msmarco" if "msmarco" in formats else formats[0]
        n = sizes[-1]
        corpus = work / "runs" / f"{fmt}-{human(n)}" / "corpus"
        if not (corpus / "manifest.json").exists():
            gen = generate_corpus(fmt, n, args.queries, work, words)
            run_stage("ingest", PIPELINE + ["ingest", str(gen / FILES[fmt]), "--format", fmt, "--out", str(corpus)],
                      work / "logs" / "ingest-train-corpus.log", [], env)
        for pairs in sorted(parse_size(s) for s in args.train_pairs.split(",")):
            tset = generate_training(fmt, n, pairs, 10, work, words)
            train_rows.append(train_at(pairs, corpus, tset, work, model, args, env))
    ance = None
    if args.ance:
        ance = ance_refresh(formats, sizes, work, model, args, env, words)
    fault_rows = faults(formats[0], sizes, work, model, args, env, words) if args.faults else []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text, fits = report(rows, train_rows, ance, args, faults=fault_rows)
    keep = lambda r: {k: v for k, v in r.items() if k != "lines"}  # noqa: E731
    (out / "scale.json").write_text(json.dumps({
        "cpu": cpu_line(), "command": "python bench/scale.py " + " ".join(sys.argv[1:]), "sizes": sizes,
        "queries": args.queries, "top_k": args.top_k, "stages": [keep(r) for r in rows],
        "fits": [{"format": f, "stage": s, **v} for (f, s), v in fits.items()],
        "training": [keep(r) for r in train_rows], "ance": keep(ance) if ance else None,
        "faults": fault_rows}, indent=2) + "\n")
    (out / "scale.md").write_text(text + "\n")
    if rows:
        plot(rows, out / "scale.png")
    print("\n" + text)
    print(f"\n[scale] done in {fmt_s(time.time() - t_all)}: {out / 'scale.md'}, scale.json, scale.png", flush=True)


def ance_refresh(formats, sizes, work, model, args, env, words) -> dict:
    """One refresh (`pipeline refresh --once`) over the largest corpus with `--ance-queries` training
    queries, from the checkpoint of a short DPR run; then the trainer's side of the switch: loading
    that version (`VersionedNegatives.load`, what the loop runs in a background thread)."""
    fmt = "msmarco" if "msmarco" in formats else formats[0]
    n = sizes[-1]
    corpus = work / "runs" / f"{fmt}-{human(n)}" / "corpus"
    base = work / "train-runs" / "ance-base"
    fresh(base)
    tset = generate_training(fmt, n, 10_000, 10, work, words)
    run_stage("ance base run", PIPELINE + [
        "train", f"model.name_or_path={model}", "model.query_max_length=16", "model.doc_max_length=96",
        "data.source=qrels", f"data.corpus={corpus}", f"data.queries={tset / 'queries.tsv'}",
        f"data.qrels={tset / 'qrels.tsv'}", "loss.name=dpr", "train.num_workers=1", "train.cpus_per_worker=1",
        "train.batch_size=16", "train.max_steps=20", "train.checkpoint_every=20", "train.epochs=1",
        f"train.storage_path={base.parent}", "train.name=ance-base", "validation.dev_split=0"],
        work / "logs" / "ance-base.log", [], env)
    qset = generate_training(fmt, n, args.ance_queries, 10, work, words)
    print(f"[scale] ANCE refresh over {n:,} passages, {args.ance_queries:,} training queries ...", flush=True)
    r = run_stage("ance refresh", PIPELINE + [
        "refresh", "--run-dir", str(base), "--once", "loss.name=ance", f"model.name_or_path={model}",
        "model.doc_max_length=96",
        "model.query_max_length=16", f"data.corpus={corpus}", f"ance.queries={qset / 'queries.tsv'}",
        f"ance.qrels={qset / 'qrels.tsv'}", "ance.top_k=100", "ance.negatives=10", "ance.batch_size=256"],
        work / "logs" / "ance-refresh.log", [base / "negatives"], env)
    versions = sorted((base / "negatives").glob("v*/meta.json"))
    meta = json.loads(versions[-1].read_text()) if versions else {}
    code = ("import json, time, resource; from pipeline.data.negatives import VersionedNegatives, list_versions; "
            f"v = VersionedNegatives({str(base / 'negatives')!r}, {str(corpus)!r}); n = list_versions(v.root)[-1]; "
            "t = time.time(); ver = v.load(n); s = time.time() - t; "
            f"q = [l.split(chr(9))[0] for l in open({str(qset / 'queries.tsv')!r})][:1000]; t = time.time(); "
            "got = sum(len(ver.get(x) or []) for x in q); g = time.time() - t; "
            "print(json.dumps({'load_seconds': round(s, 2), 'lookup_ms_per_query': round(1000 * g / len(q), 3), "
            "'queries_in_version': len(ver), 'negatives_looked_up': got}))")
    sw = run_stage("ance switch", [sys.executable, "-c", code], work / "logs" / "ance-switch.log", [], env)
    switch = json.loads(sw["lines"][-1][1])
    out = {"passages": n, "training_queries": args.ance_queries, "refresh_wall_s": r["seconds"],
           "refresh_seconds_meta": meta.get("seconds"), "encode_seconds_meta": meta.get("encode_seconds"),
           "seconds_per_1000_passages": meta.get("seconds_per_1000_passages"),
           "refresh_rss_mb": r["driver_rss_mb"], "switch_load_seconds": switch["load_seconds"],
           "switch_rss_mb": sw["driver_rss_mb"], "lookup_ms_per_query": switch["lookup_ms_per_query"],
           "queries_in_version": switch["queries_in_version"]}
    print(f"[scale] ANCE: refresh {r['seconds']:.0f}s (RSS {r['driver_rss_mb']:.0f} MB), version load "
          f"{switch['load_seconds']}s (RSS {sw['driver_rss_mb']:.0f} MB), lookup {switch['lookup_ms_per_query']} "
          "ms/query", flush=True)
    return out


# ---------------------------------------------------------------- faults at scale

def _can_mount(d: Path) -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {d}"],
                          capture_output=True).returncode == 0


def _index_state(idx: Path) -> dict:
    """What a reader finds at `idx`: its factory and vector count, or the error that it could not load."""
    from pipeline.index.faiss_index import LoadedIndex

    try:
        loaded = LoadedIndex(idx)
        return {"factory": loaded.meta.get("factory"), "ntotal": int(loaded.index.ntotal),
                "written": (idx / "index.json").stat().st_mtime_ns}
    except Exception as e:  # noqa: BLE001 - any failure to read is what this checks for
        return {"error": f"{type(e).__name__}: {e}"}


def faults(fmt: str, sizes: list[int], work: Path, model: str, args, env: dict, words) -> list[dict]:
    """The faults of issue #21 on the bench's own corpora, through the CLI:

    1. an ingest of the largest corpus SIGKILLed when half its parts are written, then run again:
       its manifest (all but created_at), fingerprint and part files equal an uninterrupted ingest's
       (both with at least 10 parts: 100k rows each at 1M and above);
    2. an index replacement (`--overwrite`, IVF-PQ over the Flat index) of the largest corpus killed at
       several moments: every time a reader finds a complete index (the old or the new), and the run
       after leaves no temporaries;
    3. an index written to a disk that fills (a tmpfs a quarter of the index's size): exit 2, the OS's
       reason, nothing left on the disk;
    4. an encode of the smallest corpus to a disk that fills half way (a tmpfs): exit 2, the finished
       shards kept; remounted bigger, the re-run encodes only the rest and the set is complete."""
    from pipeline.io_utils import sha256_file

    big, small = sizes[-1], sizes[0]
    w = work / "runs" / f"faults-{fmt}"
    logs = w / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    found: list[dict] = []

    def note(fault: str, n: int, done: str, what: str, ok: bool | None, **extra) -> None:
        found.append({"fault": fault, "n": n, "done": done, "found": what, "ok": ok, **extra})
        print(f"[scale] fault: {fault} at {human(n)}: {what} -> {'as it must be' if ok else 'NOT' if ok is not None else 'skipped'}",
              flush=True)

    # 1. ingest killed half way: against an uninterrupted ingest with the same parts (at least 10 of them,
    #    so that "half way" is a moment between parts whatever N)
    gen = generate_corpus(fmt, big, args.queries, work, words)
    part_rows = min(100_000, max(1_000, big // 10))
    parts = math.ceil(big / part_rows)
    half = parts // 2

    def ingest_argv(out: Path) -> list[str]:
        return PIPELINE + ["ingest", str(gen / FILES[fmt]), "--format", fmt, "--out", str(out),
                           "--part-rows", str(part_rows), "--queries", str(gen / "queries.tsv"),
                           "--qrels", f"test={gen / 'qrels.tsv'}"]
    ref, corpus = w / "corpus-uninterrupted", w / "corpus"
    fresh(ref, corpus)
    run_stage("ingest (uninterrupted)", ingest_argv(ref), logs / "ingest-reference.log", [ref], env)
    t0 = time.time()
    proc = subprocess.Popen(ingest_argv(corpus), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=ROOT, env=env)
    while proc.poll() is None and not list(corpus.glob(f".tmp-ingest-*/new/corpus/part-{half:05d}.parquet")):
        time.sleep(0.01)
    finished = proc.poll() is not None
    proc.kill()
    proc.wait()
    killed_at = time.time() - t0
    if finished:
        note("ingest SIGKILLed half way, run again", big, f"{parts} parts of {part_rows:,} rows",
             f"the ingest finished in {killed_at:.1f} s, before it could be killed", None)
    else:
        left = sorted(os.listdir(corpus))
        r = run_stage("ingest after a kill", ingest_argv(corpus), logs / "ingest-rerun.log", [corpus], env)
        a, b = (json.loads((d / "manifest.json").read_text()) for d in (corpus, ref))
        drop = lambda m: {k: v for k, v in m.items() if k != "created_at"}  # noqa: E731
        same_parts = [p["file"] for p in a["parts"]] == [p["file"] for p in b["parts"]] and all(
            sha256_file(corpus / p["file"]) == sha256_file(ref / p["file"]) for p in a["parts"])
        ok = drop(a) == drop(b) and a["fingerprint"] == b["fingerprint"] and same_parts and "manifest.json" not in left
        note("ingest SIGKILLed half way, run again", big,
             f"killed at {killed_at:.1f} s with {half} of {parts} parts written; re-run {r['seconds']:.1f} s",
             f"after the kill the folder held {', '.join(left) or 'nothing'} (no manifest: not a corpus); the "
             f"re-run's manifest {'equals' if drop(a) == drop(b) else 'differs from'} the uninterrupted one's, "
             f"fingerprint {'equal' if a['fingerprint'] == b['fingerprint'] else 'differs'}, parts "
             f"{'byte-identical' if same_parts else 'differ'}", ok, killed_at_s=round(killed_at, 2),
             rerun_s=r["seconds"])

    # 2. index replacement killed at several moments
    emb = work / "runs" / f"{fmt}-{human(big)}" / "emb"
    if not (emb / "embeddings.json").exists():
        note("index replacement SIGKILLed", big, "—", f"no embeddings at {emb}: run the spine first", None)
    else:
        idx = w / "index"
        fresh(idx)
        run_stage("index Flat (to be replaced)", PIPELINE + ["index", "--embeddings", str(emb), "--out", str(idx)],
                  logs / "index-old.log", [idx], env)
        dim = json.loads((emb / "embeddings.json").read_text())["dim"]
        factory = ivfpq_factory(big, dim)
        argv = PIPELINE + ["index", "--embeddings", str(emb), "--out", str(idx), "--overwrite", "--factory", factory,
                           f"index.train_sample={args.train_sample}"]
        # a whole replacement first: when does its output start being written (its .tmp- folder appears)?
        t0, t_tmp = time.time(), None
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env=env)
        while proc.poll() is None:
            if t_tmp is None and any(n.startswith(".tmp-") for n in os.listdir(w)):
                t_tmp = time.time() - t0
            time.sleep(0.01)
        whole = time.time() - t0
        if proc.returncode != 0:
            raise SystemExit(f"[scale] faults: `{' '.join(argv)}` failed (exit {proc.returncode})")
        t_tmp = t_tmp or 0.8 * whole
        states = []
        # kills from the output's first write to just after a whole run's time (the swap is its last moment)
        for delay in (0.9 * t_tmp, (t_tmp + whole) / 2, 0.95 * whole, whole, 1.05 * whole, 1.15 * whole):
            before = _index_state(idx)
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env=env)
            t0 = time.time()
            while proc.poll() is None and time.time() - t0 < delay:
                time.sleep(0.01)
            proc.kill()
            proc.wait()
            st = _index_state(idx)
            st.update(at_s=round(time.time() - t0, 2), replaced=st.get("written") != before.get("written"))
            states.append(st)
        r = run_stage("index after the kills", argv, logs / "index-final.log", [idx], env)
        temporaries = sorted(n for n in os.listdir(w) if n.startswith((".tmp-", ".old-")))
        final = _index_state(idx)
        ok = all(s.get("ntotal") == big and s.get("factory") == factory for s in states) and \
            final.get("ntotal") == big and not temporaries
        note("index replacement SIGKILLed", big,
             f"`index --overwrite --factory {factory}` over the index, killed after "
             f"{', '.join(format(s['at_s'], '.1f') for s in states)} s (a whole run: {whole:.1f} s, writing from "
             f"{t_tmp:.1f} s)",
             f"each time a reader found a complete index of {big:,} vectors: "
             + ", ".join("the new one" if s.get("replaced") else "the old one" if "ntotal" in s else s["error"]
                         for s in states)
             + f"; the next run left {', '.join(temporaries) or 'no temporaries'}", ok, states=states,
             whole_s=round(whole, 2), write_phase_from_s=round(t_tmp, 2))

    # 3 and 4: disks that fill
    mnt = w / "small-disk"
    mnt.mkdir(exist_ok=True)
    if not _can_mount(mnt):
        note("disk fills during index / encode", big, "—", "cannot mount a tmpfs here (needs root and unshare)",
             None)
        return found
    flat = work / "runs" / f"{fmt}-{human(big)}" / "flat"
    if (emb / "embeddings.json").exists() and (flat / "index.faiss").exists():
        size_kb = max(64, du(flat) // 4 // 1024)
        cmd = (f"mount -t tmpfs -o size={size_kb}k tmpfs {mnt} && "
               f"{' '.join(PIPELINE)} index --embeddings {emb} --out {mnt / 'idx'} > {logs / 'index-full.log'} 2>&1; "
               f"echo EXIT=$?; ls -A {mnt}")
        t0 = time.time()
        p = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, cwd=ROOT, env=env)
        lines = p.stdout.split()
        msg = next((ln for ln in reversed((logs / "index-full.log").read_text().splitlines())
                    if ln.startswith("error:")), "")
        left = [n for n in lines if not n.startswith("EXIT=")]
        ok = "EXIT=2" in lines and "No space left on device" in msg and not left and "Traceback" not in \
            (logs / "index-full.log").read_text()
        note("index on a disk that fills", big, f"Flat index ({du(flat) / 1e6:,.0f} MB) to a {size_kb / 1024:,.0f} MB "
             "tmpfs", f"{next((x for x in lines if x.startswith('EXIT=')), 'no exit')}, `{msg}`; on the disk after: "
             f"{', '.join(left) or 'nothing'}", ok, seconds=round(time.time() - t0, 2))
    corpus_small = work / "runs" / f"{fmt}-{human(small)}" / "corpus"
    emb_small = work / "runs" / f"{fmt}-{human(small)}" / "emb"
    if (corpus_small / "manifest.json").exists() and (emb_small / "embeddings.json").exists():
        size_kb = max(64, du(emb_small) // 2 // 1024)
        enc = f"{' '.join(PIPELINE)} encode --corpus {corpus_small} --out {mnt / 'emb'} --model {model} " \
              "model.doc_max_length=128"
        cmd = (f"mount -t tmpfs -o size={size_kb}k tmpfs {mnt} && {enc} > {logs / 'encode-full.log'} 2>&1; "
               f"echo EXIT=$?; ls {mnt / 'emb'} | grep -c '\\.done$'; mount -o remount,size={4 * size_kb}k {mnt} && "
               f"{enc} > {logs / 'encode-resume.log'} 2>&1; echo EXIT=$?; "
               f"{sys.executable} -c \"import json; print(json.load(open('{mnt / 'emb' / 'embeddings.json'}'))['complete'])\"")
        t0 = time.time()
        p = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, cwd=ROOT, env=env)
        out = p.stdout.split()
        full_log = (logs / "encode-full.log").read_text()
        resume = (logs / "encode-resume.log").read_text().splitlines()
        msg = next((ln for ln in reversed(full_log.splitlines()) if ln.startswith("error:")), "")
        summary = next((ln for ln in reversed(resume) if ln.startswith("[encode] done")), "")
        kept = int(out[1]) if len(out) > 1 and out[1].isdigit() else 0
        m = re.search(r"(\d[\d,]*) shards already complete", summary)
        reused = int(m.group(1).replace(",", "")) if m else -1
        ok = out[:1] == ["EXIT=2"] and "No space left on device" in msg and "Traceback" not in full_log and \
            kept > 0 and reused == kept and "EXIT=0" in out and out[-1] == "True"
        note("encode on a disk that fills, re-run on a bigger one", small,
             f"encode ({du(emb_small) / 1e6:,.1f} MB of shards) to a {size_kb / 1024:,.1f} MB tmpfs, then remounted "
             f"at 4x", f"{out[0] if out else 'no exit'}, `{msg}`; {kept} finished shards kept; the re-run "
             f"({out[2] if len(out) > 2 else 'no exit'}) reused {reused} shards and encoded the rest"
             f"{', complete' if out[-1:] == ['True'] else ', NOT complete'}", ok, seconds=round(time.time() - t0, 2))
    return found


if __name__ == "__main__":
    main()
