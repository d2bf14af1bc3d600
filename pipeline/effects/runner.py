"""Running an effects experiment on one dataset: every arm, every seed, resumable, its result file rewritten after
each finished run.

    <work>/<family>-<dataset>/            made by this command (marker .reproduce-work), locked while it runs
        prepare/                          the prepare commands' outputs (corpus, BM25 run), done.json last
        labeled-documents.txt             the training pairs' positives (DAR's "labeled" documents)
        arms/<arm>/seed-<s>/              one trained run: started.json first (its commands), train/ (the
                                          trainer's run), emb/, index/, run.trec, logs/<step>.log (each command's
                                          own output), scores.json, done.json last
        arms/<arm>/once/                  an arm without training (zero-shot): one run for every seed
        result.json                       per arm and seed the figures and per-query values, per comparison the
                                          effect (record.py, stats.py)

A run whose done.json records the same commands (the checkout they name may differ) and the same identity
(effects/identity.py: the arm's definition, the vars, the content of the config files its commands name, the
data's fingerprint, the prepare's digest and the seed) is not run again (a killed experiment re-run goes on
where it stopped: a killed training resumes from its checkpoint, encode from its shards; index and retrieve are
redone). A run finished or started with other commands or another identity (the arm was redefined, a config file
edited, the data or the prepare made again otherwise) is set aside whole as `seed-<s>.replaced-<time>` (said,
with what differs; never removed: its figures are no longer the arm's) and the run is made again. A run's
scores are computed again from its run.trec when the metric, the judgements or the labeled documents they were
scored on are not today's.

Every command runs as a child that dies with this process (Linux: PR_SET_PDEATHSIG) and holds the work
folder's lock too, so a killed `reproduce run` leaves no training going on beside the next one.
A folder of an earlier prepare that did not finish is this command's own and is made again; nothing that is
not this command's is touched, and a work folder holding anything else is refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from ..errors import PipelineError
from ..provenance import repo_root
from .spec import Arm, Experiment, fill
from .record import PARTS, UNREFRESHED, rounded, tables

OWN_ENTRIES = {"prepare", "prepare.partial", "labeled-documents.txt", "labeled-documents.json", "arms",
               "result.json"}


class WorkFolder:
    """The experiment's folder: made with a marker, refused when it holds what this command did not make,
    locked so that two runs of one experiment never share it (io_utils.claim_work_folder)."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = None

    def open(self) -> "WorkFolder":
        from ..io_utils import claim_work_folder

        self._lock = claim_work_folder(self.path, OWN_ENTRIES)
        _HELD.append(self._lock)
        return self

    def close(self) -> None:
        if self._lock is not None:
            if self._lock in _HELD:
                _HELD.remove(self._lock)
            self._lock.close()
            self._lock = None


class LoadSampler:
    """The machine's load while a run goes on (its 1-minute load average every `every` seconds, on a thread):
    a run whose mean load was above the machine's cores shared it with something else, and its wall time says
    more about that than about the arm (`record.shared`)."""

    def __init__(self, every: float = 15.0):
        import threading

        self.every, self.samples = every, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="effects-load", daemon=True)

    def _sample(self) -> None:
        import os

        while True:
            try:
                self.samples.append(os.getloadavg()[0])
            except OSError:  # no load average on this system: nothing is said
                return
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict | None:
        import os

        if not self.samples:
            return None
        return {"mean": round(sum(self.samples) / len(self.samples), 2), "max": round(max(self.samples), 2),
                "cpus": os.cpu_count(), "samples": len(self.samples)}


CLI_MODULE = "pipeline.cli"  # what a step runs (`python -m CLI_MODULE ARGS`)
# the work folder's lock while an experiment runs (WorkFolder): every step's child holds it too
_HELD: list = []
# the child sets PR_SET_PDEATHSIG (SIGTERM when this process dies, however it dies), checks that its parent is
# still the one that started it (it may have died in between), then becomes the step's command
_CHILD = ("import ctypes, os, signal, sys\n"
          "try:\n    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"
          "except (AttributeError, OSError):\n    pass\n"
          "if os.getppid() != int(sys.argv[1]):\n    sys.exit(143)\n"
          "os.execv(sys.executable, [sys.executable, '-m', sys.argv[2], *sys.argv[3:]])\n")


