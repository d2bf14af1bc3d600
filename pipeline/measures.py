"""ir-measures measure strings: parsing and validation (no metric is computed here).

`config.py` checks `eval.measures` with it when a config is loaded and `eval/metrics.py`
computes the measures it returns; both import this module, so neither imports the other.
Accepted: any ir-measures measure string (`AP nDCG@10 RR@10 R@1000 P@10 Judged@10`,
`nDCG(dcg='exp-log2')@10`, ...), trec_eval names (`map`, `ndcg_cut_10`, `P_10`) and the legacy
names MRR@k / MAP@k.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import ir_measures

from .errors import ConfigError

MEASURE_EXAMPLE = "AP nDCG@10 RR@10 R@1000 P@10 Judged@10"


def split_measures(spec: str | Iterable[str]) -> list[str]:
    """'AP nDCG@10, RR(rel=2, judged_only=True)@10' -> one string per measure.

    Measures are separated by whitespace or commas outside parentheses.
    """
    texts = [spec] if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for text in texts:
        depth, cur = 0, ""
        for ch in str(text):
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            if depth <= 0 and (ch.isspace() or ch == ","):
                if cur:
                    out.append(cur)
                cur = ""
                continue
            cur += ch
        if cur:
            out.append(cur)
    return out


def _parse_one(text: str) -> list:
    try:
        m = ir_measures.parse_measure(text)
        m.validate_params()  # unknown parameters: AP(foo=1)
        return [m]
    except Exception as first:  # NameError, ValueError, KeyError, AssertionError from ir-measures
        if re.fullmatch(r"[A-Za-z_]+([._]\d+)?", text):  # trec_eval's names: map, ndcg_cut_10, P.10
            try:
                return list(ir_measures.parse_trec_measure(text))
            except Exception:
                pass
        reason = str(first).split(";")[0] or type(first).__name__
        raise ConfigError(f"eval.measures: {text!r} is not an ir-measures measure ({reason}); "
                          f"examples: {MEASURE_EXAMPLE}") from None


def parse_measures(spec: str | Iterable[str], rel_level: int = 1) -> list:
    """Measure strings -> ir-measures measures (deduplicated, in order), validated.

    Raises ConfigError naming the first measure that cannot be parsed, has a cut-off
    that is not a positive integer, or that no installed ir-measures provider computes.
    """
    out: list = []
    for text in split_measures(spec):
        for m in _parse_one(text):
            cutoff = m.params.get("cutoff")
            if cutoff is not None and (not isinstance(cutoff, int) or isinstance(cutoff, bool) or cutoff < 1):
                raise ConfigError(f"eval.measures: {text!r}: the cut-off must be a positive integer")
            if rel_level != 1 and "rel" in m.SUPPORTED_PARAMS and "rel" not in m.params:
                m = m(rel=rel_level)
            if not ir_measures.DefaultPipeline.supports(m):
                raise ConfigError(f"eval.measures: {text!r}: no installed ir-measures provider computes {m}")
            if m not in out:
                out.append(m)
    if not out:
        raise ConfigError(f"eval.measures: no measure given; examples: {MEASURE_EXAMPLE}")
    return out


def measure_name(name: str, rel_level: int = 1) -> str:
    """The reported name of one measure string: 'MRR@10' -> 'RR@10', 'MAP@100' -> 'AP@100'.

    For callers that look a value up by a configured name (training validation's `metric`).
    """
    ms = parse_measures(name, rel_level)
    if len(ms) != 1:
        raise ConfigError(f"{name!r} names {len(ms)} measures, expected one")
    return str(ms[0])
