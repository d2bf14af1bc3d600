"""RCL's stages from one command: `pipeline train --config jobs/configs/rcl.yaml` (docs/METHODS.md §3).

    <train.storage_path>/<train.name>/
        examples/                 the training pairs (stage 2 encodes their texts)
        initial/                  stage 0 (entropy_init: initial): eq. 1 run, best/ = best dev MAP
        entropy-<λ>/              stage 1: one eq. 2 run per λ, best/ = lowest dev loss (early stop)
        regulators/sentences/{query,doc}/   stage 2: the training sentences as corpora (id = text_key)
        regulators/<digest>/      stage 2: one table per frozen entropy model: query/ and doc/ are
                                  the spine's embedding sets (Ray Data encoder actors), meta.json last
        final/                    stage 3: eq. 3 from the base with the 2K regulators
        stages/<stage>.json       a complete stage's record (reused on re-run)
        rcl.json                  the summary: stages, models, anisotropy

Stage 2 (the regulator tables) is recipes/rcl_regulators.py; the per-step math is
train/methods/rcl.py and losses/rcl.py. Config keys: the `rcl:` section (train/methods/rcl.py's
RCLSettings: entropy_lambdas, entropy_init, patience, eval_every, dev_batches, dev_split,
initial_metric, final_select, pairs, sts_dev, encode.*), `loss.*` (losses/rcl.py), and the
usual `train.*`, `optim.*`, `data.*`, `validation.*` of each stage's run.

The initial and final models train alone: with train.runner=auto and one worker, in this process
(`lone_stage_runner`), as `pipeline train` would. The entropy models run as separate Ray Train runs
at the same time (one driver thread each, sharing the cluster's CPUs), each early-stopped when its dev loss has not improved for
`rcl.patience` evaluations. A complete stage is reused on re-run; a killed run resumes from
its newest checkpoint (the trainer resumes runs by name), and its early-stop state is kept in
its run folder.

What is a reconstruction (the paper lost its equations), each a config switch: the loss forms
(losses/rcl.py: `loss.similarity`, `loss.temperature` τ, `loss.regulator_weight`,
`loss.regulator_reduce` sum/mean), the early-stop signal (the run's own loss on held-out pairs:
`rcl.patience`, `rcl.eval_every`, `rcl.dev_batches`), the dev split (`rcl.dev_split`), the
initial model's selection measure (`rcl.initial_metric`) and the final checkpoint
(`rcl.final_select`). Selection and early stopping use `rcl.dev_split` or the `validation:`
split: make it a dev split, not the test split, for honest numbers. STS setting:
`rcl.entropy_init: base`, `rcl.pairs` (NLI-style pairs), `rcl.sts_dev` (jobs/configs/rcl_sts.yaml).
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import replace
from pathlib import Path


from ..errors import ConfigError, PipelineError
from ..io_utils import atomic_path, write_json_atomic
from .rcl_regulators import build_regulators, model_digest, regulator_texts

EARLY_STOP_FILE = "early_stop.json"
SELECT_STATE = "select_state.json"


# --------------------------------------------------------------------------- dev data


def dev_pairs(job, limit: int | None = None) -> list[tuple[str, str]]:
    """(query, positive text) pairs of the dev split: the held-out share of `rcl.pairs`
    (`rcl.dev_split`), else the validation split (`validation.corpus/queries/qrels`)."""
    import pyarrow.parquet as pq

    from ..data.manifest import join_title, load_manifest
    from ..data.readers import load_qrels, load_queries

    s = job.section("rcl")
    v = job.validation
    if s.pairs and s.dev_split:
        from ..data.sentence_pairs import split_pairs

        _, dev = split_pairs(s.pairs, s.dev_split, job.validation.dev_seed)
        pairs = [(a, p) for _, a, p, _ in dev]
        return pairs[:limit] if limit else pairs
    if not v.corpus:
        raise ConfigError("RCL needs a dev split for early stopping and model selection: rcl.dev_split > 0 "
                          "(held out of the training queries or rcl.pairs) or validation.corpus")
    corpus = Path(v.corpus)
    manifest = load_manifest(corpus)
    qrels = load_qrels(Path(v.qrels or corpus / "qrels" / "test.trec"))
    queries = load_queries(Path(v.queries or corpus / "queries.tsv"))
    want = {d for q in qrels for d, r in qrels[q].items() if r >= job.data.rel_level}
    texts: dict[str, str] = {}
    for part in manifest["parts"]:
        t = pq.read_table(corpus / part["file"], columns=["pid", "title", "text"])
        for pid, title, text in zip(t["pid"].to_pylist(), t["title"].to_pylist(), t["text"].to_pylist()):
            if pid in want:
                texts[pid] = join_title(title, text, manifest["title_join"])
    pairs = [(queries[q], texts[d]) for q in sorted(qrels) if q in queries
             for d, r in sorted(qrels[q].items()) if r >= job.data.rel_level and d in texts]
    if not pairs:
        raise ConfigError(f"the validation split ({v.qrels}) gives no (query, positive) pair")
    return pairs[:limit] if limit else pairs


# --------------------------------------------------------------------------- validation hooks


def _save_model(model, dest: Path) -> None:
    with atomic_path(dest) as tmp:
        model.save(tmp)


class EarlyStop:
    """Validation hook of an entropy run: the run's own loss (eq. 2) on fixed dev batches.

    Keeps the lowest-loss model in `<run>/best`; after `patience` evaluations without a lower
    loss it writes `early_stop.json` and returns `{"stop": True}`: the trainer ends the run on
    every rank at that step with a checkpoint marked `stopped_early`, which counts as complete
    (a re-run does not train on). Its counters live in `<run>/select_state.json`, so a resumed
    run keeps them."""

    def __init__(self, run_dir: Path, pairs: list[tuple[str, str]], loss_cfg, batch_size: int, patience: int):
        self.run_dir, self.pairs, self.loss_cfg = Path(run_dir), pairs, loss_cfg
        self.batch_size, self.patience = batch_size, patience

    def dev_loss(self, model) -> dict:
        import torch

        from ..losses.base import resolve_similarity
        from ..losses.rcl import rcl_loss

        cfg = resolve_similarity(self.loss_cfg, bool(model.normalize))
        device = str(next(model.parameters()).device)
        q = model.embed([a for a, _ in self.pairs], "query", batch_size=64, device=device)
        d = model.embed([b for _, b in self.pairs], "doc", batch_size=64, device=device)
        sums = {"loss": 0.0, "cl": 0.0, "entropy": 0.0}
        n = 0
        B = self.batch_size
        for s in range(0, len(self.pairs) - B + 1 if len(self.pairs) >= B else 1, B):
            qb, db = torch.from_numpy(q[s:s + B]), torch.from_numpy(d[s:s + B])
            loss, terms = rcl_loss(qb, db, torch.arange(qb.shape[0]), cfg)
            sums["loss"] += float(loss)
            sums["cl"] += float(terms["cl"])
            sums["entropy"] += float(terms["entropy"])
            n += 1
        return {k: v / n for k, v in sums.items()}

    def __call__(self, model) -> dict:
        t0 = time.time()
        dev = self.dev_loss(model)
        state_path = self.run_dir / SELECT_STATE
        state = json.loads(state_path.read_text()) if state_path.exists() else {"best": None, "bad": 0, "evals": 0}
        state["evals"] += 1
        if state["best"] is None or dev["loss"] < state["best"] - 1e-7:
            state.update(best=dev["loss"], bad=0, best_eval=state["evals"])
            _save_model(model, self.run_dir / "best")
        else:
            state["bad"] += 1
        write_json_atomic(state_path, state)
        out = {f"val_{k}": v for k, v in dev.items()}
        out.update(val_metric=dev["loss"], val_best_loss=state["best"], val_bad_evals=state["bad"],
                   val_seconds=time.time() - t0)
        if state["bad"] >= self.patience:
            write_json_atomic(self.run_dir / EARLY_STOP_FILE, {**state, "patience": self.patience})
            out["stop"] = True  # the trainer's early-stop hook (train/loop.py)
        return out


class SelectBest:
    """Validation hook of the initial model: the spine's Validator; the best `val_metric` model
    (dev MAP by default) is kept in `<run>/best`."""

    def __init__(self, run_dir: Path, validator):
        self.run_dir, self.validator = Path(run_dir), validator

    def __call__(self, model) -> dict:
        out = self.validator(model)
        state_path = self.run_dir / SELECT_STATE
        state = json.loads(state_path.read_text()) if state_path.exists() else {"best": None, "evals": 0}
        state["evals"] += 1
        if state["best"] is None or out["val_metric"] > state["best"]:
            state.update(best=out["val_metric"], best_eval=state["evals"])
            _save_model(model, self.run_dir / "best")
        write_json_atomic(state_path, state)
        return {**out, "val_best": state["best"]}


# --------------------------------------------------------------------------- stage helpers


class Stages:
    """`stages/<name>.json` records a complete stage; a record is reused unless its inputs changed."""

    def __init__(self, root: Path):
        self.dir = root / "stages"
        self.dir.mkdir(parents=True, exist_ok=True)

    def get(self, name: str, inputs: dict) -> dict | None:
        p = self.dir / f"{name}.json"
        if not p.exists():
            return None
        rec = json.loads(p.read_text())
        if rec.get("inputs") != inputs:
            raise PipelineError(f"{p}: stage {name!r} was completed with other inputs "
                                f"({rec.get('inputs')} then, {inputs} now); use another train.name")
        return rec

    def put(self, name: str, inputs: dict, result: dict) -> dict:
        rec = {"stage": name, "inputs": inputs, **result, "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        write_json_atomic(self.dir / f"{name}.json", rec)
        return rec


def _config_key(job) -> dict:
    """The job settings a stage record must match (everything but names and paths of the run)."""
    from ..config import to_dict
    from ..io_utils import sha256_file

    key = {"model": to_dict(job.model), "data": to_dict(job.data), "optim": to_dict(job.optim),
           "loss": to_dict(job.loss), "batch": job.train.batch_size, "seed": job.train.seed,
           "epochs": job.train.epochs, "max_steps": job.train.max_steps}
    s = job.sections.get("rcl")
    if s is not None and s.pairs:  # the STS setting's training pairs (file content, dev share)
        key["pairs"] = {"sha256": sha256_file(s.pairs) if Path(s.pairs).is_file() else None, "dev_split": s.dev_split}
    return key


def stage_validator(validator_fn, job):
    """The validation hook of the initial and final models: STS dev Spearman when `rcl.sts_dev`
    is given (the STS setting), else `validator_fn(job)` (the spine's retrieval Validator)."""
    s = job.section("rcl")
    if s.sts_dev:
        from ..eval.sts import STSValidator

        return STSValidator(s.sts_dev)
    return validator_fn(job)


def lone_stage_runner(job) -> str | None:
    """Where a stage that trains one run alone (stage 0's initial model, stage 3's final model) trains:
    `local` (in this process, as `pipeline train` trains one worker without Ray) where train.runner is
    auto and nothing of the run asks for Ray Train (one worker, local storage, no Ray Data stream, no
    cluster address), though stage 1 may have started a Ray in this process for its concurrent runs;
    else None (train.runner decides: runner_choice.resolve_runner)."""
    from ..train.runner_choice import needs_ray

    return "local" if job.train.runner == "auto" and not needs_ray(job) else None


def _run(train_fn, job, validate_fn, progress: bool, runner: str | None = None) -> dict:
    """One training run to its end: its last step, or the step where its hook asked to stop
    (the trainer's early-stop hook; a stopped run counts as complete and is not trained again)."""
    run_dir = Path(job.train.storage_path).expanduser().resolve() / job.train.name
    summary = train_fn(job, validate_fn=validate_fn, progress=progress, **({"runner": runner} if runner else {}))
    rec = {"early_stopped": bool(summary.get("stopped_early")), "steps": summary["steps"],
           "wall_seconds": summary["wall_seconds"]}
    if rec["early_stopped"] and (run_dir / EARLY_STOP_FILE).exists():
        st = json.loads((run_dir / EARLY_STOP_FILE).read_text())
        rec.update(st)
        if progress:
            print(f"[rcl] {job.train.name}: early stop at step {summary['steps']} after {st['evals']} evaluations "
                  f"(best dev loss {st['best']:.4f} at evaluation {st['best_eval']})", flush=True)
    return rec


def _chosen_model(run_dir: Path) -> Path:
    best = run_dir / "best"
    return best if (best / "modules.json").exists() or (best / "config.json").exists() else run_dir / "model"


# --------------------------------------------------------------------------- stage 2: regulator tables


def entropy_shape(job, cpus: float | None = None) -> tuple[int, float, float]:
    """Stage 1's shape: (entropy runs at once, CPUs per worker, CPUs considered); the runs share
    `cpus` (the cluster's; default: room for every run at train.cpus_per_worker)."""
    s = job.section("rcl")
    tc = job.train
    n = len(s.entropy_lambdas)
    per_run = tc.num_workers * tc.cpus_per_worker
    cpus = per_run * n if cpus is None else cpus
    conc = max(1, min(n, s.max_concurrent or n)) if s.concurrent else 1
    cpw = s.entropy_cpus_per_worker or (tc.cpus_per_worker if conc * per_run <= cpus
                                        else math.floor(100 * cpus / (conc * tc.num_workers)) / 100)
    return conc, cpw, cpus


def _entropy_jobs(job, init_model: str, root: Path, cpus: float | None = None) -> tuple[list, int]:
    """One job per λ; CPUs per worker shared among the concurrent runs (`cpus` = the cluster's)."""
    s = job.section("rcl")
    tc = job.train
    conc, cpw, cpus = entropy_shape(job, cpus)
    if cpw <= 0:
        raise ConfigError(f"{conc} concurrent entropy runs x {tc.num_workers} worker(s) do not fit {cpus:g} CPUs")
    every = s.eval_every or tc.eval_every
    if not every:
        raise ConfigError("RCL early stopping needs rcl.eval_every (or train.eval_every) > 0")
    out = []
    for lam in s.entropy_lambdas:
        out.append(replace(job, model=replace(job.model, name_or_path=init_model, query_name_or_path=None),
                           loss=replace(job.loss, entropy_lambda=float(lam)),
                           sections={**job.sections, "rcl": replace(s, regulator_tables=())},
                           train=replace(tc, name=f"entropy-{lam:g}", storage_path=str(root),
                                         max_steps=s.entropy_max_steps or tc.max_steps, eval_every=every,
                                         checkpoint_every=every, cpus_per_worker=cpw,
                                         torch_threads=tc.torch_threads or max(1, int(cpw)))))
    return out, conc


def split_dev(job, root: Path):
    """`rcl.dev_split`: a seeded share of the training queries becomes the dev split; the job then
    trains on the rest (`data.qrels`) and validates on the dev queries (`validation.*`); the same
    split as `validation.dev_split` (train/dev_split.py), written to `<root>/split/`."""
    from ..train.dev_split import write_dev_split

    s = job.section("rcl")
    if not s.dev_split or s.pairs:  # rcl.pairs: the pairs' own dev share (data/sentence_pairs.py)
        return job
    if job.data.source != "qrels" or not job.data.corpus:
        raise ConfigError("rcl.dev_split needs data.source=qrels with data.corpus")
    corpus = Path(job.data.corpus)
    train, dev = write_dev_split(Path(job.data.qrels or corpus / "qrels" / "train.trec"), s.dev_split,
                                 job.validation.dev_seed, root / "split", "rcl.dev_split")
    return replace(job, data=replace(job.data, qrels=str(train)),
                   validation=replace(job.validation, corpus=str(corpus), queries=job.data.queries,
                                      qrels=str(dev)))


def anisotropy_of(job, models: dict[str, str], root: Path, n: int) -> dict[str, float]:
    """Anisotropy of each model on the same `n` random training sentences (queries and answers)."""
    from ..eval.faq import anisotropy
    from ..models import BiEncoder

    examples = root / "examples"
    if not any(examples.glob("part-*.parquet")):
        from ..train.methods import get_method

        get_method(job.loss.name).build_examples(job, examples, progress=False)
    queries, docs = regulator_texts(examples)
    out = {}
    for name, path in models.items():
        m = BiEncoder.load(replace(job.model, name_or_path=str(path), query_name_or_path=None))
        out[name] = round(anisotropy(m, queries + docs, n=n, seed=job.train.seed), 6)
    return out


def run_rcl(job, progress: bool = True, train_fn=None, validator_fn=None) -> dict:
    """All stages of RCL; returns (and writes to rcl.json) the record of every stage.

    `train_fn` (default trainer.train) and `validator_fn(job) -> Validator` are injectable for tests."""
    on_ray = train_fn is None  # injected training (tests) starts no Ray
    if train_fn is None:
        from ..train.trainer import train as train_fn
    if validator_fn is None:
        from ..index.validate import make_validator as validator_fn
    from ..train.methods import get_method

    s = job.section("rcl")
    if "://" in job.train.storage_path and not job.train.storage_path.startswith("file://"):
        raise ConfigError(f"train.storage_path={job.train.storage_path}: RCL keeps its stages, regulator tables and "
                          "entropy models in a local or shared-filesystem folder; give a path (object-store URIs "
                          "work for pipeline train with dpr/dar/ance/arr)")
    root = Path(job.train.storage_path.removeprefix("file://")).expanduser().resolve() / job.train.name
    root.mkdir(parents=True, exist_ok=True)
    job = split_dev(job, root)
    stages = Stages(root)
    base_model = job.model.name_or_path
    key = _config_key(job)
    record: dict = {"base": base_model, "stages": {}}
    t_all = time.time()

    # ---- stage 0: the initial model (FAQ setting), eq. 1 with dev-MAP selection
    init_model = base_model
    if s.entropy_init == "initial":
        inputs = {**key, "stage": "initial", "metric": s.initial_metric, "eval_every": s.eval_every or job.train.eval_every}
        rec = stages.get("initial", inputs)
        if rec is None:
            j0 = replace(job, loss=replace(job.loss, entropy_lambda=0.0),
                         sections={**job.sections, "rcl": replace(s, regulator_tables=())},
                         validation=replace(job.validation, metric=s.initial_metric),
                         train=replace(job.train, name="initial", storage_path=str(root),
                                       max_steps=s.initial_max_steps or job.train.max_steps,
                                       eval_every=s.eval_every or job.train.eval_every))
            if progress:
                print(f"[rcl] stage 0: initial model (eq. 1, selected on dev {s.initial_metric})", flush=True)
            val = stage_validator(validator_fn, j0)
            run = _run(train_fn, j0, SelectBest(root / "initial", val) if val is not None else None, progress,
                       lone_stage_runner(j0) if on_ray else None)
            chosen = _chosen_model(root / "initial")
            sel = root / "initial" / SELECT_STATE
            rec = stages.put("initial", inputs, {"model": str(chosen), **run,
                                                 "selection": json.loads(sel.read_text()) if sel.exists() else None})
        init_model = rec["model"]
        record["stages"]["initial"] = rec

    # ---- stage 1: entropy models, concurrently, each early-stopped
    entropy_models: dict[str, Path] = {}
    if s.regulators:
        jobs, conc = _entropy_jobs(job, init_model, root)
        pairs = dev_pairs(job, limit=s.dev_batches * job.train.batch_size)
        todo, results, errors = [], {}, {}
        for jk in jobs:
            inputs = {**_config_key(jk), "stage": jk.train.name, "patience": s.patience,
                      "eval_every": jk.train.eval_every, "init": init_model}
            rec = stages.get(jk.train.name, inputs)
            if rec is None:
                todo.append((jk, inputs))
            else:
                results[jk.train.name] = rec
        if todo:
            from ..ray_runtime import cluster_resources, init_ray

            if on_ray:
                init_ray(replace(job.ray, dashboard=True))  # once, before the threads
                jobs, conc = _entropy_jobs(job, init_model, root, cluster_resources().get("CPU", 1.0))
                by_name = {jk.train.name: jk for jk in jobs}
                todo = [(by_name[jk.train.name], inputs) for jk, inputs in todo]
            if progress:
                print(f"[rcl] stage 1: {len(todo)} entropy model(s) "
                      f"({', '.join(f'λ={jk.loss.entropy_lambda:g}' for jk, _ in todo)}), {conc} at a time, "
                      f"{jobs[0].train.cpus_per_worker:g} CPU/worker", flush=True)
            t1 = time.time()
            sem = threading.Semaphore(conc)

            def one(jk, inputs):
                with sem:
                    try:
                        rd = root / jk.train.name
                        rd.mkdir(parents=True, exist_ok=True)
                        stop = EarlyStop(rd, pairs, jk.loss, jk.train.batch_size, s.patience)
                        run = _run(train_fn, jk, stop, progress)
                        results[jk.train.name] = stages.put(jk.train.name, inputs,
                                                            {"model": str(_chosen_model(rd)), "lambda": jk.loss.entropy_lambda,
                                                             **run, "selection": json.loads((rd / SELECT_STATE).read_text())
                                                             if (rd / SELECT_STATE).exists() else None})
                    except BaseException as e:  # noqa: BLE001 — re-raised below, in the caller's thread
                        errors[jk.train.name] = e

            # the runs import transformers' model classes from their threads; its lazy module is not safe to
            # import from two threads at once ("cannot import name 'AutoModel'"): import them here first
            import transformers  # noqa: F401
            from transformers import AutoConfig, AutoModel, AutoTokenizer  # noqa: F401

            threads = [threading.Thread(target=one, args=a, name=f"rcl-{a[0].train.name}", daemon=True) for a in todo]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            record["stage1_wall_seconds"] = round(time.time() - t1, 1)
            if errors:
                name, err = next(iter(errors.items()))
                if isinstance(err, PipelineError):
                    raise err
                raise PipelineError(f"entropy run {name} failed: {err}") from err
        for jk in jobs:
            rec = results[jk.train.name]
            record["stages"][jk.train.name] = rec
            entropy_models[jk.train.name] = Path(rec["model"])

    # ---- stage 2: regulator vectors
    tables: list[str] = []
    if entropy_models:
        method = get_method(job.loss.name)
        examples = root / "examples"
        meta = method.build_examples(job, examples, progress=progress)
        inputs = {"models": {k: model_digest(p) for k, p in entropy_models.items()}, "examples": meta.get("digest"),
                  "precision": s.encode.precision, "fp16": s.encode.fp16}
        rec = stages.get("regulators", inputs)
        if rec is None:
            from ..ray_runtime import init_ray

            if on_ray:
                init_ray(job.ray)
            t2 = time.time()
            tables = build_regulators(entropy_models, job, examples, root / "regulators", progress)
            rec = stages.put("regulators", inputs, {"tables": tables, "wall_seconds": round(time.time() - t2, 1)})
        tables = rec["tables"]
        record["stages"]["regulators"] = rec

    # ---- stage 3: the final model from the base, eq. 3
    j3 = replace(job, loss=replace(job.loss, entropy_lambda=0.0),
                 sections={**job.sections, "rcl": replace(s, regulator_tables=tuple(tables))},
                 train=replace(job.train, name="final", storage_path=str(root),
                               # `final_select: best` needs evaluations along the way
                               eval_every=job.train.eval_every or (s.eval_every if s.final_select == "best" else 0)))
    inputs = {**_config_key(j3), "stage": "final", "tables": tables}
    if s.final_select == "best":
        inputs["select"] = {"sts_dev": s.sts_dev, "metric": job.validation.metric}
    rec = stages.get("final", inputs)
    if rec is None:
        if progress:
            print(f"[rcl] stage 3: final model from the base with {2 * len(tables)} regulators", flush=True)
        val = stage_validator(validator_fn, j3)
        select = s.final_select == "best" and val is not None
        lone = lone_stage_runner(j3) if on_ray else None
        summary = train_fn(j3, validate_fn=SelectBest(root / "final", val) if select else val, progress=progress,
                           **({"runner": lone} if lone else {}))
        sel = root / "final" / SELECT_STATE
        rec = stages.put("final", inputs, {"model": str(_chosen_model(root / "final") if select else root / "final" / "model"),
                                           "steps": summary["steps"], "wall_seconds": summary["wall_seconds"],
                                           "final_metrics": summary.get("final_metrics"),
                                           "total_steps": summary.get("total_steps"),
                                           **({"selection": json.loads(sel.read_text())} if select and sel.exists() else {})})
    record["stages"]["final"] = rec
    record["final_model"] = rec["model"]
    record["entropy_models"] = {k: str(v) for k, v in entropy_models.items()}
    if s.anisotropy_sentences and on_ray:
        models = {"base": base_model, **({"initial": init_model} if init_model != base_model else {}),
                  **{k: str(v) for k, v in entropy_models.items()}, "final": rec["model"]}
        record["anisotropy"] = anisotropy_of(job, models, root, s.anisotropy_sentences)
        if progress:
            print("[rcl] anisotropy (mean pairwise cosine): "
                  + ", ".join(f"{k} {v:.4f}" for k, v in record["anisotropy"].items()), flush=True)
    record["wall_seconds"] = round(time.time() - t_all, 1)
    write_json_atomic(root / "rcl.json", record)
    if progress:
        print(f"[rcl] done: final model {rec['model']} ({len(entropy_models)} entropy models, "
              f"{2 * len(tables)} regulators); record {root / 'rcl.json'}", flush=True)
    return record