def _run_steps(steps: list[tuple[str, list[str]]], logs: Path, say) -> dict[str, float]:
    """Run `pipeline` commands one after another as subprocesses, each one's output in logs/<name>.log;
    a failed command raises naming its log's last line. Each child dies with this process and holds the work
    folder's lock (`_HELD`) while it lives."""
    import os

    logs.mkdir(parents=True, exist_ok=True)
    seconds = {}
    held = tuple(f.fileno() for f in _HELD)
    for name, argv in steps:
        t0 = time.time()
        log = logs / f"{name}.log"
        with open(log, "w", encoding="utf-8") as f:
            f.write("$ " + " ".join(argv) + "\n")
            f.flush()
            rc = subprocess.run([sys.executable, "-c", _CHILD, str(os.getpid()), CLI_MODULE, *argv[1:]], stdout=f,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, pass_fds=held).returncode
        seconds[name] = round(time.time() - t0, 1)
        if rc != 0:
            lines = [ln for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
            raise PipelineError(f"{name} exited {rc}: {lines[-1] if lines else '(no output)'} (its whole output: {log})")
        say(f"{name} {seconds[name]:.0f}s")
    return seconds


def _done(folder: Path, commands: list[list[str]], identity: dict | None = None) -> dict | None:
    """The run's marker when it finished with these commands (and, given `identity`, that identity: see
    effects/identity.py). The checkout they name (`{repo}`) may differ: the same experiment run from another
    clone (or a worktree kept fixed for a long run) is the same run."""
    done = _marker(folder / "done.json", commands)
    if done is None or identity is None:
        return done
    return done if (done.get("identity") or {}).get("digest") == identity["digest"] else None


def _marker(path: Path, commands: list[list[str]]) -> dict | None:
    """The marker file's content when it records these commands (from this checkout or another), else None."""
    try:
        done = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    theirs = done.get("commands") if isinstance(done, dict) else None
    if not (isinstance(theirs, list) and all(isinstance(c, list) and all(isinstance(a, str) for a in c)
                                             for c in theirs)):
        return None  # not a marker this runner wrote: the run is made again
    repo = str(repo_root())
    their_repo = done.get("repo") or _their_repo(commands, theirs, repo) or repo
    return done if _in_repo_terms(commands, repo) == _in_repo_terms(theirs, their_repo) else None


def _started_otherwise(folder: Path, commands: list[list[str]], identity: dict | None = None) -> str | None:
    """What the folder holds when it is a run of other commands than these, or (given `identity`) of another
    identity ("finished earlier with other commands", "started earlier made with other data ..."; its
    done.json, or the started.json a run writes first), else None (nothing there, the same run, or a folder
    with neither marker: a killed run of the same commands resumes)."""
    from .identity import describe_difference

    for name, said in (("done.json", "finished"), ("started.json", "started")):
        if (folder / name).exists():
            marker = _marker(folder / name, commands)
            if marker is None:
                return f"{said} earlier with other commands (the arm's definition changed)"
            then = marker.get("identity")
            if identity is not None and (then or {}).get("digest") != identity["digest"]:
                return f"{said} earlier, {describe_difference(then, identity)}"
            return None
    return None


def _aside_name(folder: Path) -> Path:
    """A free name for a run set aside: `<seed>.replaced-<time>`, with -2, -3 ... when one was set aside in the
    same second."""
    base = f"{folder.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}"
    kept, n = folder.with_name(base), 1
    while kept.exists():
        n += 1
        kept = folder.with_name(f"{base}-{n}")
    return kept


def _training(summary: dict | None) -> dict | None:
    """What a run trained on, from the trainer's summary: the examples, the steps, the global batch and the
    precision it computed in (`train.amp=auto` trains in bf16 on a CPU with native bf16, in fp32 elsewhere, so
    two machines make two trainings of one arm). None for an arm without training, or a summary that cannot be
    read."""
    try:
        if summary is None:
            return None
        out = {k: int(summary[k]) for k in ("examples", "steps", "global_batch")}
    except (KeyError, TypeError, ValueError):
        return None
    if isinstance(summary.get("precision"), str):
        out["precision"] = summary["precision"]
    return out


def _refreshed(summary: dict | None) -> list[dict] | None:
    """For a run with an index refresher beside training (ANCE): the refreshed negatives versions the trainer
    trained on, each with the step it switched at ([] when it took none: the run trained on its first
    negatives throughout, which is not ANCE). None for a run without a refresher."""
    if summary is None or "refresher" not in summary:
        return None
    used = summary.get("negatives_versions") or []
    return [{"version": v.get("version"), "at_step": v.get("at_step")} for v in used if isinstance(v, dict)]


def _in_repo_terms(commands: list[list[str]], repo: str) -> list[list[str]]:
    return [[a.replace(repo + "/", "{repo}/") for a in c] for c in commands]


def _their_repo(ours: list[list[str]], theirs: list[list[str]], repo: str) -> str | None:
    """For a marker written before markers recorded their checkout: the path standing where ours has
    `repo/` in the first argument that differs (the rest must then agree, which the caller checks)."""
    for a, b in ((a, b) for c, t in zip(ours, theirs) for a, b in zip(c, t) if a != b):
        head, sep, tail = a.partition(repo + "/")
        if sep and b.startswith(head) and b.endswith("/" + tail) and len(b) > len(head) + len(tail) + 1:
            return b[len(head):len(b) - len(tail) - 1]
        return None
    return None


class ExperimentRun:
    """One experiment on one dataset (see the module doc)."""

    def __init__(self, exp: Experiment, dataset: str, data_path: str, work: Path, seeds: list[int] | None = None,
                 arms: list[str] | None = None, set_vars: dict | None = None, print_fn=print):
        self.exp, self.dataset, self.data_path = exp, dataset, data_path
        self.work = WorkFolder(work)
        self.root = work
        self.seeds = list(seeds) if seeds is not None else list(exp.seeds)
        unknown = [a for a in (arms or []) if a not in exp.arms]
        if unknown:
            raise PipelineError(f"--arms {', '.join(unknown)}: no such arm in the experiment; its arms: "
                                + ", ".join(exp.arms))
        self.arm_ids = list(arms) if arms else list(exp.arms)
        unknown = sorted(set(set_vars or {}) - set(exp.vars))
        if unknown:
            raise PipelineError(f"--set {', '.join(unknown)}: not a var of the experiment; its vars: "
                                + ", ".join(f"{k}={v}" for k, v in exp.vars.items()))
        self.vars = {**exp.vars, **(set_vars or {})}
        self.changed_vars = {k: v for k, v in (set_vars or {}).items() if str(exp.vars[k]) != str(v)}
        self.print = print_fn
        self.base = {"repo": str(repo_root()), "data": data_path, "prep": str(work / "prepare"), **self.vars}
        self.data_fp, self.prep_digest = None, None  # (fingerprint(), once the prepare is there)
        self.left_out: list[str] = []
        self.rescored = 0

    # ------------------------------------------------------------------ pieces

    def say(self, text: str) -> None:
        self.print(f"[effects] {self.dataset}: {text}", flush=True)

    def prepare(self) -> None:
        prep = self.root / "prepare"
        commands = [fill(c, {**self.base, "prep": str(prep)}) for c in self.exp.prepare]
        if _done(prep, commands):
            return
        partial = self.root / "prepare.partial"
        if partial.exists():  # our own unfinished prepare (the name is ours, inside our marked folder)
            import shutil

            shutil.rmtree(partial)
        if prep.exists():  # a prepare of other commands (an older matrix): made again
            import shutil

            shutil.rmtree(prep)
        partial.mkdir(parents=True)
        steps = [(f"prepare-{i + 1}-{c[1]}", fill(t, {**self.base, "prep": str(partial)}))
                 for i, (c, t) in enumerate(zip(commands, self.exp.prepare))]
        t0 = time.time()
        _run_steps(steps, partial / "logs", lambda s: self.say(f"prepare: {s}"))
        from ..io_utils import write_json_atomic

        write_json_atomic(partial / "done.json", {"commands": commands, "seconds": round(time.time() - t0, 1)})
        partial.rename(prep)
        self._fix_prepare_paths(partial, prep)

    def _fix_prepare_paths(self, old: Path, new: Path) -> None:
        """Files of the prepared folder that name its temporary name (a run's meta) name its final one."""
        for meta in new.glob("*.meta.json"):
            text = meta.read_text(encoding="utf-8")
            if str(old) in text:
                meta.write_text(text.replace(str(old), str(new)), encoding="utf-8")

    def _labeled_key(self) -> dict:
        """What the labeled documents are drawn from: the training judgements (their digest) and the vars that
        pick the positives."""
        from .identity import judgements_digest

        return {"train_qrels": judgements_digest(self.root / "prepare" / self.exp.train_qrels),
                "rel_level": int(self.vars.get("rel_level", 1)), "positives": int(self.vars.get("positives", 0)),
                "positives_seed": int(self.vars.get("positives_seed", 0))}

    def labeled_documents(self) -> set[str]:
        """The training pairs' positives, drawn as the trainer draws them (data.positives_per_query). Kept in
        labeled-documents.txt with what they were drawn from (labeled-documents.json): drawn again when the
        training judgements or the vars that pick them (positives, positives_seed, rel_level) are not those."""
        from ..data.readers import read_qrels
        from ..data.qrels_examples import pick_positives
        from ..io_utils import write_json_atomic

        path, key_file = self.root / "labeled-documents.txt", self.root / "labeled-documents.json"
        key = self._labeled_key()
        try:
            kept_key = json.loads(key_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            kept_key = None
        if path.is_file() and kept_key == key:
            return set(path.read_text(encoding="utf-8").split())
        rel_level, per_query, seed = key["rel_level"], key["positives"], key["positives_seed"]
        positives, grades = {}, {}
        for r in read_qrels(self.root / "prepare" / self.exp.train_qrels):
            if r["rel"] >= rel_level:
                positives[r["qid"]] = positives.get(r["qid"], ()) + (r["docid"],)
                grades[r["qid"]] = grades.get(r["qid"], ()) + (int(r["rel"]),)
        if per_query:
            positives = pick_positives(positives, grades, per_query, seed)
        docs = {d for ds in positives.values() for d in ds}
        from ..io_utils import write_text_atomic

        write_text_atomic(path, "".join(f"{d}\n" for d in sorted(docs)))
        write_json_atomic(key_file, key)
        return docs

    def run_folder(self, arm: Arm, seed: int | None) -> Path:
        return self.root / "arms" / arm.id / ("once" if seed is None else f"seed-{seed}")

    def commands(self, arm: Arm, seed: int | None, folder: Path) -> list[tuple[str, list[str]]]:
        values = {**self.base, "run": str(folder), "seed": "" if seed is None else seed}
        values["model_path"] = arm.model_path.format(**values)
        names = (["train"] if arm.train is not None else []) + [c[1] for c in self.exp.evaluate]
        return [(n, fill(c, values)) for n, c in zip(names, self.exp.arm_commands(arm))]

    def scoring_key(self, labeled: set[str]) -> dict:
        """What a run's scores were computed with: the metric, the judgements scored, the labeled documents."""
        import hashlib

        from .identity import judgements_digest

        return {"metric": self.exp.metric, "qrels": judgements_digest(self.root / "prepare" / self.exp.qrels),
                "labeled": hashlib.sha256("\n".join(sorted(labeled)).encode()).hexdigest()[:16]}

    def scores_of(self, folder: Path, labeled: set[str]) -> dict | None:
        """The run's scores as today's metric, judgements and labeled documents give them: its scores.json when
        it was scored on those, else computed again from its run.trec (and kept); None when neither can be read."""
        from ..io_utils import write_json_atomic

        key = self.scoring_key(labeled)
        try:
            kept = json.loads((folder / "scores.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            kept = None
        if isinstance(kept, dict) and kept.get("scored_with") == key:
            return kept
        if not (folder / "run.trec").is_file():
            return None
        scores = {**self.score(folder, labeled), "scored_with": key}
        write_json_atomic(folder / "scores.json", scores)
        if isinstance(kept, dict):
            self.rescored += 1
        return scores

    def score(self, folder: Path, labeled: set[str]) -> dict:
        """Per-query values of the metric on the test judgements: all, labeled and unlabeled documents."""
        from ..config import EvalConfig
        from ..data.readers import load_qrels
        from ..eval.label_split import evaluate_parts
        from ..eval.metrics import evaluate_run
        from ..eval.runs import read_run

        cfg = EvalConfig(measures=(self.exp.metric,), per_query=True)
        run = read_run(folder / "run.trec")
        qrels = load_qrels(self.root / "prepare" / self.exp.qrels)
        out = {"all": evaluate_run(run, qrels, cfg)}
        out.update(evaluate_parts(run, qrels, labeled, cfg))
        name = self.exp.metric
        return {part: {"mean": res["metrics"].get(name),
                       "per_query": {q: v[name] for q, v in (res.get("per_query") or {}).items()}}
                for part, res in out.items()}

    # ------------------------------------------------------------------ the run

    def run(self) -> dict:
        self.work.open()
        try:
            return self._run()
        finally:
            self.work.close()

    def fingerprint(self) -> None:
        """The data's fingerprint and the prepare's digest (effects/identity.py), once the prepare is there."""
        from .identity import data_fingerprint, prepare_digest

        prep = self.root / "prepare"
        self.data_fp = data_fingerprint(prep, self.exp.qrels, self.exp.train_qrels)
        self.prep_digest = prepare_digest(self.exp.prepare, self.vars, self.data_fp, prep)

    def identity(self, arm: Arm, seed: int | None, steps: list[tuple[str, list[str]]] | None = None) -> dict:
        """The run's identity (effects/identity.py)."""
        from .identity import config_files, run_identity
        from .record import run_definition

        steps = steps if steps is not None else self.commands(arm, seed, self.run_folder(arm, seed))
        return run_identity(run_definition(self.exp, arm, self.vars), self.vars,
                            config_files([c for _, c in steps], self.base["repo"]), self.data_fp, self.prep_digest,
                            seed)

    def _finished(self, arm: Arm, seed: int | None) -> dict | None:
        folder = self.run_folder(arm, seed)
        steps = self.commands(arm, seed, folder)
        return _done(folder, [c for _, c in steps], self.identity(arm, seed, steps))

    def _plan(self) -> list[tuple[Arm, int | None]]:
        plan = []
        for a in self.arm_ids:
            arm = self.exp.arms[a]
            plan += [(arm, s) for s in self.seeds] if arm.seeded else [(arm, None)]
        return plan

    def _run(self) -> dict:
        from ..io_utils import write_json_atomic

        from ..provenance import code_digest, machine

        t_start = time.time()
        self.code = code_digest()
        self.machine = machine()
        self.prepare()
        self.fingerprint()
        labeled = self.labeled_documents()
        plan = self._plan()
        todo = [(a, s) for a, s in plan if not self._finished(a, s)]
        self.say(f"{len(plan)} runs ({len(plan) - len(todo)} done before): arms {', '.join(self.arm_ids)}; seeds "
                 f"{', '.join(map(str, self.seeds))}; {len(labeled):,} labeled documents"
                 + (f"; vars changed: {self.changed_vars}" if self.changed_vars else ""))
        spent, self.failed = [], []
        for i, (arm, seed) in enumerate(todo, 1):
            folder = self.run_folder(arm, seed)
            steps = self.commands(arm, seed, folder)
            what = f"{arm.id}" + ("" if seed is None else f" seed {seed}")
            identity = self.identity(arm, seed, steps)
            earlier = _started_otherwise(folder, [c for _, c in steps], identity)
            if earlier:  # finished or started as another run: its figures are not this arm's now
                kept = _aside_name(folder)
                folder.rename(kept)
                self.say(f"{what}: {earlier}: kept at {kept}, run again")
            folder.mkdir(parents=True, exist_ok=True)
            write_json_atomic(folder / "started.json", {"commands": [c for _, c in steps], "repo": self.base["repo"],
                                                        "identity": identity})
            t0 = time.time()
            try:
                with LoadSampler() as load:
                    seconds = _run_steps(steps, folder / "logs", lambda s, w=what: self.say(f"{w}: {s}"))
            except PipelineError as e:  # this run failed: said, kept out of the figures, the others go on
                self.failed.append(f"{what}: {e}")
                self.say(f"{what}: FAILED: {e} [{i}/{len(todo)}]; the other runs go on, and a re-run tries it again")
                continue
            scores = {**self.score(folder, labeled), "scored_with": self.scoring_key(labeled)}
            write_json_atomic(folder / "scores.json", scores)
            wall = round(time.time() - t0, 1)
            write_json_atomic(folder / "done.json", {"commands": [c for _, c in steps], "repo": self.base["repo"],
                                                     "identity": identity, "seconds": seconds,
                                                     "wall_seconds": wall, "load": load.summary(),
                                                     "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                                     "code_digest": self.code, "machine": self.machine})
            spent.append(wall)
            left = len(todo) - i
            eta = f", about {left * sum(spent) / len(spent) / 60:.0f} min left" if left else ""
            m = scores["all"]["mean"]
            parts = ", ".join(f"{p} {scores[p]['mean']:.4f}" for p in ("labeled", "unlabeled")
                              if scores[p]["mean"] is not None)
            self.say(f"{what}: {self.exp.metric} {m:.4f} ({parts}) in {wall / 60:.1f} min [{i}/{len(todo)}{eta}]")
            if _refreshed(self._summary(arm, seed, folder)) == []:
                self.say(f"{what}: WARNING: {UNREFRESHED.format(arm=arm.id)}; every cell comparing {arm.id} "
                         f"reads 'not comparable' until a run of it takes one (logs/train.log)")
            write_json_atomic(self.root / "result.json", self.result(labeled, time.time() - t_start))
        result = self.result(labeled, time.time() - t_start)
        result["failed"] = list(self.failed)
        write_json_atomic(self.root / "result.json", result)
        return result

    # ------------------------------------------------------------------ the result

    def collect(self, labeled: set[str] | None = None) -> dict:
        """{arm: {seed or None: {"scores": ..., "wall_seconds": ...}}} of every finished run of today's identity,
        scored with today's metric, judgements and labeled documents; a finished run of another identity is left
        out and counted in `self.left_out` with what differs."""
        from .identity import describe_difference

        out = {}
        self.left_out = []
        labeled = self.labeled_documents() if labeled is None else labeled
        for a in self.exp.arms.values():
            for seed in (self.exp.seeds if a.seeded else [None]):
                folder = self.run_folder(a, seed)
                steps = self.commands(a, seed, folder)
                identity = self.identity(a, seed, steps)
                done = _done(folder, [c for _, c in steps], identity)
                if done is None:
                    other = _done(folder, [c for _, c in steps])
                    if other is not None:
                        what = f"{a.id}" + ("" if seed is None else f" seed {seed}")
                        self.left_out.append(f"{what}: {describe_difference(other.get('identity'), identity)}")
                    continue
                scores = self.scores_of(folder, labeled)
                if scores is None:
                    continue
                summary = self._summary(a, seed, folder)  # read once: what it trained on, which versions
                scores = {p: {"mean": scores[p]["mean"], "per_query": rounded(scores[p]["per_query"])}
                          for p in PARTS}  # as the record keeps them: its comparisons recompute to the same
                out.setdefault(a.id, {})[seed] = {"scores": scores, "wall_seconds": done.get("wall_seconds"),
                                                  "load": done.get("load"), "identity": identity,
                                                  "date": done.get("date"), "code_digest": done.get("code_digest"),
                                                  "machine": done.get("machine"),
                                                  "training": _training(summary), "refreshed": _refreshed(summary)}
        return out

    def _summary(self, arm: Arm, seed: int | None, folder: Path) -> dict | None:
        """The trainer's summary.json beside the evaluated model (None for an arm without training, or a
        summary that cannot be read)."""
        if arm.train is None:
            return None
        values = {**self.base, "run": str(folder), "seed": "" if seed is None else seed}
        try:
            summary = json.loads((Path(arm.model_path.format(**values)).parent / "summary.json")
                                 .read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return summary if isinstance(summary, dict) else None

    def result(self, labeled: set[str], seconds: float) -> dict:
        """The experiment's result file: per arm its figures by seed, per comparison its effect on every part."""
        from ..models.checkpoint import library_versions
        from ..provenance import code_digest, commit, machine

        runs = self.collect(labeled)
        made = tables(self.exp, self.dataset, runs)
        # the experiment as defined (every arm, every seed it names): what the page and a record say of it;
        # this invocation's part (--arms, --seeds) is counted apart, so a run of two arms never reads as the whole
        planned = sum(len(self.exp.seeds) if a.seeded else 1 for a in self.exp.arms.values())
        finished = sum(len(v) for v in runs.values())
        mine = self._plan()
        mine_finished = sum(1 for a, s in mine if s in runs.get(a.id, {}))
        return {"experiment": self.exp.family, "dataset": self.dataset, "data": self.data_path,
                "metric": self.exp.metric, "seeds": list(self.exp.seeds), "seeds_run": self.seeds,
                "arms_run": self.arm_ids, "vars": self.vars,
                "changed_vars": self.changed_vars, "labeled_documents": len(labeled),
                "data_fingerprint": self.data_fp, "prepare_digest": self.prep_digest,
                "runs_left_out": list(self.left_out),
                "complete": finished >= planned, "runs_finished": finished, "runs_planned": planned,
                "this_invocation": {"runs_planned": len(mine), "runs_finished": mine_finished,
                                    "complete": mine_finished >= len(mine)},
                "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine(), "versions": library_versions(),
                "commit": commit(), "code_digest": code_digest(),
                "code_digests_of_runs": sorted({str(r.get("code_digest")) for v in runs.values() for r in v.values()}),
                "wall_seconds_this_invocation": round(seconds, 1),
                **made}
