"""Readable tables (plain text and markdown) for metrics, and comparison across runs."""

from __future__ import annotations

from ..data.manifest import check_comparable


def render_table(header: list[str], rows: list[list[str]], markdown: bool = False) -> str:
    """Cells (strings) -> an aligned plain-text table (first column left, others right) or markdown."""
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = lambda r: "  ".join(str(x).ljust(w) if i == 0 else str(x).rjust(w) for i, (x, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def format_table(rows: dict[str, dict[str, float]], markdown: bool = False, digits: int = 4) -> str:
    """rows: label -> {metric: value}. Columns are the union of metrics, in first-seen order."""
    cols: list[str] = []
    for metrics in rows.values():
        for m in metrics:
            if m not in cols:
                cols.append(m)
    header = ["run"] + cols
    body = [[label] + [f"{metrics[c]:.{digits}f}" if c in metrics else "-" for c in cols]
            for label, metrics in rows.items()]
    return render_table(header, body, markdown)


def comparison_table(results: dict[str, dict], allow_mixed: bool = False, markdown: bool = False) -> str:
    """results: label -> {"metrics": {...}, "corpus": {"fingerprint", "variant", ...}}.

    Refuses rows from different corpora unless `allow_mixed`, and then prints the warning above the table.
    """
    warning = check_comparable({k: v.get("corpus", {}) for k, v in results.items()}, allow_mixed)
    table = format_table({k: v["metrics"] for k, v in results.items()}, markdown=markdown)
    return f"{warning}\n\n{table}" if warning else table
