"""A figure the manual quotes comes from one place. Every retrieval-quality figure README.md or a page of
docs/ quotes (docs/reproductions.md is left out: `pipeline reproduce report` writes it from the records)
is either held by a result file the passage names, or stated as a past measurement with its date and
machine, or attributed to its publisher; and every test file, module or test a page names exists.

What the scan recognises
------------------------
Blocks. A page is cut into blocks: a paragraph (its wrapped lines joined), a list item (a line opening
with `- `, `* ` or `1. ` starts one; its continuation lines belong to it), a heading, a table row, and each
line of a fenced code block. A table's header row and the paragraph directly above the table (its
caption) belong to every row of it.

Metric names. `nDCG@k` (`NDCG@k`), `RR@k`, `MRR` (`MRR@k`), `R@k`, `P@k`, `AP` (`AP@k`), `MAP` (`MAP@k`),
`Recall@k`, `Success@k`, `Acc@k`, `top-k`, `Spearman`, `Pearson`, `accuracy`.

Figures, in a block that names a metric (inline code spans are not read for figures: they hold config
values and commands):
  - every number written with 3 or 4 decimals in [0, 1]: `0.881`, `0.8813`, `1.000`;
  - a number with 2 decimals standing right after a metric name (`nDCG@10 0.88`, `nDCG@10 of 0.88`,
    `MAP = 0.87`, `R@8: 0.69`, `RR@10 is 0.33`) or right before one (`0.87 MAP`);
  - in a table row, every number with 2 to 4 decimals in a cell whose column header names a metric.
Not figures: a number with a sign (`+0.018`, `-0.009`, `−0.009`, `±0.003`: a difference or a tolerance;
a hyphen right after a digit is a range, `0.88-0.89`, and its second number is a figure), one after `>=`,
`>`, `<=`, `<`, `≥`, `≤` or `within` (a threshold), one with 5 or more decimals (`0.99996`: a cosine, not a
quality figure).

Where a figure may come from (one of; "the block" includes a row's table header and caption):
  1. a result file the block names: `repro/results/NAME.json` (what `pipeline reproduce run --record` and
     `reproduce record` write, each with its date, commit and machine) or `bench/results/NAME` (a
     benchmark's output). It must exist and hold a number that, rounded to the figure's decimals, is the
     figure. A JSON file holds every number in it except those under the keys `expected` and `tolerance`
     (what a record was judged against, not what it measured) and `per_query` (an effects record's
     per-query values: the inputs its figures are computed from; thousands of them would hold almost any
     figure); any other file every decimal written in it.
  2. a past measurement with no result file, marked in the block as
     `(measured YYYY-MM-DD, MACHINE, not a recorded result)` (`YYYY-MM` where the day was not kept).
  3. a figure someone else published, marked in the block as `(published: SOURCE)`.
A figure matched by none of them fails the test with its page and line; so does a cited result file that
does not exist, and a marker that is not in the recognised form.

References (README.md, DESIGN.md, docs/*.md): see `reference_problems`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "reproductions.md")
REF_PAGES = [ROOT / "README.md", ROOT / "DESIGN.md"] + sorted((ROOT / "docs").glob("*.md"))

METRIC = re.compile(r"(?<![\w@.-])(?:(?:nDCG|NDCG|MRR|RR|AP|MAP|R|P|Recall|Success|Acc)@\d+|MRR|MAP|AP|top-\d+"
                    r"|Spearman|Pearson|[Aa]ccuracy)(?![\w@])")
NUMBER = re.compile(r"(?<![\w.])([01]\.\d{2,4})(?!\d)(?!\.\d)")
THRESHOLD = re.compile(r"(?:>=|<=|[<>≤≥]|\bwithin)\s*$")
FIG34 = re.compile(r"^(?:0\.\d{3,4}|1\.0{3,4})$")
FIG2 = re.compile(r"^(?:0\.\d{2}|1\.00)$")
LEAD = re.compile(r"\s+(?:of\s+|is\s+|=\s*|:\s*)?$|\s*[=:]\s*$")
METRIC_AT_END = re.compile(METRIC.pattern + r"$")
MEASURED = re.compile(r"\(measured (\d{4}-\d{2}(?:-\d{2})?), ([^()]+?), not a recorded result\)")
PUBLISHED = re.compile(r"\(published: [^()]+\)")
CITED = re.compile(r"(?<![\w/.-])(repro/results/[\w.-]+\.json|bench/results/[\w.-]+\.\w+)(?!\w)")
CODE = re.compile(r"`[^`]*`")
SEPARATOR = re.compile(r"^\|[\s:|-]+\|$")


class Block:
    """A unit of a page: its kind (para, item, heading, code, header, row), first line and text, and for a
    table row its cells and its table's header and caption."""

    def __init__(self, kind: str, line: int, text: str, cells: list[str] | None = None,
                 header: list[str] | None = None, caption: str = ""):
        self.kind, self.line, self.text = kind, line, text
        self.cells, self.header, self.caption = cells, header, caption

    @property
    def context(self) -> str:
        """Where markers and citations are read: the block, and for a row its table's header and caption."""
        return " ".join([self.text, " | ".join(self.header or []), self.caption])


