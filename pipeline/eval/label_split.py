"""Test judgements split by what training saw: DAR's "labeled" and "unlabeled" documents.

DAR (Jeong et al., 2022) claims its gain comes from documents that no training pair names. Given a
training set, every judged-relevant test document is either *labeled* (it is the positive of some
training example) or *unlabeled* (no training example names it as its positive). A run is then scored
on each part separately:

- the part's qrels are the test judgements of its documents only (a query with no judged-relevant
  document in the part is not scored on it);
- the other part's relevant documents of a query are taken out of that query's ranking, so they count
  neither as hits nor as misses (otherwise a labeled document ranked first would push every unlabeled one
  down and count as a non-relevant result in the unlabeled score). Non-relevant documents stay.

The training set is an examples folder the trainer wrote (`<run>/examples`, the ids form: its positives
are passages of the corpus) or a qrels file (every document judged at `rel_level` or above is labeled).
Hard negatives are not labels: a document named only as a negative is unlabeled.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import PipelineError

PARTS = ("labeled", "unlabeled")


def labeled_documents(source: str | Path, rel_level: int = 1) -> tuple[set[str], str]:
    """(the documents some training pair names as its positive, a description of where they came from)."""
    source = Path(source)
    if source.is_dir():
        import json

        meta_path = source / "examples.json"
        if not meta_path.is_file():
            raise PipelineError(f"{source}: not a training examples folder (no examples.json); give the examples "
                                "folder a training run wrote (<run>/examples) or the training qrels file")
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        return _positives_of_examples(source, meta), f"positives of the {meta.get('examples', '?'):,} examples in {source}"
    from ..data.readers import load_qrels

    qrels = load_qrels(source)
    docs = {d for judged in qrels.values() for d, r in judged.items() if r >= rel_level}
    return docs, f"documents judged >= {rel_level} in {source}"


def _positives_of_examples(folder: Path, meta: dict) -> set[str]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from ..data.examples_store import PASSAGES_FILE

    parts = sorted(folder.glob("part-*.parquet"))
    if not parts:
        raise PipelineError(f"{folder}: no examples (part-*.parquet)")
    if "positive_row" not in pq.read_schema(parts[0]).names:
        raise PipelineError(f"{folder}: these examples carry texts, not passage ids (source "
                            f"{meta.get('source')}); give the training qrels file instead")
    rows = pa.concat_arrays([pq.read_table(p, columns=["positive_row"])["positive_row"].combine_chunks()
                             for p in parts])
    with pa.memory_map(str(folder / PASSAGES_FILE)) as src:
        pids = pa.ipc.open_file(src).read_all()["pid"]
        return set(pc.take(pids, pc.unique(rows)).to_pylist())


def split_judgements(qrels: dict[str, dict[str, int]], labeled: set[str], rel_level: int = 1
                     ) -> dict[str, dict[str, dict[str, int]]]:
    """{"labeled": qrels, "unlabeled": qrels}: each query's judgements of relevant documents in that part, plus
    its non-relevant judgements (grade < rel_level) in both; a query without a relevant document in a part
    is left out of it."""
    out = {p: {} for p in PARTS}
    for q, judged in qrels.items():
        negatives = {d: r for d, r in judged.items() if r < rel_level}
        for part in PARTS:
            rel = {d: r for d, r in judged.items() if r >= rel_level and ((d in labeled) == (part == "labeled"))}
            if rel:
                out[part][q] = {**negatives, **rel}
    return out


def part_run(run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]], part_qrels: dict[str, dict[str, int]],
             rel_level: int = 1) -> dict[str, dict[str, float]]:
    """The run restricted to `part_qrels`' queries, each ranking without the query's relevant documents of the
    other part (they count neither as hits nor as misses)."""
    out = {}
    for q, judged in part_qrels.items():
        if q not in run:
            continue
        other = {d for d, r in qrels[q].items() if r >= rel_level and d not in judged}
        out[q] = {d: s for d, s in run[q].items() if d not in other}
    return out


def evaluate_parts(run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]], labeled: set[str], cfg,
                   measures=None) -> dict[str, dict]:
    """`evaluate_run` on each part: {"labeled": result, "unlabeled": result}, each with `judgements` (the
    part's relevant judgements) and `queries`."""
    from .metrics import evaluate_run

    rel_level = cfg.rel_level
    out = {}
    for part, pq_ in split_judgements(qrels, labeled, rel_level).items():
        n_rel = sum(1 for judged in pq_.values() for r in judged.values() if r >= rel_level)
        pr = part_run(run, qrels, pq_, rel_level)
        if not pq_ or not any(pr.values()):  # no judged query, or none the run ranks a document of this part for
            out[part] = {"metrics": {}, "judgements": n_rel, "queries": {"judged": len(pq_), "evaluated": 0}}
            continue
        res = evaluate_run(pr, pq_, cfg, measures, run_name=f"the run ({part} part)", qrels_name=f"the {part} part")
        res["judgements"] = n_rel
        out[part] = res
    return out
