"""`pipeline demo` / `make demo`: the whole flow on the bundled Python FAQ corpus.

    stage                                               writes (under --out, default runs/demo)
    1 ingest (BEIR layout)                              corpus/ (parts, manifest, queries.tsv, qrels/)
    2 zero-shot: encode (Ray Data, MiniLM from the      zero_shot/{embeddings, index, run.trec}
      installed package) -> exact FAISS index ->
      retrieve -> evaluate
    3 fine-tune MiniLM with Ray Train as DPR and as     train/{dpr,dar}/ (checkpoints, model/, summary.json),
      DAR (jobs/configs/dpr.yaml, dar.yaml), each       <method>/{embeddings, index, run.trec}
      evaluated through the same spine on the test
      split
    4 one comparison table                              report.md, training_curves.png, results.json
                                                        (--no-train: report-zero-shot.md, results-zero-shot.json;
                                                        a full run's report is never replaced by a zero-shot one)

Config keys: the pipeline config (`model.*`, `encode.*`, `index.*`, `retrieve.*`, `eval.*`,
`ray.*`) given to `pipeline demo`; the training steps read jobs/configs/dpr.yaml and dar.yaml with the
demo's own run folders (`train.storage_path=<out>/train`, `train.name=dpr|dar`), so a user's `pipeline train
--config jobs/configs/dpr.yaml` (runs/train/dpr) and the demo never share a run.
Steps whose output is complete are reused (pass --fresh to recompute; with --no-train, --fresh recomputes
the zero-shot steps and leaves a full run's training and report in place). The folder is the demo's own
(`claim_demo_folder`: marked, locked while a demo runs; a folder holding anything else is refused, never
touched, and --fresh removes only what the demo writes).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from ..config import PipelineConfig
from ..data.bundled import python_faq_dir
from ..errors import PipelineError
from ..io_utils import write_json_atomic, write_text_atomic

REPO = Path(__file__).resolve().parents[2]  # the checkout: pipeline/recipes/demo.py -> the repository
METHODS = ("dpr", "dar")
DEMO_MARKER = ".pipeline-demo"
FAQ_VARIANT = "beir-python_faq"  # the variant ingest gives the bundled corpus (its folder's name)


def own_entries() -> set[str]:
    """What the demo writes in its folder; `--fresh` removes these and nothing else."""
    reports = [p.name for train in (True, False) for p in report_files(Path("."), train)]
    return {"corpus", "zero_shot", "train", *METHODS, *reports, "training_curves.png"}


def claim_demo_folder(out: Path):
    """The demo's folder, locked for this run: new, one the demo made (its marker), or one made before the
    marker existed that holds only the demo's entries with the bundled FAQ as its corpus (adopted). Anything
    else is refused before any work, never touched: a folder of the user's would otherwise have its corpus
    read as the FAQ's, or, with --fresh, been removed."""
    import json

    from ..data.manifest import MANIFEST_NAME
    from ..io_utils import claim_work_folder

    own = own_entries()
    if out.is_dir() and not (out / DEMO_MARKER).exists():
        names = {e.name for e in out.iterdir()} - {".lock"}
        manifest = out / "corpus" / MANIFEST_NAME
        try:
            faq = not (out / "corpus").exists() or json.loads(manifest.read_text()).get("variant") == FAQ_VARIANT
        except (OSError, ValueError, AttributeError):
            faq = False
        if names and names <= own and faq:
            (out / DEMO_MARKER).write_text("made by pipeline demo\n")
    return claim_work_folder(out, own, "`pipeline demo`", marker=DEMO_MARKER, flag="--out")


def _spine(corpus: Path, work: Path, cfg: PipelineConfig, split_files: dict[str, Path]) -> dict:
    """encode -> index -> retrieve -> evaluate for one model; returns {split: result}."""
    from ..eval.metrics import evaluate_files
    from ..index.encode import encode_corpus
    from ..index.faiss_index import META_FILE, build_index
    from ..index.retrieve import retrieve

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
    """Train (or, when its run is complete, reuse: train.resume=auto) one demo model.

    Validation on the dev split (held-out training queries) every 6 steps gives the curves of
    the report; nothing is selected on it (the last step's model is evaluated on the test split)."""
    from ..index.validate import validator_for_job
    from ..train.config import load_train_config
    from ..train.dev_split import apply_dev_split
    from ..train.trainer import train

    cfg_path = _config_path(method)
    # the curves validate on a seeded 10 % of the training queries held out (validation.dev_split),
    # never on the test split the table reports; the runs are the demo's own (<out>/train/<method>),
    # whatever run folder the shipped config names for a user's runs
    job = apply_dev_split(load_train_config(cfg_path, [
        f"data.corpus={corpus}", f"train.storage_path={out / 'train'}", f"train.name={method}",
        "validation.corpus=null", "validation.qrels=null", "validation.dev_split=0.1", "train.eval_every=6",
        "train.report_every=6"]))
    return train(job, validate_fn=validator_for_job(job))