def blocks(text: str) -> list[Block]:
    out: list[Block] = []
    lines = text.splitlines()
    buf: list[str] = []
    kind, start, in_code = "para", 0, False
    header: list[str] | None = None
    caption = ""

    def flush():
        nonlocal buf
        if buf:
            out.append(Block(kind, start, " ".join(s.strip() for s in buf)))
            buf = []

    for n, line in enumerate(lines, 1):
        s = line.strip()
        if s.startswith("```"):
            flush()
            in_code = not in_code
            continue
        if in_code:
            out.append(Block("code", n, line))
            continue
        if s.startswith("|"):
            flush()
            if SEPARATOR.match(s):
                continue
            cells = [c.strip() for c in s.strip("|").split("|")]
            if n < len(lines) and SEPARATOR.match(lines[n].strip()):  # a header row: a new table
                prev = out[-1] if out else None
                caption = prev.text if prev is not None and prev.kind == "para" else ""
                header = cells
                out.append(Block("header", n, s))
            else:
                out.append(Block("row", n, s, cells, header, caption))
            continue
        header, caption = None, ""
        if not s:
            flush()
        elif s.startswith("#"):
            flush()
            out.append(Block("heading", n, s))
        else:
            if re.match(r"([-*]|\d+\.)\s", s):
                flush()
                kind = "item"
            elif not buf:
                kind = "para"
            if not buf:
                start = n
            buf.append(line)
    flush()
    return out


def _numbers(text: str):
    """(number as written, text before it) for every 2-4-decimal number in [0, 1] of `text` that is neither
    signed (a difference, a tolerance) nor a threshold."""
    for m in NUMBER.finditer(text):
        before = text[:m.start()]
        if before.endswith(("+", "±", "−")) or (before.endswith("-") and not before[-2:-1].isdigit()):
            continue
        if THRESHOLD.search(before):
            continue
        yield m.group(1), before, text[m.end():]


def figures(block: Block) -> list[str]:
    """The quality figures `block` quotes, as written (see the module docstring)."""
    text = CODE.sub(" ", block.text)
    found: list[str] = []
    if METRIC.search(text):
        for fig, before, after in _numbers(text):
            if FIG34.match(fig):
                found.append(fig)
            elif FIG2.match(fig):
                lead = LEAD.search(before)
                if (lead is not None and METRIC_AT_END.search(before[:lead.start()])) \
                        or (after[:1] == " " and METRIC.match(after[1:])):
                    found.append(fig)
    if block.cells is not None and block.header:
        for head, cell in zip(block.header, block.cells):
            if METRIC.search(head):
                found += [fig for fig, _, _ in _numbers(CODE.sub(" ", cell)) if FIG34.match(fig) or FIG2.match(fig)]
    return list(dict.fromkeys(found))


