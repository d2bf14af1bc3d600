#!/usr/bin/env python3
"""Build the bundled Python-FAQ retrieval dataset (BEIR layout).

The dataset is extracted from the reStructuredText sources of the official
Python FAQ as shipped by Debian's ``python3.11-doc`` package
(``/usr/share/doc/python3.11/html/_sources/faq/*.rst.txt``).

Every FAQ question is a section heading; its answer is the section body up to
the next heading.  A heading is a *question* when its text contains a ``?``
(default ``--rule qmark``).  Category headings ("General Information",
"Core Language", ...) are not questions.  A non-question heading nested
*below* a question (deeper heading level) is treated as part of that
question's answer; non-question headings at the same or a higher level end
the answer and are not emitted.  ``--rule leaf`` additionally treats every
childless heading on a file's question level as a question, which picks
up the few FAQ entries whose heading is phrased as a statement.  (Here
"question level" is the heading level most ``?`` headings of the file use.)

The RST answer bodies are converted to plain text with the standard library
only (roles -> visible text, ``literals`` -> literal, links -> link text,
index/comment/target directives dropped, admonition and code block content
kept, whitespace collapsed).  Bare ``:ref:`label``` references are resolved
to their section title through the Sphinx inventory (``html/objects.inv``)
when it is available.

Outputs (in ``--out``, default ``<repo>/pipeline/resources/python_faq``):

* ``corpus.jsonl``   ``{"_id": "d-<stem>-<nnn>", "title": "", "text": ...}``
* ``queries.jsonl``  ``{"_id": "q-<stem>-<nnn>", "text": <question>}``
* ``qrels/{all,train,test}.tsv``  BEIR qrels (``query-id corpus-id score``);
  train/test is a deterministic ~60/40 split on ``sha1(qid)``.
* ``README.md`` and ``LICENSE.txt`` (PSF licence, from the Debian package).

``nnn`` is the 1-based index of the question within its FAQ file (counted
before empty answers are dropped).  All files are written in sorted order
and atomically, so re-running the script yields byte-identical output.

Usage::

    python3 scripts/build_python_faq.py [--src DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

PACKAGE = "python3.11-doc"
DEFAULT_SRC = Path("/usr/share/doc/python3.11/html/_sources/faq")
DEFAULT_COPYRIGHT = Path("/usr/share/doc/python3.11-doc/copyright")
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "pipeline" / "resources" / "python_faq"
TRAIN_FRACTION = 0.6

# --------------------------------------------------------------------------
# Section parsing
# --------------------------------------------------------------------------

# RST section adornment: a line made of one repeated non-alphanumeric
# printable ASCII character.
_ADORN_RE = re.compile(r"^([!-/:-@\[-`{-~])\1{2,}\s*$")


def _is_adornment(line: str) -> bool:
    return bool(_ADORN_RE.match(line))


def parse_sections(lines: list[str]) -> list[dict]:
    """Split an RST document into sections.

    Returns a list of ``{"level", "title", "body", "line"}`` in document
    order; ``level`` 0 is the document title.  Text before the first heading
    is ignored.
    """
    heads = []  # (title_index, first_body_index, style, title)
    n = len(lines)
    i = 1
    while i < n:
        under = lines[i]
        title = lines[i - 1]
        if (
            _is_adornment(under)
            and title.strip()
            and not title[0].isspace()
            and not _is_adornment(title)
            and len(under.rstrip()) >= len(title.rstrip())
        ):
            over = i >= 2 and lines[i - 2].rstrip() == under.rstrip()
            before = i - 3 if over else i - 2
            if before < 0 or not lines[before].strip():
                style = (under[0], over)
                heads.append((i - 1, i + 1, style, title.strip()))
                i += 2
                continue
        i += 1

    styles: list[tuple[str, bool]] = []
    sections = []
    for k, (t_idx, body_start, style, title) in enumerate(heads):
        if style not in styles:
            styles.append(style)
        if k + 1 < len(heads):
            nxt_t, _, nxt_style, _ = heads[k + 1]
            body_end = nxt_t - 1 if nxt_style[1] else nxt_t  # exclude overline
        else:
            body_end = n
        sections.append(
            {
                "level": styles.index(style),
                "title": title,
                "body": lines[body_start:body_end],
                "line": t_idx + 1,
            }
        )
    return sections


def select_questions(sections: list[dict], rule: str) -> tuple[list[dict], list[dict]]:
    """Pick question sections and assemble their answer bodies.

    Returns ``(questions, orphans)``: questions carry ``title`` and
    ``body`` (own body plus nested non-question sub-sections); orphans are
    non-question sections that are not nested under a question.
    """
    secs = [s for s in sections if s["level"] > 0]  # skip the document title
    # The heading level most "?" headings use (ties: the shallower one).
    q_levels = [s["level"] for s in secs if "?" in s["title"]]
    q_level = min(set(q_levels), key=lambda lv: (-q_levels.count(lv), lv)) if q_levels else None

    def has_children(k: int) -> bool:
        return k + 1 < len(secs) and secs[k + 1]["level"] > secs[k]["level"]

    def is_question(k: int) -> bool:
        s = secs[k]
        if "?" in s["title"]:
            return True
        if rule == "leaf":
            return s["level"] == q_level and not has_children(k)
        return False

    flags = [is_question(k) for k in range(len(secs))]
    questions, orphans = [], []
    k = 0
    while k < len(secs):
        s = secs[k]
        if not flags[k]:
            orphans.append(s)
            k += 1
            continue
        body = list(s["body"])
        j = k + 1
        while j < len(secs) and secs[j]["level"] > s["level"] and not flags[j]:
            # Nested non-question sub-heading: part of this answer.
            body += ["", secs[j]["title"], ""] + secs[j]["body"]
            j += 1
        questions.append({"title": s["title"], "body": body, "line": s["line"]})
        k = j
    return questions, orphans


# --------------------------------------------------------------------------
# RST -> plain text
# --------------------------------------------------------------------------

_DIRECTIVE_RE = re.compile(r"^(\s*)\.\.\s+([A-Za-z][\w:-]*)::(.*)$")
_OPTION_RE = re.compile(r"^\s*:[\w-]+:(\s|$)")
_BULLET_RE = re.compile(r"^(\s*)(?:[*+-]|#\.)\s+")
_ITEM_RE = re.compile(r"^\s*(?:[*+-]|#\.|\d+\.|\(?[A-Za-z0-9]\))\s+")

# Directives whose whole block is invisible in the rendered docs.
_DROP_DIRECTIVES = {
    "index", "contents", "highlight", "toctree", "testsetup", "testcleanup",
    "raw", "image", "figure", "include", "literalinclude", "tabularcolumns",
    "sectionauthor", "moduleauthor", "module", "currentmodule", "default-role",
    "role", "meta", "productionlist",
}
# Directives whose content is code / literal text (no inline markup).
_LITERAL_DIRECTIVES = {
    "code-block", "code", "sourcecode", "doctest", "testcode", "testoutput",
}
_VERSION_DIRECTIVES = {
    "versionadded": "New in version {}",
    "versionchanged": "Changed in version {}",
    "deprecated": "Deprecated since version {}",
    "deprecated-removed": "Deprecated since version {}",
}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _block_end(lines: list[str], start: int, indent: int) -> int:
    """First index >= start of a non-blank line indented <= ``indent``."""
    j = start
    while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > indent):
        j += 1
    return j


def _literal_text(lines: list[str]) -> str:
    return " ".join(l.strip() for l in lines if l.strip())


def rst_blocks(lines: list[str]) -> list[tuple[str, str]]:
    """Turn RST body lines into ``("text"|"lit", string)`` chunks."""
    out: list[tuple[str, str]] = []
    para: list[str] = []

    def flush() -> None:
        if para:
            text = " ".join(_BULLET_RE.sub(r"\1", l).strip() for l in para)
            out.append(("text", text))
            para.clear()

    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        s = line.strip()
        ind = _indent(line)
        if not s:
            flush()
            i += 1
            continue

        m = _DIRECTIVE_RE.match(line)
        if m:
            flush()
            name = m.group(2).lower()
            arg = m.group(3).strip()
            j = _block_end(lines, i + 1, ind)
            content = lines[i + 1:j]
            while content and _OPTION_RE.match(content[0]):  # directive options
                content = content[1:]
            if name in _DROP_DIRECTIVES or (name == "only" and "html" not in arg):
                pass
            elif name in _LITERAL_DIRECTIVES:
                if content:
                    out.append(("lit", _literal_text(content)))
            else:
                if name in _VERSION_DIRECTIVES:
                    version, _, rest = arg.partition(" ")
                    out.append(("text", _VERSION_DIRECTIVES[name].format(version) + ":"))
                    if rest.strip():
                        out.append(("text", rest.strip()))
                elif arg and name != "only":
                    out.append(("text", arg))
                out.extend(rst_blocks(content))
            i = j
            continue

        if s == ".." or s.startswith(".. "):
            # Comment (".. XXX ..."), hyperlink target (".. _x:") etc.
            flush()
            i = _block_end(lines, i + 1, ind)
            continue

        if s.startswith(">>>") and not para:
            # Doctest block: runs until the next blank line.
            j = i
            while j < n and lines[j].strip():
                j += 1
            out.append(("lit", _literal_text(lines[i:j])))
            i = j
            continue

        if s.endswith("::") and (i + 1 >= n or not lines[i + 1].strip()):
            # Paragraph ends with the literal-block marker "::".
            if not para:
                # First line of a list item: its text starts after the marker,
                # and the literal block must be indented deeper than that.
                mm = _ITEM_RE.match(line)
                if mm:
                    ind = mm.end()
            if s == "::":
                pass
            elif s[-3].isspace():
                para.append(line.rstrip()[:-2])
            else:
                para.append(line.rstrip()[:-1])
            flush()
            j = i + 1
            while j < n and not lines[j].strip():
                j += 1
            if j < n and _indent(lines[j]) > ind:
                k = _block_end(lines, j, ind)
                out.append(("lit", _literal_text(lines[j:k])))
                i = k
            else:
                i = j
            continue

        para.append(line)
        i += 1
    flush()
    return out


_INLINE_RE = re.compile(
    r"``(?P<lit>.+?)``"
    r"|(?P<role>(?::[A-Za-z][\w.+-]*)+):`(?P<rc>(?:\\.|[^`\\])+)`"
    r"|`(?P<link>(?:\\.|[^`\\])+)`__?(?![\w])"
    r"|`(?P<interp>(?:\\.|[^`\\])+)`"
    r"|(?<![\w\\*])\*\*(?P<strong>[^*\s](?:[^*]*?[^*\s\\])?)\*\*(?![\w*])"
    r"|(?<![\w\\*])\*(?P<em>[^*\s](?:[^*]*?[^*\s\\])?)\*(?![\w*])"
)
_EXPLICIT_RE = re.compile(r"^(.*?)\s*<([^<>]+)>$", re.S)
_ESCAPE_RE = re.compile(r"\\(.)", re.S)


def _unescape(text: str) -> str:
    # RST: backslash-space is removed, backslash-X yields X.
    return _ESCAPE_RE.sub(lambda m: "" if m.group(1).isspace() else m.group(1), text)


def _role_text(role: str, content: str, refs: dict[str, str]) -> str:
    name = role.strip(":").split(":")[-1].lower()
    content = _unescape(content).strip()
    m = _EXPLICIT_RE.match(content)
    if m and m.group(1).strip():
        return m.group(1).strip()
    target = m.group(2).strip() if m else content
    if name == "ref":
        return refs.get(target.lower(), target)
    if name in ("term", "doc"):
        return target
    if name == "pep":
        return "PEP " + target.split("#")[0]
    if name == "rfc":
        return "RFC " + target.split("#")[0]
    if name == "menuselection":
        return re.sub(r"\s*-->\s*", " > ", target)
    target = target.lstrip("!")
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return target


def inline_to_text(text: str, refs: dict[str, str]) -> str:
    """Resolve RST inline markup of one paragraph into plain text."""
    parts = []
    pos = 0
    for m in _INLINE_RE.finditer(text):
        parts.append(_unescape(text[pos:m.start()]))
        pos = m.end()
        if m.group("lit") is not None:
            parts.append(m.group("lit"))
        elif m.group("role") is not None:
            parts.append(_role_text(m.group("role"), m.group("rc"), refs))
        elif m.group("link") is not None:
            body = _unescape(m.group("link"))
            lm = _EXPLICIT_RE.match(body)
            if lm:
                parts.append(lm.group(1).strip() or lm.group(2).strip())
            else:
                parts.append(body)
        elif m.group("interp") is not None:
            parts.append(_unescape(m.group("interp")))
        elif m.group("strong") is not None:
            parts.append(_unescape(m.group("strong")))
        else:
            parts.append(_unescape(m.group("em")))
    parts.append(_unescape(text[pos:]))
    return "".join(parts)


def collapse(text: str) -> str:
    return " ".join(text.split())


def rst_to_text(lines: list[str], refs: dict[str, str]) -> str:
    chunks = []
    for kind, text in rst_blocks(lines):
        chunks.append(text if kind == "lit" else inline_to_text(text, refs))
    return collapse(" ".join(chunks))


def load_sphinx_labels(inventory: Path) -> dict[str, str]:
    """Map ``std:label`` names to their display titles (Sphinx objects.inv v2)."""
    if not inventory.is_file():
        return {}
    data = inventory.read_bytes()
    pos = 0
    for _ in range(4):  # four plain-text header lines
        pos = data.index(b"\n", pos) + 1
    labels = {}
    line_re = re.compile(r"^(.+?)\s+std:label\s+-?\d+\s+\S+\s+(.*)$")
    for line in zlib.decompress(data[pos:]).decode("utf-8").splitlines():
        m = line_re.match(line)
        if m and m.group(2) != "-":
            labels[m.group(1).lower()] = m.group(2)
    return labels


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------

def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def split_of(qid: str) -> str:
    h = int(hashlib.sha1(qid.encode("utf-8")).hexdigest()[:8], 16)
    return "train" if h / 2**32 < TRAIN_FRACTION else "test"


def package_version() -> str:
    try:
        res = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", PACKAGE],
            capture_output=True, text=True, check=False,
        )
    except OSError:
        return "unknown"
    return res.stdout.strip() if res.returncode == 0 and res.stdout.strip() else "unknown"


def license_text(copyright_file: Path, license_rst: Path, version: str) -> str:
    """The Python licence part of Debian's copyright file (+ docs 0BSD note)."""
    text = copyright_file.read_text(encoding="utf-8")
    start = text.find("Python License\n==============")
    end = text.find("Licenses and Acknowledgements for Incorporated Software")
    if start < 0 or end < start:
        sys.exit(f"error: could not find the Python License section in {copyright_file}")
    out = [
        "Licence of the Python FAQ text in this dataset",
        "==============================================",
        "",
        "The question and answer texts are taken from the Python documentation",
        "(Python FAQ), Copyright (c) 2001-2023 Python Software Foundation; All",
        "Rights Reserved.  They are distributed under the PSF License Agreement",
        "(see below).",
        "",
        f"The text below is the Python License section of {copyright_file}",
        f"(Debian package {PACKAGE} {version}), reproduced verbatim.",
        "",
        "",
        text[start:end].rstrip() + "\n",
    ]
    if license_rst.is_file():
        rst = license_rst.read_text(encoding="utf-8")
        m = re.search(
            r"^ZERO-CLAUSE BSD LICENSE FOR CODE IN THE PYTHON .*?\n-+\n\n"
            r"\.\. parsed-literal::\n\n(.*?)(?=\n\n\S)",
            rst, re.S | re.M,
        )
        if m:
            body = "\n".join(l.strip() for l in m.group(1).splitlines())
            out += [
                "",
                "ZERO-CLAUSE BSD LICENSE FOR CODE IN THE PYTHON DOCUMENTATION",
                "------------------------------------------------------------",
                "",
                "Starting with Python 3.8.6, examples, recipes, and other code in the",
                "documentation are dual licensed under the PSF License Agreement and the",
                f"Zero-Clause BSD license (from {license_rst}):",
                "",
                body.strip() + "\n",
            ]
    return "\n".join(out)