def _plot(histories: dict[str, list[dict]], path: Path, metric: str) -> None:
    """Two panels: the NLL term per report (comparable across DPR and DAR: DAR's total loss adds its
    mix term), and the validation metric over steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, axv) = plt.subplots(1, 2, figsize=(11, 4))
    for label, hist in histories.items():
        pts = [(h["step"], h["nll"]) for h in hist if "nll" in h]
        line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=f"{label} NLL")
        val = [(h["step"], h[f"val_{metric}"]) for h in hist if f"val_{metric}" in h]
        axv.plot([p[0] for p in val], [p[1] for p in val], marker="s", color=line.get_color(), label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("NLL (in-batch, mean over the report window)")
    ax.set_title("Training NLL, train split")
    axv.set_xlabel("step")
    axv.set_ylabel(metric)
    axv.set_title(f"Validation {metric}, dev split (held-out training queries)")
    for a in (ax, axv):
        a.grid(alpha=0.3)
        a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _training_md(summaries: dict[str, dict]) -> list[str]:
    md = ["## Training", "",
          "| method | steps | global batch (workers x batch) | examples | similarity / τ | lr (warmup) | seed | "
          "final NLL | final loss | wall s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for m, s in summaries.items():
        lc, opt = s.get("loss_config", {}), s.get("optim", {})
        nll = [h["nll"] for h in s["history"] if "nll" in h]
        md.append(f"| {m} | {s['steps']} | {s['global_batch']} ({s['world_size']} x {s['batch_per_worker']}) | "
                  f"{s['examples']} | {lc.get('similarity')} / {lc.get('temperature')} | "
                  f"{opt.get('lr')} ({opt.get('warmup_ratio')}) | {s.get('seed')} | "
                  f"{nll[-1] if nll else float('nan'):.4f} | {s['final_metrics'].get('loss', float('nan')):.4f} | "
                  f"{s['wall_seconds']} |")
    extra = {m: {k: v for k, v in s.get("loss_config", {}).items() if k not in ("name", "similarity", "temperature")}
             for m, s in summaries.items()}
    md += ["", "Method settings: " + "; ".join(f"{m}: {v or 'none'}" for m, v in extra.items()), ""]
    versions = next(iter(summaries.values())).get("versions", {})
    md += ["Library versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()), ""]
    return md


def run_demo(out: Path, cfg: PipelineConfig, fresh: bool = False, train: bool = True) -> dict:
    t0 = time.time()
    if train:  # before any work: the training half reads the checkout's configs
        for method in METHODS:
            if not _config_path(method).exists():
                raise PipelineError(f"{_config_path(method)} not found: the demo's training half reads the "
                                    "repository's jobs/configs; run it from a checkout, or `pipeline demo "
                                    "--no-train` for the zero-shot half (nothing was run)")
    lock = claim_demo_folder(out)
    try:
        return _run_demo(out, cfg, fresh, train, t0)
    finally:
        lock.close()


def _config_path(method: str) -> Path:
    return REPO / "jobs" / "configs" / f"{method}.yaml"


def _run_demo(out: Path, cfg: PipelineConfig, fresh: bool, train: bool, t0: float) -> dict:
    from ..data.ingest import ingest
    from ..data.manifest import MANIFEST_NAME
    from ..eval.report import format_table
    from ..io_utils import remove_path
    from ..ray_runtime import init_ray

    if train:  # one local Ray for every step; Ray Train needs its dashboard (bound to 127.0.0.1)
        init_ray(replace(cfg.ray, dashboard=True))
    if fresh:  # only what the demo writes; a zero-shot run recomputes its own steps (a full run's training
        # and report stay)
        zero_shot = {"corpus", "zero_shot", *(p.name for p in report_files(out, False))}
        for name in sorted(own_entries() if train else zero_shot):
            remove_path(out / name)
    data = python_faq_dir()
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

    from ..eval.compare import compare_runs, format_comparison

    labels = {"zero-shot": "MiniLM zero-shot", "dpr": "MiniLM + DPR fine-tune", "dar": "MiniLM + DAR fine-tune"}
    dirs = {"zero-shot": out / "zero_shot", **{m: out / m for m in summaries}}
    n_test = zs["test"]["queries"]["evaluated"]
    cmp = compare_runs({labels[k]: dirs[k] / "run.trec" for k in results}, splits["test"],
                       measures="RR@10 nDCG@10 R@10 R@100", test="randomization", cfg=cfg.eval)
    table = format_comparison(cmp)
    md = ["# Demo: dense retrieval on the Python FAQ", "",
          f"Held-out test split ({n_test} queries) of the bundled Python FAQ corpus "
          f"({zs['test']['corpus']['variant']}, fingerprint {zs['test']['corpus']['fingerprint']}); "
          f"index {cfg.index.factory} ({cfg.index.metric}). Paired tests against the first row.", "",
          format_comparison(cmp, markdown=True), ""]
    if summaries:
        md += _training_md(summaries)
        _plot({m.upper(): s["history"] for m, s in summaries.items()}, out / "training_curves.png", "RR@10")
        md += ["![training NLL and validation curves](training_curves.png)", ""]
    md += ["Zero-shot on all queries:", "", format_table({"MiniLM zero-shot (all)": zs["all"]["metrics"]}, markdown=True), ""]
    report, record = report_files(out, train)
    write_text_atomic(report, "\n".join(md))
    write_json_atomic(record, {"results": results, "comparison": cmp, "training": {
        m: {k: v for k, v in s.items() if k != "history"} for m, s in summaries.items()}})
    print(f"\nHeld-out test split ({n_test} queries):\n" + table + "\n")
    kept = "" if train or not (out / "report.md").exists() else \
        f" (the full demo's {out / 'report.md'} is kept; this zero-shot run writes its own report)"
    print(f"[demo] done in {time.time() - t0:.0f}s; report: {report}{kept}", flush=True)
    return results


def report_files(out: Path, train: bool) -> tuple[Path, Path]:
    """(report, results JSON) of a run: the full demo's `report.md` and `results.json` (beside its
    training_curves.png), a `--no-train` run's own `report-zero-shot.md` and `results-zero-shot.json`, so
    a zero-shot run never replaces the report of a full one."""
    if train:
        return out / "report.md", out / "results.json"
    return out / "report-zero-shot.md", out / "results-zero-shot.json"