def _numbers_in(obj, key: str | None = None):
    if key in ("expected", "tolerance", "per_query"):
        return
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        yield float(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _numbers_in(v, k)
    elif isinstance(obj, list):
        for v in obj:
            yield from _numbers_in(v, key)


_HELD: dict[Path, list[float]] = {}


def held(path: Path) -> list[float]:
    """The numbers a result file holds (see the module docstring)."""
    if path not in _HELD:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            _HELD[path] = list(_numbers_in(json.loads(text)))
        else:
            _HELD[path] = [float(x) for x in re.findall(r"(?<![\w.])\d+\.\d+(?![\d.])", text)]
    return _HELD[path]


def _rounds_to(value: float, figure: str) -> bool:
    decimals = len(figure.split(".")[1])
    return f"{value:.{decimals}f}" == figure


def problems(page: Path, root: Path = ROOT) -> list[str]:
    """Every figure of `page` that comes from nowhere, every cited result file that is missing and every
    malformed marker, as 'page:line: why'."""
    bad = []
    name = page.relative_to(root) if page.is_relative_to(root) else page
    for b in blocks(page.read_text(encoding="utf-8")):
        where = f"{name}:{b.line}"
        ctx = b.context
        for m in re.finditer(r"not a recorded result", b.text):
            if not any(mm.start() <= m.start() < mm.end() for mm in MEASURED.finditer(b.text)):
                bad.append(f"{where}: a past-measurement marker not in the form "
                           "'(measured YYYY-MM-DD, MACHINE, not a recorded result)'")
        cited = []
        for c in dict.fromkeys(CITED.findall(ctx)):
            if not (root / c).is_file():
                bad.append(f"{where}: cites {c}, which is not in the repository")
            else:
                cited.append(root / c)
        marked = MEASURED.search(ctx) or PUBLISHED.search(ctx)
        for fig in figures(b):
            if marked:
                continue
            if any(_rounds_to(v, fig) for f in cited for v in held(f)):
                continue
            bad.append(f"{where}: {fig} is in no result file the passage names "
                       + (f"({', '.join(str(f.relative_to(root)) for f in cited)})" if cited else "(it names none)")
                       + " and is not marked '(measured DATE, MACHINE, not a recorded result)' or "
                       "'(published: SOURCE)'")
    return bad


def test_every_quality_figure_comes_from_a_result_file_or_is_marked():
    bad = [p for page in PAGES for p in problems(page)]
    assert not bad, "figures the manual quotes from nowhere:\n" + "\n".join(bad)


def test_the_scan_sees_the_pages_figures():
    """A scan that recognised nothing would pass everything: the shipped pages quote figures."""
    counted = {p.name: sum(len(figures(b)) for b in blocks(p.read_text(encoding="utf-8"))) for p in PAGES}
    assert sum(counted.values()) > 50 and counted["performance.md"] > 10 and counted["rcl.md"] > 10, counted


def test_the_forms_recognised():
    def figs(text):
        return [f for b in blocks(text) for f in figures(b)]

    assert figs("The FAQ gives nDCG@10 0.8813 zero-shot.") == ["0.8813"]
    assert figs("a test figure of 0.8813 nDCG@10 here") == ["0.8813"]
    assert figs("nDCG@10 of 0.88 on the FAQ") == ["0.88"]
    assert figs("MAP = 0.87, and 0.69 R@8") == ["0.87", "0.69"]
    assert figs("RR@10 0.8661 / 0.8683; nDCG@10 0.8815 vs 0.8834") == ["0.8661", "0.8683", "0.8815", "0.8834"]
    # wrapped lines are one paragraph; a list item is its own block
    assert figs("- asserts the same nDCG@10 (the FAQ gives\n  0.8813 both ways).\n- next 0.8812") == ["0.8813"]
    assert figs("| model | R@8 | MRR |\n|---|---|---|\n| CL | 0.70 (n=1) | 0.635 |") == ["0.70", "0.635"]
    # not figures: differences, tolerances, thresholds, 5-decimal cosines, 2 decimals away from a metric,
    # config values in code, and any number in a block that names no metric
    assert figs("nDCG@10 +0.018, −0.009, ±0.003, within 0.002, cosine >= 0.9999, min 0.99996") == []
    assert figs("nDCG@10 rose; τ 0.05 and lr 0.01") == []
    assert figs("nDCG@10 with `train.lr=0.0001`") == []
    assert figs("cosine 0.994 and loss 0.8813") == []


def test_a_figure_must_be_held_by_the_file_it_cites_or_be_marked(tmp_path):
    (tmp_path / "repro" / "results").mkdir(parents=True)
    (tmp_path / "repro" / "results" / "x.json").write_text(json.dumps(
        {"got": 0.88134, "expected": 0.8907, "metric": "nDCG@10"}))
    page = tmp_path / "page.md"

    def check(text):
        page.write_text(text)
        return problems(page, root=tmp_path)

    assert check("nDCG@10 0.8813 (`repro/results/x.json`).") == []
    assert check("nDCG@10 0.881 (`repro/results/x.json`).") == []  # rounded to the quoted precision
    assert check("nDCG@10 0.8814 (`repro/results/x.json`).")  # not what it holds
    assert check("nDCG@10 0.8907 (`repro/results/x.json`).")  # its expected figure is not a measurement
    (tmp_path / "repro" / "results" / "e.json").write_text(json.dumps(
        {"arms": {"dpr": {"seeds": {"0": {"all": 0.3116, "per_query": {"all": [0.5, 0.25, 0.7654]}}}}}}))
    assert check("nDCG@10 0.3116 (`repro/results/e.json`).") == []
    assert check("nDCG@10 0.7654 (`repro/results/e.json`).")  # one query's value is not a quoted figure
    assert check("nDCG@10 0.8813, held somewhere.")  # a held figure must name its file
    assert check("nDCG@10 0.8813 (`repro/results/gone.json`).")  # a cited file that is not there
    assert check("nDCG@10 0.8907 (measured 2026-11-27, AMD EPYC, not a recorded result).") == []
    assert check("nDCG@10 0.8907 (measured 2026-11, a 2-core CPU, not a recorded result).") == []
    assert check("nDCG@10 0.8907 (measured in November, not a recorded result).")  # malformed marker
    assert check("MTEB gives nDCG@10 0.3159 (published: MTEB v1, NFCorpus).") == []
    # a table's caption covers its rows
    assert check("Measured once (measured 2026-11, a 2-core CPU, not a recorded result):\n\n"
                 "| model | R@8 |\n|---|---|\n| CL | 0.696 |\n") == []
    assert check("Measured once:\n\n| model | R@8 |\n|---|---|\n| CL | 0.696 |\n")


# ---- every test file, module and test a page names exists ----

ROOTS = ("tests", "pipeline", "bench", "jobs", "scripts")
FULL = re.compile(r"(?<![\w/.-])((?:%s)/[\w/.-]*?\w\.py)(?!\w)(?:::(\w+))?" % "|".join(ROOTS))
BARE = re.compile(r"(?<![\w/.-])(test_\w+\.py)(?!\w)(?:::(\w+))?")
RELATIVE = re.compile(r"`(\w+/[\w/]*\w\.py)(?:::\w+)?`")
TEST_NAME = re.compile(r"`(?:[\w/]*test_\w+\.py::)?(test_\w+)`")


def _defines(path: Path, name: str) -> bool:
    return re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b", path.read_text(encoding="utf-8"), re.M) is not None


def reference_problems(pages: list[Path], root: Path = ROOT) -> list[str]:
    """What `pages` name that is not there. `tests/…py`, `pipeline/…py`, `bench/…py`, `jobs/…py` and
    `scripts/…py` paths exist; a bare `test_x.py` is a file under tests/; a path relative to the package in
    backticks (`data/ingest.py`) is a module under pipeline/; `FILE.py::name` names a test or class FILE
    defines; a bare `test_name` in backticks is defined in the test file named before it on its line or, with
    none, in some file under tests/."""
    tests: dict[str, list[Path]] = {}
    for p in sorted((root / "tests").rglob("test_*.py")):
        tests.setdefault(p.name, []).append(p)
    modules = [p.relative_to(root / "pipeline").as_posix() for p in (root / "pipeline").rglob("*.py")]
    every_test = [p for ps in tests.values() for p in ps]
    bad = []
    for page in pages:
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{page.relative_to(root)}:{n}"
            files: dict[int, list[Path]] = {}
            for m in list(FULL.finditer(line)) + list(BARE.finditer(line)):
                paths = [root / m.group(1)] if "/" in m.group(1) else tests.get(m.group(1), [])
                paths = [p for p in paths if p.is_file()]
                if not paths:
                    bad.append(f"{where}: {m.group(1)} is not in the repository")
                    continue
                files[m.start()] = paths
                if m.group(2) and not any(_defines(p, m.group(2)) for p in paths):
                    bad.append(f"{where}: {m.group(1)} defines no {m.group(2)}")
            for m in RELATIVE.finditer(line):
                rel = m.group(1)
                if rel.split("/")[0] not in ROOTS and not any(x == rel or x.endswith("/" + rel) for x in modules):
                    bad.append(f"{where}: {rel} is no module of pipeline/")
            for m in TEST_NAME.finditer(line):
                if "::" in m.group(0):
                    continue  # FILE.py::name: checked above
                before = [ps for at, ps in sorted(files.items()) if at <= m.start()]
                where_defined = before[-1] if before else every_test
                if not any(_defines(p, m.group(1)) for p in where_defined):
                    bad.append(f"{where}: no test {m.group(1)} in "
                               + (", ".join(str(p.relative_to(root)) for p in before[-1]) if before else "tests/"))
    return bad


def test_every_test_file_module_and_test_a_page_names_exists():
    bad = reference_problems(REF_PAGES)
    assert not bad, "the manual names what is not there:\n" + "\n".join(bad)


def test_a_missing_test_file_module_or_test_is_found(tmp_path):
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "test_a.py").write_text("def test_one():\n    pass\n")
    (tmp_path / "pipeline" / "data").mkdir(parents=True)
    (tmp_path / "pipeline" / "data" / "ingest.py").write_text("")
    page = tmp_path / "page.md"

    def check(text):
        page.write_text(text)
        return reference_problems([page], root=tmp_path)

    assert check("`tests/unit/test_a.py::test_one`, `test_a.py`, `data/ingest.py`, `pipeline/data/ingest.py`") == []
    assert check("`test_a.py::test_one`, `test_one`; and `test_one` alone") == []
    assert check("see tests/integration/test_ance.py")
    assert check("`test_b.py`")
    assert check("`tests/unit/test_a.py::test_two`")
    assert check("`test_a.py::test_one`, `test_two`")
    assert check("`test_two` somewhere")
    assert check("`data/egress.py`")
