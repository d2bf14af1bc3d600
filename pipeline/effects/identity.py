"""A run's identity in an effects experiment: everything that decides what one arm's run on one seed computes,
computed once and kept in the run's markers (started.json, done.json) and in the record, and used by every
reader (#60):

    definition   the arm's definition (record.run_definition: its commands' templates and model path, the
                 experiment's prepare, vars and judgements) with the vars the run used; not the metric: a run
                 is scored again for another metric from its run.trec, never trained again
    vars         the vars the run used (the experiment's, or --set values)
    configs      the content (sha256) of every file of the checkout its commands name
                 (`--config {repo}/jobs/configs/effects.yaml`): an edited config is another run
    data         the data's fingerprint: each prepared corpus's manifest fingerprint (variant, source bytes,
                 title join, rows: data/manifest.fingerprint) and the digest of the judgements scored and
                 trained on (sorted qid, docid, grade triples: the same judgements in any file layout)
    prepare      the prepare's digest: its command templates, the data fingerprint and every run file it made
    seed         the seed (None for an arm without training)

`digest` is a digest of all of them. The code a run executes is recorded beside the identity (`code_digest`),
never part of it: every commit to pipeline/ would otherwise make every finished run of a five-seed experiment
"not done"; instead every comparison names how many code versions its seeds were made by (record.tables), and
the page says so.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..data.identify import judgements_digest  # noqa: F401 (the judgements' digest, a data-layer fact)

IDENTITY_KEYS = ("definition", "vars", "configs", "data", "prepare", "seed")


def _sha(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_sha256(path: Path) -> str | None:
    from ..io_utils import sha256_file

    try:
        return sha256_file(path)[:16]
    except OSError:
        return None


def data_fingerprint(prep: Path, qrels: str, train_qrels: str) -> dict:
    """What the runs of a prepared dataset read: each corpus folder's manifest fingerprint and the digests of the
    scored (test) and training judgements."""
    from ..data.manifest import MANIFEST_NAME, fingerprint

    corpora = {}
    try:
        folders = sorted(p for p in prep.iterdir() if (p / MANIFEST_NAME).is_file())
    except OSError:
        folders = []
    for folder in folders:
        try:
            corpora[folder.name] = fingerprint(json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError):
            corpora[folder.name] = None
    return {"corpora": corpora, "qrels": judgements_digest(prep / qrels),
            "train_qrels": judgements_digest(prep / train_qrels)}


def prepare_digest(templates: list[list[str]], vars_: dict, data: dict, prep: Path) -> str:
    """The prepare's digest: its command templates and vars, the data it was made from and every run file it
    wrote at its top (a BM25 run: its hard negatives are part of what an arm trains on)."""
    try:
        runs = {p.name: file_sha256(p) for p in sorted(prep.glob("*.trec"))}
    except OSError:
        runs = {}
    return _sha({"prepare": templates, "vars": {k: str(v) for k, v in vars_.items()}, "data": data, "runs": runs})


def config_files(commands: list[list[str]], repo: str) -> dict[str, str | None]:
    """{path in {repo} terms: sha256} for every file of the checkout a command names (an argument, or the value
    of a `key=value` argument, that is a path under `repo`)."""
    out = {}
    for argv in commands:
        for arg in argv:
            value = arg.partition("=")[2] if "=" in arg and not arg.startswith("/") else arg
            if value.startswith(repo + "/"):
                path = Path(value)
                if path.is_file():
                    out[value.replace(repo + "/", "{repo}/", 1)] = file_sha256(path)
    return dict(sorted(out.items()))


def run_identity(definition: str, vars_: dict, configs: dict, data: dict, prepare: str, seed) -> dict:
    """A run's identity (see the module doc), with its digest."""
    parts = {"definition": definition, "vars": {k: str(v) for k, v in sorted(vars_.items())}, "configs": configs,
             "data": data, "prepare": prepare, "seed": seed}
    return {**parts, "digest": _sha(parts)}


def describe_difference(then: dict | None, now: dict) -> str:
    """What differs between a run's recorded identity and today's, in words ("made before runs recorded their
    identity" for a marker without one)."""
    if not isinstance(then, dict) or "digest" not in then:
        return "made before runs recorded their identity (the data, prepare and config files it read are unknown)"
    words = {"definition": "arm definitions", "vars": "vars", "configs": "config files its commands name",
             "data": "data (corpus or judgements)", "prepare": "prepare steps (their commands or the runs they made)",
             "seed": "seeds"}
    differ = [k for k in IDENTITY_KEYS if then.get(k) != now.get(k)]
    if not differ:
        return "another identity"
    out = []
    for k in differ:
        if k == "configs":
            a, b = then.get(k) or {}, now.get(k) or {}
            names = sorted(n for n in set(a) | set(b) if a.get(n) != b.get(n))
            out.append(f"{words[k]} ({', '.join(names)})")
        elif k == "vars":
            a, b = then.get(k) or {}, now.get(k) or {}
            out.append(f"{words[k]} (" + ", ".join(f"{n} {a.get(n)!r} then, {b.get(n)!r} now"
                                                  for n in sorted(set(a) | set(b)) if a.get(n) != b.get(n)) + ")")
        else:
            out.append(words[k])
    return "made with other " + "; ".join(out)
