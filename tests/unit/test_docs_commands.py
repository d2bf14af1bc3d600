"""The manual cannot drift from the code: every `pipeline ...` command that README.md or a page of docs/
shows in a shell block is parsed by the real CLI parser and its config (file + overrides) loaded by the
real config system, as `pipeline reproduce check` does for the matrix's cells."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pipeline.cli import build_parser
from pipeline.cli.reproduce import check_command

PARSER = build_parser()

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "reproductions.md")
STARTS = ("pipeline ", "$P ", ".venv/bin/pipeline ")


def shown_commands(path: Path) -> list[tuple[int, str]]:
    """(line, command) of every pipeline command in the page's ```bash blocks, continuation lines joined,
    comments dropped; a placeholder the reader fills in (<run>, …) becomes a plain word."""
    out, in_block, buf, start = [], False, "", 0
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            in_block = line.strip() in ("```bash", "```sh", "```shell") if not in_block else False
            continue
        if not in_block:
            continue
        if not buf:
            start = n
        buf += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
        if line.rstrip().endswith("\\"):
            continue
        text, buf = buf.strip(), ""
        if not text.startswith(STARTS):
            continue
        text = re.sub(r"<[^<>\s]+>", "x", text).replace("…", "x")
        words = shlex.split(text, comments=True)
        if words[0] == "$P" or words[0].endswith("/pipeline"):
            words[0] = "pipeline"
        out.append((start, shlex.join(words)))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_a_page_shows_parses(page):
    commands = shown_commands(page)
    for line, command in commands:
        try:
            check_command(command, PARSER)
        except Exception as e:
            raise AssertionError(f"{page.relative_to(ROOT)}:{line}: {command}\n{e}") from None


def test_the_pages_show_commands():
    counted = {p.name: len(shown_commands(p)) for p in PAGES}
    assert sum(counted.values()) > 40 and counted["spine.md"] > 15 and counted["README.md"] >= 10, counted
