"""`pipeline demo` / `make demo`: the whole flow on the bundled Python FAQ corpus.

1. ingest (BEIR layout) -> encode with Ray Data (MiniLM from the installed package)
   -> exact inner-product FAISS index -> retrieve -> evaluate: zero-shot numbers;
2. fine-tune MiniLM with Ray Train on the training split, as DPR and as DAR
   (jobs/configs/dpr.yaml, dar.yaml), and evaluate each through the same spine
   on the held-out test split;
3. one comparison table (printed, and saved with the training curves plot as
   `report.md`, `training_curves.png`, `results.json` in the output folder).

Steps whose output is complete are reused (pass --fresh to recompute).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from importlib import resources
from pathlib import Path

from .config import PipelineConfig
from .errors import PipelineError
from .io_utils import write_json_atomic, write_text_atomic

REPO = Path(__file__).resolve().parent.parent
METHODS = ("dpr", "dar")


def demo_data_dir() -> Path:
    return Path(str(resources.files("pipeline") / "resources" / "python_faq"))


def _spine(corpus: Path, work: Path, cfg: PipelineConfig, split_files: dict[str, Path]) -> dict:
    """encode -> index -> retrieve -> evaluate for one model; returns {split: result}."""
    from .eval.metrics import evaluate_files
    from .index.encode import encode_corpus
    from .index.faiss_index import META_FILE, build_index
    from .index.retrieve import retrieve

    encode_corpus(corpus, work / "embeddings", cfg)
    if not (work / "index" / META_FILE).exists():
        build_index(work / "embeddings", work / "index", cfg.index)
    run = work / "run.trec"
    meta = retrieve(work / "index", corpus / "queries.tsv", run, cfg)
    out = {}
    for split, qrels in split_files.items():
        res = evaluate_files(run, qrels, cfg.eval)
        res["corpus"] = {"fingerprint": meta["corpus_fingerprint"], "variant": meta["variant"],
                         "title_join": meta["title_join"]}
        out[split] = res
    return out


def _train(method: str, corpus: Path, out: Path) -> dict:
    """Train (or, when its run is complete, reuse: train.resume=auto) one demo model."""
    from .train.config import load_train_config
    from .train.trainer import train

    cfg_path = REPO / "jobs" / "configs" / f"{method}.yaml"
    if not cfg_path.exists():
        raise PipelineError(f"{cfg_path} not found: run the demo from a checkout of the repository")
    job = load_train_config(cfg_path, [f"data.corpus={corpus}", f"train.storage_path={out / 'train'}",
                                       "validation.corpus=null"])
    return train(job)


def _plot(histories: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, hist in histories.items():
        pts = [(h["step"], h["loss"]) for h in hist if "loss" in h]
        steps, loss = [p[0] for p in pts], [p[1] for p in pts]
        line, = ax.plot(steps, loss, marker="o", ms=3, alpha=0.35, label=f"{label} loss (per report)")
        k = max(1, len(loss) // 6)  # moving average: per-step losses of small batches are noisy
        smooth = [sum(loss[max(0, i - k + 1):i + 1]) / len(loss[max(0, i - k + 1):i + 1]) for i in range(len(loss))]
        ax.plot(steps, smooth, color=line.get_color(), lw=2, label=f"{label} loss ({k}-report mean)")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("Fine-tuning MiniLM on the Python FAQ (train split)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_demo(out: Path, cfg: PipelineConfig, fresh: bool = False, train: bool = True) -> dict:
    from .data.ingest import ingest
    from .data.manifest import MANIFEST_NAME
    from .eval.report import comparison_table, format_table

    t0 = time.time()
    if fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    data = demo_data_dir()
    corpus = out / "corpus"
    print(f"[demo] Python FAQ corpus ({data}) -> {out}", flush=True)
    if not (corpus / MANIFEST_NAME).exists():
        ingest([data], "beir", corpus, overwrite=True)
    splits = {s: corpus / "qrels" / f"{s}.trec" for s in ("all", "test")}
    results: dict[str, dict] = {"zero-shot": _spine(corpus, out / "zero_shot", cfg, splits)}
    zs = results["zero-shot"]
    print("\n" + format_table({f"MiniLM zero-shot ({s}, {zs[s]['queries']['evaluated']} q)": zs[s]["metrics"]
                                for s in splits}) + "\n", flush=True)

    summaries: dict[str, dict] = {}
    if train:
        for method in METHODS:
            summaries[method] = _train(method, corpus, out)
            mcfg = replace(cfg, model=replace(cfg.model, name_or_path=summaries[method]["model"]))
            results[method] = _spine(corpus, out / method, mcfg, {"test": splits["test"]})

    labels = {"zero-shot": "MiniLM zero-shot", "dpr": "MiniLM + DPR fine-tune", "dar": "MiniLM + DAR fine-tune"}
    test_rows = {labels[k]: {"metrics": v["test"]["metrics"], "corpus": v["test"]["corpus"]} for k, v in results.items()}
    n_test = zs["test"]["queries"]["evaluated"]
    table = comparison_table(test_rows)
    md = ["# Demo: dense retrieval on the Python FAQ", "",
          f"Held-out test split ({n_test} queries) of the bundled Python FAQ corpus "
          f"({zs['test']['corpus']['variant']}, fingerprint {zs['test']['corpus']['fingerprint']}); "
          f"index {cfg.index.factory} ({cfg.index.metric}).", "", comparison_table(test_rows, markdown=True), ""]
    if summaries:
        md += ["## Training", "", "| method | steps | global batch | examples | wall s | final loss |", "|---|---|---|---|---|---|"]
        for m, s in summaries.items():
            md.append(f"| {m} | {s['steps']} | {s['global_batch']} | {s['examples']} | {s['wall_seconds']} | "
                      f"{s['final_metrics'].get('loss', float('nan')):.4f} |")
        _plot({m.upper(): s["history"] for m, s in summaries.items()}, out / "training_curves.png")
        md += ["", "![training curves](training_curves.png)", ""]
    md += ["Zero-shot on all queries:", "", format_table({"MiniLM zero-shot (all)": zs["all"]["metrics"]}, markdown=True), ""]
    write_text_atomic(out / "report.md", "\n".join(md))
    write_json_atomic(out / "results.json", {"results": results, "training": {
        m: {k: v for k, v in s.items() if k != "history"} for m, s in summaries.items()}})
    print(f"\nHeld-out test split ({n_test} queries):\n" + table + "\n")
    print(f"[demo] done in {time.time() - t0:.0f}s; report: {out / 'report.md'}", flush=True)
    return results
