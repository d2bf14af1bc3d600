"""Hybrid search: runs fused into one (`pipeline fuse RUN RUN ... --out RUN`), with pyserini's definitions
(pyserini.fusion and trectools.TrecRun), so the fused run's figures are pyserini's on the same runs:

- reciprocal rank fusion (`rrf`, Cormack et al. 2009): each run's document scores 1 / (k + rank), k = 60, the
  rank as the run file writes it (pyserini's; `resort`: ranked again by score, ties in file order, as its
  `--resort`); summed over the runs;
- interpolation (`interpolate`): each run's scores min-max normalised per query ((s - min) / (max - min), 1
  where every score of the query is equal: pyserini's `normalize` rescoring), multiplied by its weight and
  summed; `normalize=False` sums the raw scores times the weights, which for two runs and weights (α, 1 - α) is
  pyserini's `interpolation`;
- `average`: the raw scores times 1 / (number of runs), summed (pyserini's `average`).

Every method reads the first `depth` lines of each query in each run (file order, 1000 by default, as
pyserini's command line), counts a document a run does not hold as 0 there, sorts by the fused score (higher
first) and then by docid (ascending, pyserini's tie rule), and keeps the first `k` of each query (1000).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError, InputError

METHODS = ("rrf", "interpolate", "average")


def read_ranked(path: str | Path, depth: int | None, resort: bool = False) -> dict[str, list[tuple[str, int, float]]]:
    """{qid: [(docid, rank, score), ...]} in file order (the first `depth` of each query); a document named twice
    for one query is refused (file, line): a fused score would count it twice."""
    from ..data.readers import read_run_file

    out: dict[str, list] = {}
    seen: dict[str, set] = {}
    for r in read_run_file(path):
        docs = seen.setdefault(r["qid"], set())
        if r["docid"] in docs:
            raise InputError(path, r["line"], f"document {r['docid']!r} is ranked twice for query {r['qid']!r}")
        docs.add(r["docid"])
        out.setdefault(r["qid"], []).append((r["docid"], r["rank"], r["score"]))
    if not out:
        raise InputError(path, None, "an empty run: nothing to fuse")
    for qid, rows in out.items():
        if resort:  # pyserini's --resort: by score, higher first, ties in file order; ranks 1, 2, ...
            rows = sorted(rows, key=lambda x: -x[2])
            rows = [(d, i, s) for i, (d, _, s) in enumerate(rows, 1)]
        out[qid] = rows[:depth] if depth else rows
    return out


def _normalised(rows: list[tuple[str, int, float]]) -> list[tuple[str, float]]:
    scores = [s for _, _, s in rows]
    lo, hi = min(scores), max(scores)
    if hi - lo == 0:
        return [(d, 1.0) for d, _, _ in rows]
    return [(d, (s - lo) / (hi - lo)) for d, _, s in rows]


def fuse(runs: list[dict], method: str = "rrf", rrf_k: int = 60, weights: list[float] | None = None,
         normalize: bool = True, k: int | None = 1000) -> dict[str, list[tuple[str, float]]]:
    """The fused ranking {qid: [(docid, score), ...]} of `runs` (each as `read_ranked` gives it)."""
    if method not in METHODS:
        raise ConfigError(f"--method {method}: one of {', '.join(METHODS)}")
    if len(runs) < 2:
        raise ConfigError("fusion needs at least two runs")
    if method == "interpolate":
        weights = list(weights) if weights else [1.0 / len(runs)] * len(runs)
        if len(weights) != len(runs):
            raise ConfigError(f"--weights: {len(weights)} weights for {len(runs)} runs (one a run, in their order)")
    out = {}
    for qid in sorted(set().union(*runs)):
        total: dict[str, float] = {}
        for i, run in enumerate(runs):
            rows = run.get(qid)
            if not rows:
                continue
            if method == "rrf":
                scored = [(d, 1.0 / (rrf_k + rank)) for d, rank, _ in rows]
            elif method == "average":
                scored = [(d, s * (1.0 / len(runs))) for d, _, s in rows]
            else:
                base = _normalised(rows) if normalize else [(d, s) for d, _, s in rows]
                scored = [(d, s * weights[i]) for d, s in base]
            for d, s in scored:
                total[d] = total.get(d, 0.0) + s
        ranked = sorted(total.items(), key=lambda x: (-x[1], x[0]))
        out[qid] = ranked[:k] if k else ranked
    return out


def inputs_meta(paths: list) -> dict:
    """What the fused run's <run>.meta.json says of its corpus: the inputs' corpus fingerprint when they agree
    (so `compare` checks the fused run against the others as any run), else none."""
    import json

    corpora = set()
    for path in paths:
        try:
            meta = json.loads(Path(str(path) + ".meta.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            meta = {}
        corpora.add(meta.get("corpus_fingerprint") if isinstance(meta, dict) else None)
    if len(corpora) > 1 and None not in corpora:
        raise ConfigError(f"the runs rank passages of different corpora (fingerprints {', '.join(sorted(corpora))}): "
                          "a fused score would add up documents that are not the same")
    return {"corpus_fingerprint": corpora.pop()} if len(corpora) == 1 and None not in corpora else {}


def write_fused(fused: dict[str, list[tuple[str, float]]], path: str | Path, tag: str, overwrite: bool,
                meta: dict) -> int:
    """The fused run as a TREC run (ranks 1, 2, ...; scores to 9 significant digits) and its <run>.meta.json,
    written atomically: a path holding anything else than a run this tool wrote is refused, one it wrote needs
    `overwrite`."""
    from ..io_utils import atomic_path, check_output, write_json_atomic

    check_output(path, "run", overwrite=overwrite)
    lines = 0
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            for qid, rows in fused.items():
                f.write("".join(f"{qid} Q0 {d} {r} {s:.9g} {tag}\n" for r, (d, s) in enumerate(rows, 1)))
                lines += len(rows)
    write_json_atomic(str(path) + ".meta.json", {**meta, "n_queries": len(fused), "top_k": meta.get("k")})
    return lines
