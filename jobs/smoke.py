"""Shared plumbing of the `jobs/*.py` Ray job entrypoints.

Every entrypoint is `pipeline <verb>` and nothing more: without `--smoke-test` its arguments
go to the CLI unchanged (`--config FILE` and `section.key=value` overrides, plus the verb's own
options), so a job runs exactly what `pipeline <verb>` runs on a laptop.

With `--smoke-test` it runs the same verb through the same CLI on tiny inputs: a random
2-layer BERT (`pipeline.models.tiny.build_tiny_bert`) and the bundled Python FAQ corpus
(`pipeline/resources/python_faq`, 176 passages), a few steps, about a minute on CPU. Smoke
outputs go to `--out DIR` (default `runs/smoke`, relative to the job's working directory, which
for `ray job submit --working-dir .` is a temporary copy on the head: give an absolute path on a
shared filesystem to keep them). A smoke step reuses what an earlier smoke step left in the same
folder (tiny model, ingested corpus, embeddings, index, run) and makes it when it is missing, so
`encode_corpus -> build_index -> retrieve -> evaluate` chained on one `--out` does each step once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the job's copy of the package (working_dir) before any installed one
    sys.path.insert(0, str(REPO))

from pipeline.cli import main as cli_main  # noqa: E402

# The tiny BERT has no pooling config: mean pooling + L2 normalisation (cosine), short inputs.
TINY_MODEL = ["model.pooling=mean", "model.normalize=true", "model.query_max_length=32", "model.doc_max_length=64"]


def run(verb: str, argv: list[str] | None = None, smoke=None) -> int:
    """The entrypoint body: `pipeline <verb> ARGV`, or `smoke(out, config, overrides)` with --smoke-test."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--smoke-test" not in argv:
        return cli_main([verb, *argv])
    p = argparse.ArgumentParser(prog=f"jobs/{verb}", description=f"smoke test of `pipeline {verb}` "
                                "(tiny random BERT, bundled FAQ corpus, a few steps)")
    p.add_argument("--smoke-test", action="store_true", required=True)
    p.add_argument("--out", default="runs/smoke", help="smoke output folder (default runs/smoke)")
    p.add_argument("--config", help="config file (default: the job's own smoke settings)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="overrides applied after the smoke settings")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    code = smoke(out, args.config, list(args.overrides))
    if code == 0:
        print(f"[smoke] {verb}: outputs in {out}", flush=True)
    return code


# --------------------------------------------------------------------------- shared inputs

def tiny_model(out: Path) -> Path:
    from pipeline.models.tiny import build_tiny_bert
    from pipeline.runtime_env import setup_offline_env

    setup_offline_env()  # (quiet transformers: no "Writing model shards" bar before the CLI's own lines)

    path = out / "tiny_model"
    if not (path / "config.json").exists():
        build_tiny_bert(path)
    return path


def faq_corpus(out: Path) -> Path:
    from pipeline.data.ingest import ingest
    from pipeline.data.bundled import python_faq_dir

    corpus = out / "corpus"
    if not (corpus / "manifest.json").exists():
        ingest([python_faq_dir()], "beir", corpus, overwrite=True, progress=False)
    return corpus


def _model_args(out: Path) -> list[str]:
    return [f"model.name_or_path={tiny_model(out)}", *TINY_MODEL]


def _cfg_args(config: str | None) -> list[str]:
    return ["--config", config] if config else []


def _encoded(emb: Path) -> bool:
    import json

    meta = emb / "embeddings.json"
    return meta.exists() and bool(json.loads(meta.read_text()).get("complete"))


# --------------------------------------------------------------------------- one smoke per verb

def smoke_encode(out: Path, config: str | None, overrides: list[str]) -> int:
    corpus, model = faq_corpus(out), _model_args(out)
    return cli_main(["encode", "--corpus", str(corpus), "--out", str(out / "emb"), *_cfg_args(config), *model,
                     "encode.batch_size=32", "encode.show_progress=false", *overrides])


def smoke_index(out: Path, config: str | None, overrides: list[str]) -> int:
    if not _encoded(out / "emb"):
        code = smoke_encode(out, None, [])
        if code:
            return code
    return cli_main(["index", "--embeddings", str(out / "emb"), "--out", str(out / "index"), "--overwrite",
                     *_cfg_args(config), *overrides])


def smoke_retrieve(out: Path, config: str | None, overrides: list[str]) -> int:
    if not (out / "index" / "index.faiss").exists():
        code = smoke_index(out, None, [])
        if code:
            return code
    corpus = faq_corpus(out)
    return cli_main(["retrieve", "--index", str(out / "index"), "--queries", str(corpus / "queries.tsv"),
                     "--out", str(out / "run.trec"), "--top-k", "100", "--overwrite", *_cfg_args(config), *overrides])


def smoke_evaluate(out: Path, config: str | None, overrides: list[str]) -> int:
    if not (out / "run.trec").exists():
        code = smoke_retrieve(out, None, [])
        if code:
            return code
    corpus = faq_corpus(out)
    return cli_main(["evaluate", "--run", str(out / "run.trec"), "--qrels", str(corpus / "qrels" / "test.trec"),
                     "--json", str(out / "metrics.json"), "--overwrite", *_cfg_args(config), *overrides])


def _train_data(out: Path) -> list[str]:
    """The FAQ corpus; validation on the configs' dev split (validation.dev_split), never the test split."""
    corpus = faq_corpus(out)
    return [f"data.corpus={corpus}", f"train.storage_path={out / 'train'}"]


def _fresh(run_dir: Path, marker: str) -> None:
    """A smoke test starts from scratch: remove what an earlier smoke run left (only if it is one)."""
    import shutil

    if (run_dir / marker).exists():
        shutil.rmtree(run_dir)


def smoke_train(out: Path, config: str | None, overrides: list[str]) -> int:
    """DAR (jobs/configs/dar.yaml) for 6 steps on 2 workers x 0.5 CPU, validated at the end."""
    _fresh(out / "train" / "smoke", "summary.json")
    return cli_main(["train", "--config", config or str(REPO / "jobs" / "configs" / "dar.yaml"), *_model_args(out),
                     *_train_data(out), "train.name=smoke", "train.max_steps=6", "train.num_workers=2",
                     "train.cpus_per_worker=0.5", "train.batch_size=8", "train.checkpoint_every=3",
                     "train.report_every=3", "loss.n_perturb=2", "optim.lr=1e-4", *overrides])


def smoke_ance(out: Path, config: str | None, overrides: list[str]) -> int:
    """ANCE (jobs/configs/ance.yaml, loss.name=ance): trainer and index refresher side by side, 12 steps."""
    corpus = faq_corpus(out)
    _fresh(out / "train" / "ance_smoke", "summary.json")
    return cli_main(["train", "--config", config or str(REPO / "jobs" / "configs" / "ance.yaml"), *_model_args(out),
                     *_train_data(out), "train.name=ance_smoke", "train.max_steps=12", "train.num_workers=1",
                     "train.cpus_per_worker=0.5", "train.batch_size=8", "train.report_every=4",
                     "train.negatives_poll_every=2", "optim.lr=1e-4", "ance.refresh_every=4", "ance.top_k=30",
                     "ance.negatives=5", "ance.cpus=0.5", "ance.poll_seconds=0.2", "ance.precision=fp32",
                     f"ance.dev_queries={corpus / 'queries.tsv'}", f"ance.dev_qrels={corpus / 'qrels' / 'test.trec'}",
                     "ance.keep_versions=2", *overrides])


def smoke_tune(out: Path, config: str | None, overrides: list[str]) -> int:
    """Two DAR trials (grid over loss.n_perturb), 4 steps each, ASHA on the validation metric."""
    import yaml

    _fresh(out / "tune", "sweep.json")
    if config is None:
        corpus = faq_corpus(out)
        doc = {
            "base": str(REPO / "jobs" / "configs" / "dar.yaml"),
            "overrides": [*_model_args(out), *_train_data(out)[:1], "train.max_steps=4", "train.eval_every=2",
                          "train.checkpoint_every=2", "train.report_every=2", "train.num_workers=1",
                          "train.cpus_per_worker=0.4", "train.batch_size=8", "optim.lr=1e-4"],
            "space": {"loss.n_perturb": {"grid": [2, 3]}},
            "search": {"searcher": "grid", "metric": "val_metric", "mode": "max", "scheduler": "asha",
                       "grace_period": 2, "reduction_factor": 2, "max_concurrent_trials": 2},
            "output": str(out / "tune"),
        }
        assert corpus.exists()
        config = str(out / "tune_smoke.yaml")
        Path(config).write_text(yaml.safe_dump(doc, sort_keys=False))
    return cli_main(["tune", "--config", config, *overrides])