def readme_text(version: str, per_file: list[tuple[str, int]], n_pairs: int,
                n_train: int, n_test: int, dropped: list[str], excluded: list[str],
                rule: str) -> str:
    rows = "\n".join(f"| {stem} | {count} |" for stem, count in per_file)
    dropped_note = ", ".join(dropped) if dropped else "none"
    if excluded:
        excluded_note = (
            "Sections with body text whose heading is not a question under this rule "
            "(not in the dataset; `--rule leaf` includes the ones on the question level):\n\n"
            + "\n".join(f"* {e}" for e in excluded)
        )
    else:
        excluded_note = "No section with body text was left out by the question rule."
    return f"""# python_faq: Python FAQ question/answer retrieval set

A small real retrieval dataset in [BEIR](https://github.com/beir-cellar/beir)
layout: each query is a question heading of the official Python FAQ, and its
single relevant document is the plain-text answer below that heading.

* Source: Debian package `{PACKAGE}` version `{version}`
  (`/usr/share/doc/python3.11/html/_sources/faq/*.rst.txt`; `index` skipped).
* Question rule: `{rule}` (`qmark`: a section heading containing `?`;
  `leaf`: additionally every childless heading on the heading level that
  most `?` headings of the file use).
  Sub-headings nested under a question are folded into its answer; category
  headings such as "Core Language" are not questions.  (Headings *ending*
  in `?` would give one pair fewer: "How do I delete a file? (And other
  file questions...)" contains but does not end with `?`.)
* Documents have an empty `title`, so the question text does not leak into
  the document; `text` is the answer converted from reStructuredText to plain
  text (roles resolved to their visible text, code kept as text, whitespace
  collapsed).  Bare `:ref:` cross-references are resolved to the target's
  section title via the package's Sphinx inventory (`html/objects.inv`), as
  in the rendered HTML; comments (`.. XXX`), index entries and hyperlink
  targets are dropped, like in the rendered HTML.

## Files

| file | content |
|---|---|
| `corpus.jsonl` | `{{"_id": "d-<file>-<nnn>", "title": "", "text": ...}}` |
| `queries.jsonl` | `{{"_id": "q-<file>-<nnn>", "text": <question>}}` |
| `qrels/all.tsv` | every pair (`query-id<TAB>corpus-id<TAB>score`, header line, score 1) |
| `qrels/train.tsv`, `qrels/test.tsv` | deterministic split of `all.tsv` |
| `LICENSE.txt` | PSF licence text from the Debian package |

`nnn` is the 1-based index of the question within its FAQ file.  The split
puts a pair in train when
`int(hashlib.sha1(qid.encode()).hexdigest()[:8], 16) / 2**32 < {TRAIN_FRACTION}`,
otherwise in test.

## Counts

* pairs (queries = documents): {n_pairs}
* train: {n_train}, test: {n_test}
* dropped (empty answer after cleaning): {dropped_note}

{excluded_note}

| FAQ file | pairs |
|---|---|
{rows}

## Regenerate

```sh
apt-get install python3.11-doc   # Debian/Ubuntu
python3 scripts/build_python_faq.py   # [--src DIR] [--out DIR] [--rule qmark|leaf]
```

The script is stdlib-only and deterministic: re-running it with the same
package version gives byte-identical files.

## Licence

The Python documentation, including the FAQ, is Copyright (c) Python
Software Foundation and is distributed under the PSF License Agreement
(Python docs license); code examples in the documentation are additionally
available under the Zero-Clause BSD license.  See `LICENSE.txt`.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=DEFAULT_SRC,
                    help=f"directory with the FAQ *.rst.txt sources (default: {DEFAULT_SRC})")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT,
                    help=f"output directory (default: {DEFAULT_OUT})")
    ap.add_argument("--copyright", type=Path, default=DEFAULT_COPYRIGHT,
                    help=f"Debian copyright file to take the licence from (default: {DEFAULT_COPYRIGHT})")
    ap.add_argument("--rule", choices=("qmark", "leaf"), default="qmark",
                    help="which headings are questions: 'qmark' = heading contains '?' (default); "
                         "'leaf' = also childless headings on the level most '?' headings use")
    args = ap.parse_args(argv)

    src: Path = args.src
    files = sorted(p for p in src.glob("*.rst.txt") if p.name != "index.rst.txt") if src.is_dir() else []
    if not files:
        sys.exit(f"error: no FAQ sources (*.rst.txt) found in {src}; "
                 f"install Debian's {PACKAGE} (apt-get install {PACKAGE}) or pass --src DIR")
    if not args.copyright.is_file():
        sys.exit(f"error: licence file {args.copyright} not found; "
                 f"install Debian's {PACKAGE} or pass --copyright FILE")

    refs = load_sphinx_labels(src.parent.parent / "objects.inv")

    corpus, queries, pairs, dropped, per_file, excluded = [], [], [], [], [], []
    for path in files:
        stem = path.name.split(".", 1)[0]
        lines = path.read_text(encoding="utf-8").splitlines()
        questions, orphans = select_questions(parse_sections(lines), args.rule)
        for o in orphans:  # non-question sections that still have body text
            if rst_to_text(o["body"], refs):
                excluded.append(f"{stem}: {collapse(inline_to_text(o['title'], refs))}")
        kept = 0
        for idx, q in enumerate(questions, start=1):
            qid, did = f"q-{stem}-{idx:03d}", f"d-{stem}-{idx:03d}"
            answer = rst_to_text(q["body"], refs)
            question = collapse(inline_to_text(q["title"], refs))
            if not answer or not question:
                dropped.append(qid)
                continue
            corpus.append((did, answer))
            queries.append((qid, question))
            pairs.append((qid, did))
            kept += 1
        per_file.append((stem, kept))

    corpus.sort()
    queries.sort()
    pairs.sort()

    def jsonl(rows):
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)

    def qrels(rows):
        return "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in rows)

    train = [p for p in pairs if split_of(p[0]) == "train"]
    test = [p for p in pairs if split_of(p[0]) == "test"]
    version = package_version()
    out: Path = args.out
    write_atomic(out / "corpus.jsonl",
                 jsonl({"_id": d, "title": "", "text": t} for d, t in corpus))
    write_atomic(out / "queries.jsonl", jsonl({"_id": q, "text": t} for q, t in queries))
    write_atomic(out / "qrels" / "all.tsv", qrels(pairs))
    write_atomic(out / "qrels" / "train.tsv", qrels(train))
    write_atomic(out / "qrels" / "test.tsv", qrels(test))
    write_atomic(out / "LICENSE.txt",
                 license_text(args.copyright, src.parent / "license.rst.txt", version))
    write_atomic(out / "README.md",
                 readme_text(version, per_file, len(pairs), len(train), len(test),
                             dropped, excluded, args.rule))

    print(f"python_faq: {len(files)} files, {len(pairs)} pairs "
          f"(train {len(train)}, test {len(test)}), {len(dropped)} dropped -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
