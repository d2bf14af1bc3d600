"""An effects experiment, as data: the `experiment:` block of a matrix file (repro/effects.yaml).

    experiment:
      datasets: [nfcorpus, scifact-train]      # instantiated once per dataset (each a dataset of the matrix)
      seeds: [0, 1, 2, 3, 4]                   # every trained arm runs every seed
      metric: nDCG@10                          # scored per query on the test judgements
      qrels: corpus/qrels/test.trec            # under {prep}: the judgements scored (the test split)
      train_qrels: corpus/qrels/train.trec     # under {prep}: what "labeled" documents are drawn from
      vars: {model: minilm, epochs: 1, ...}    # placeholders, changeable with --set NAME=VALUE
      prepare: [command, ...]                  # once per dataset: {data} {prep} {repo} + vars
      train: command                           # a trained arm's training: {prep} {run} {seed} {repo} + vars,
                                               # followed by the arm's own overrides
      evaluate: [command, ...]                 # every arm and seed: {prep} {run} {model_path} + vars
      arms:
        - {id: zero-shot, title: ..., train: null}            # no training: one run, no seed
        - {id: dar, title: ..., train: [loss.name=dar, ...], model_path: "{run}/model/model"}
      comparisons:
        - {id: dar-vs-dpr, method: dar, baseline: dpr, direction: +1, claim: ..., source: ...}

Commands are split into arguments once, here, and each argument's placeholders are filled afterwards,
so a path with spaces or quotes stays one argument. Each comparison becomes a cell of the matrix
(`<family>-<dataset>-<comparison>`), whose figure is the difference to its baseline.
"""

from __future__ import annotations

import shlex
import string
from dataclasses import dataclass

from ..errors import ConfigError

EXPERIMENT_KEYS = {"datasets", "seeds", "metric", "qrels", "train_qrels", "vars", "prepare", "train", "evaluate",
                   "arms", "comparisons"}
ARM_KEYS = {"id", "title", "train", "model_path", "notes"}
COMPARISON_KEYS = {"id", "method", "baseline", "direction", "claim", "source", "published_difference", "notes"}
RUN_PLACEHOLDERS = {"data", "prep", "run", "seed", "repo", "model_path"}


def split_command(template: str, where: str) -> list[str]:
    """A command template as its arguments (split once; placeholders are filled per argument later)."""
    try:
        argv = shlex.split(template)
    except ValueError as e:
        raise ConfigError(f"{where}: command {template!r} cannot be split into arguments ({e})") from None
    if not argv or argv[0] != "pipeline":
        raise ConfigError(f"{where}: every command is a `pipeline ...` command line, got {template!r}")
    return argv


def fill(argv: list[str], values: dict) -> list[str]:
    """Each argument's {placeholders} filled; values are never split again."""
    return [a.format(**values) for a in argv]


def _fields(argv: list[str]) -> set[str]:
    return {f.split(".")[0].split("[")[0] for a in argv for _, f, _, _ in string.Formatter().parse(a) if f}


@dataclass
class Arm:
    id: str
    title: str
    train: list[str] | None            # the arm's overrides after the experiment's train command; None: no training
    model_path: str = "{run}/model/model"
    notes: str = ""

    @property
    def seeded(self) -> bool:
        return self.train is not None


@dataclass
class Comparison:
    id: str
    method: str
    baseline: str
    direction: int
    claim: str
    source: str
    published_difference: float | None = None
    notes: str = ""


@dataclass
class Experiment:
    family: str
    datasets: list[str]
    seeds: list[int]
    metric: str
    qrels: str
    train_qrels: str
    vars: dict
    prepare: list[list[str]]
    train: list[str]
    evaluate: list[list[str]]
    arms: dict[str, Arm]
    comparisons: dict[str, Comparison]

    def cell_id(self, dataset: str, comparison: str) -> str:
        return f"{self.family}-{dataset}-{comparison}"

    def arm_commands(self, arm: Arm) -> list[list[str]]:
        """The arm's commands as argument templates (its training, if any, then the evaluation)."""
        out = []
        if arm.train is not None:
            out.append(self.train + list(arm.train))
        out += [list(c) for c in self.evaluate]
        return out

    def display(self, argv: list[str]) -> str:
        """A command as a reader pastes it: quoted only where an argument needs it ({placeholders} are not)."""
        return " ".join(a if a and not any(ch.isspace() or ch in "'\"\\$`;&|<>*?!" for ch in a) else shlex.quote(a)
                        for a in argv)


