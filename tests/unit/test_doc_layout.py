"""The manual reads as a path, not a wall: in README.md and every page of docs/ (docs/reproductions.md is left
out: `pipeline reproduce report` writes it from the records) no line runs over 400 characters (a longer one
is a paragraph or a table cell nobody can read in a plain file), no list item over 30 lines (one that long is
a section: give it a heading), and every link to a section (`#anchor`, in the page or in another) names a
heading that is there, so a page's Contents list leads somewhere.

What the scan counts
--------------------
A list item starts at a line opening with `- `, `* `, `+ ` or `1. ` (after any indent) outside a fenced code
block, and runs over every line that belongs to it: lines indented deeper than its marker (its wrapped text,
its nested items, an indented code block), a line of text straight after one of its lines (markdown's lazy
continuation), and blank lines inside it. It ends at a blank line followed by text no deeper than its marker,
at another item no deeper than it, or at a heading, a table row or a fence at its depth. A nested item's lines
count for the item that holds it too.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "reproductions.md")

MAX_LINE = 400
MAX_ITEM_LINES = 30

ITEM = re.compile(r"^( *)(?:[-*+]|\d+[.)]) ")
FENCE = re.compile(r"^ *(```|~~~)")
BLOCK_START = re.compile(r"^ *(?:#{1,6} |\||```|~~~)")
LINK = re.compile(r"\]\(([^)\s#]*)#([^)\s]+)\)")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def list_items(text: str) -> list[tuple[int, int]]:
    """(first line, number of lines) of every list item of a markdown text (see the module docstring)."""
    lines = text.splitlines()
    code = [False] * len(lines)  # inside a fenced block (its "- " lines are no items)
    items: list[tuple[int, int]] = []
    fence_at: int | None = None
    for i, line in enumerate(lines):
        if fence_at is not None:
            code[i] = True
            if FENCE.match(line) and _indent(line) <= fence_at + 3:
                fence_at = None
            continue
        if FENCE.match(line):
            code[i] = True
            fence_at = _indent(line)
    for i, line in enumerate(lines):
        m = ITEM.match(line)
        if code[i] or not m:
            continue
        depth = len(m.group(1))
        last, j, fenced = i, i + 1, False
        while j < len(lines):
            s = lines[j]
            if fenced:  # a code block the item holds runs to its closing fence, whatever its lines' indent
                last = j
                fenced = not FENCE.match(s)
                j += 1
                continue
            if not s.strip():
                j += 1
                continue
            blank_before = not lines[j - 1].strip()
            if _indent(s) > depth:
                last = j
                fenced = bool(FENCE.match(s))
            elif blank_before or ITEM.match(s) or BLOCK_START.match(s):
                break
            else:  # lazy continuation: text right under the item's last line
                last = j
            j += 1
        items.append((i + 1, last - i + 1))
    return items


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, markup and punctuation dropped, spaces as hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page's headings give (a repeated heading gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in text.splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        m = re.match(r"^#{1,6} (.+?)#*\s*$", line)
        if in_code or not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def layout_problems(page: Path) -> list[str]:
    """Every line over MAX_LINE characters and every list item over MAX_ITEM_LINES lines of `page`."""
    text = page.read_text(encoding="utf-8")
    name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
    bad = [f"{name}:{n}: a line of {len(line)} characters (at most {MAX_LINE}: wrap it, or move a table "
           "cell's explanation to a note under the table)"
           for n, line in enumerate(text.splitlines(), 1) if len(line) > MAX_LINE]
    bad += [f"{name}:{n}: a list item of {count} lines (at most {MAX_ITEM_LINES}: make it a section with a "
            "heading)" for n, count in list_items(text) if count > MAX_ITEM_LINES]
    return bad


def anchor_problems(page: Path) -> list[str]:
    """Every link of `page` to a section (`#anchor`, `other.md#anchor`) whose heading is not there."""
    bad = []
    name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for target, anchor in LINK.findall(line):
            if re.match(r"[a-z]+://", target):
                continue
            doc = (page.parent / target) if target else page
            if doc.suffix != ".md" or not doc.is_file():
                continue  # a missing file is test_self_contained.py's finding
            if anchor not in anchors(doc.read_text(encoding="utf-8")):
                bad.append(f"{name}:{n}: {target}#{anchor} names no heading of {doc.name}")
    return bad


def test_no_line_over_400_characters_and_no_list_item_over_30_lines():
    bad = [p for page in PAGES for p in layout_problems(page)]
    assert not bad, "pages a reader cannot follow:\n" + "\n".join(bad)


def test_every_link_to_a_section_finds_its_heading():
    bad = [p for page in PAGES for p in anchor_problems(page)]
    assert not bad, "links to sections that are not there:\n" + "\n".join(bad)


def test_the_pages_link_to_their_sections():
    """The long pages open with a Contents list whose links lead to their sections."""
    for name in ("spine.md", "performance.md"):
        text = (ROOT / "docs" / name).read_text(encoding="utf-8")
        head = text.split("\n## ", 1)[0]
        assert "Contents" in head, f"docs/{name} has no Contents list before its first section"
        assert len(re.findall(r"\]\(#[^)]+\)", head)) >= 3, f"docs/{name}'s Contents list links to no sections"


def test_the_scan_counts_what_a_reader_sees():
    text = "\n".join([
        "Intro", "",
        "- one", "  wrapped", "lazy continuation", "",  # 3 lines, then a blank line and a paragraph
        "A paragraph.", "",
        "- two", "  - nested", "    deeper", "", "  more of two", "",
        "  ```bash", "pipeline info x", "  ```",
        "- three",
        "```yaml", "- not an item", "```",
        "1. numbered", "   text",
        "# heading",
    ])
    assert list_items(text) == [(3, 3), (9, 9), (10, 2), (18, 1), (22, 2)]
    assert slug("6. The package without a checkout") == "6-the-package-without-a-checkout"
    assert slug("Fast encoding: `encode.backend`, OpenVINO") == "fast-encoding-encodebackend-openvino"
    assert anchors("# A\n## B\n## B\n```\n# not a heading\n```\n") == {"a", "b", "b-1"}


def test_a_long_line_a_long_item_and_a_dangling_anchor_are_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n" + "x" * 401 + "\n\n- item\n" + "  more\n" * 30 + "\n[there](#nowhere) [here](#page)\n")
    found = layout_problems(page)
    assert len(found) == 2 and "401 characters" in found[0] and "31 lines" in found[1]
    assert anchor_problems(page) == [f"{page}:37: #nowhere names no heading of page.md"]