def load_experiment(raw: dict, family: str, where: str, datasets: dict) -> Experiment:
    """The `experiment:` block, checked (keys, datasets, arms named by comparisons, placeholders)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: experiment must be a mapping")
    unknown = set(raw) - EXPERIMENT_KEYS
    if unknown:
        raise ConfigError(f"{where}: experiment: unknown key(s) {', '.join(sorted(unknown))}; known: "
                          + ", ".join(sorted(EXPERIMENT_KEYS)))
    for k in ("datasets", "seeds", "metric", "qrels", "train_qrels", "prepare", "train", "evaluate", "arms",
              "comparisons"):
        if k not in raw:
            raise ConfigError(f"{where}: experiment: missing {k}")
    for d in raw["datasets"]:
        if d not in datasets:
            raise ConfigError(f"{where}: experiment: dataset {d!r} is not described in any matrix file")
    seeds = raw["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds) \
            or len(set(seeds)) != len(seeds):
        raise ConfigError(f"{where}: experiment: seeds must be a list of distinct integers >= 0")
    vars_ = {str(k): v for k, v in (raw.get("vars") or {}).items()}
    bad = set(vars_) & RUN_PLACEHOLDERS
    if bad:
        raise ConfigError(f"{where}: experiment: vars may not be named {', '.join(sorted(bad))} (placeholders)")
    known = RUN_PLACEHOLDERS | set(vars_)

    def cmd(template, what: str) -> list[str]:
        if not isinstance(template, str):
            raise ConfigError(f"{where}: experiment: {what} must be a command line, got {template!r}")
        argv = split_command(template, f"{where}: experiment: {what}")
        extra = _fields(argv) - known
        if extra:
            raise ConfigError(f"{where}: experiment: {what} names {', '.join(sorted(extra))}, which is neither a "
                              "placeholder ({" + "}, {".join(sorted(RUN_PLACEHOLDERS)) + "}) nor a var")
        return argv

    prepare = [cmd(c, f"prepare[{i}]") for i, c in enumerate(raw["prepare"] or [])]
    train = cmd(raw["train"], "train")
    evaluate = [cmd(c, f"evaluate[{i}]") for i, c in enumerate(raw["evaluate"] or [])]
    arms: dict[str, Arm] = {}
    for i, a in enumerate(raw["arms"] or []):
        w = f"{where}: experiment: arms[{i}]"
        if not isinstance(a, dict) or not {"id", "title"} <= set(a) or set(a) - ARM_KEYS:
            raise ConfigError(f"{w}: an arm has id, title, train (overrides, or null for no training), and optionally "
                              f"model_path and notes")
        if a["id"] in arms:
            raise ConfigError(f"{w}: arm {a['id']} is defined twice")
        tr = a.get("train")
        if tr is not None:
            if not isinstance(tr, list) or not all(isinstance(x, str) and "=" in x for x in tr):
                raise ConfigError(f"{w}: train is a list of key=value overrides (or null)")
            extra = _fields(tr) - known
            if extra:
                raise ConfigError(f"{w}: train names {', '.join(sorted(extra))}, neither a placeholder nor a var")
        arms[a["id"]] = Arm(id=str(a["id"]), title=str(a["title"]), train=list(tr) if tr is not None else None,
                            model_path=str(a.get("model_path") or ("{run}/model/model" if tr is not None
                                                                   else "{model}")), notes=str(a.get("notes", "")))
    comparisons: dict[str, Comparison] = {}
    for i, c in enumerate(raw["comparisons"] or []):
        w = f"{where}: experiment: comparisons[{i}]"
        if not isinstance(c, dict) or set(c) - COMPARISON_KEYS or not {"id", "method", "baseline", "direction",
                                                                         "claim", "source"} <= set(c):
            raise ConfigError(f"{w}: a comparison has id, method, baseline, direction (+1 or -1), claim and source")
        for role in ("method", "baseline"):
            if c[role] not in arms:
                raise ConfigError(f"{w}: {role} {c[role]!r} is not an arm of the experiment")
        if c["method"] == c["baseline"]:
            raise ConfigError(f"{w}: a method is compared with another arm, not itself")
        if c["direction"] not in (1, -1):
            raise ConfigError(f"{w}: direction is +1 (the paper claims a gain) or -1 (a loss)")
        if not arms[c["method"]].seeded:
            raise ConfigError(f"{w}: the method arm {c['method']} has no training (its seeds would all be one run)")
        if c["id"] in comparisons:
            raise ConfigError(f"{w}: comparison {c['id']} is defined twice")
        comparisons[c["id"]] = Comparison(id=str(c["id"]), method=c["method"], baseline=c["baseline"],
                                          direction=int(c["direction"]), claim=str(c["claim"]), source=str(c["source"]),
                                          published_difference=c.get("published_difference"),
                                          notes=str(c.get("notes", "")))
    return Experiment(family=family, datasets=list(raw["datasets"]), seeds=list(seeds), metric=str(raw["metric"]),
                      qrels=str(raw["qrels"]), train_qrels=str(raw["train_qrels"]), vars=vars_, prepare=prepare,
                      train=train, evaluate=evaluate, arms=arms, comparisons=comparisons)
