#!/usr/bin/env python3
"""Build the bundled authorship corpus from Debian's ``fortunes`` and ``fortunes-min``.

Every fortune file (``/usr/share/games/fortunes/<name>``, entries separated by ``%``
lines) is a topic; an entry is kept when its last attribution line starts with ``--``
(``-- Mark Twain, "Pudd'nhead Wilson's Calendar"``). The author is the attribution up to
the first comma, parenthesis, bracket, quote, semicolon, `` in `` or `` on `` (so the
work and the date are dropped), with a trailing period removed; the text is the entry
above the attribution line (lines right-stripped, joined with newlines). Entries
without an attribution, or with nothing above it, are skipped.

The packages are fetched with ``apt-get download`` (no root, no installation) and
unpacked with ``dpkg-deb -x``; ``--src DIR`` reads an already unpacked
``usr/share/games/fortunes`` folder instead.

Outputs (``--out``, default ``<repo>/pipeline/resources/fortunes``):

* ``quotes.parquet``  columns ``text``, ``author``, ``topic`` in file order (files sorted
  by name, entries in file order); zstd-compressed.
* ``README.md`` (counts, package versions, the extraction rule) and ``LICENSE.txt``
  (the packages' Debian copyright file: BSD licence).

Re-running the script on the same package versions gives identical records.

Usage::

    python3 scripts/build_fortunes.py [--src DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGES = ("fortunes", "fortunes-min")
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "pipeline" / "resources" / "fortunes"
FORTUNE_DIR = Path("usr/share/games/fortunes")
ATTRIBUTION = re.compile(r"^\s*-{2,3}\s*(\S.*)$")
AUTHOR_END = re.compile(r',|\(|\[|"|;| in | on ')


def decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def parse_entry(entry: str) -> tuple[str, str] | None:
    """One fortune -> (text, author), or None when it carries no `-- Author` line."""
    lines = entry.rstrip("\n").split("\n")
    for i in range(len(lines) - 1, 0, -1):
        m = ATTRIBUTION.match(lines[i])
        if m:
            attribution = " ".join([m.group(1)] + [ln.strip() for ln in lines[i + 1:]])
            author = AUTHOR_END.split(attribution)[0].strip().rstrip(".").strip()
            author = " ".join(author.split())
            text = "\n".join(ln.rstrip() for ln in lines[:i]).strip("\n")
            if not author or not text.strip():
                return None
            return text, author
    return None


def extract(src: Path) -> list[dict]:
    records = []
    for name in sorted(os.listdir(src)):
        path = src / name
        if name.endswith(".dat") or path.is_symlink() or not path.is_file():
            continue
        raw = decode(path.read_bytes()).replace("\r\n", "\n")
        for entry in re.split(r"\n%\n", "\n" + raw):
            parsed = parse_entry(entry.strip("\n"))
            if parsed:
                records.append({"text": parsed[0], "author": parsed[1], "topic": name})
    return records


def fetch(work: Path) -> tuple[Path, dict]:
    """apt-get download + dpkg-deb -x the packages into `work`; -> (fortune dir, versions)."""
    versions = {}
    for pkg in PACKAGES:
        subprocess.run(["apt-get", "download", pkg], cwd=work, check=True, capture_output=True)
    for deb in sorted(work.glob("*.deb")):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(work / "root")], check=True)
        info = subprocess.run(["dpkg-deb", "-f", str(deb), "Package", "Version"], check=True, capture_output=True,
                              text=True).stdout
        fields = dict(line.split(": ", 1) for line in info.strip().splitlines())
        versions[fields["Package"]] = fields["Version"]
    return work / "root" / FORTUNE_DIR, versions


def write(records: list[dict], out: Path, versions: dict, copyright_text: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(records, schema=pa.schema([("text", pa.string()), ("author", pa.string()),
                                                            ("topic", pa.string())]))
    pq.write_table(table, out / "quotes.parquet", compression="zstd", compression_level=19)
    (out / "LICENSE.txt").write_text(copyright_text)
    per_author = collections.Counter(r["author"] for r in records)
    per_topic = collections.Counter(r["topic"] for r in records)
    top = ", ".join(f"{a} ({c})" for a, c in per_author.most_common(10))
    (out / "README.md").write_text(
        "# Fortunes authorship corpus\n\n"
        f"{len(records):,} attributed quotes by {len(per_author):,} authors "
        f"({sum(1 for c in per_author.values() if c >= 5)} with at least 5 quotes) over {len(per_topic)} topics, "
        "extracted by `scripts/build_fortunes.py` from Debian's "
        + ", ".join(f"`{p}` {v}" for p, v in sorted(versions.items())) + ".\n\n"
        "`quotes.parquet`: `text`, `author`, `topic` (the fortune file the quote comes from), in file order.\n"
        "An entry is kept when it ends with an `-- Author` attribution line; the author is the attribution up to "
        "the first comma, parenthesis, bracket, quote, semicolon, ` in ` or ` on `.\n\n"
        f"Most quoted: {top}.\n\n"
        "Licence: the fortune files are distributed under the BSD licence of fortune-mod; see `LICENSE.txt` "
        "(the packages' Debian copyright file). Quotes remain attributed to their authors.\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, help="an unpacked usr/share/games/fortunes folder (default: apt-get download)")
    ap.add_argument("--copyright", type=Path, help="the Debian copyright file (default: from the package)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if args.src:
            src, versions = args.src, {"fortunes": "unknown (--src)"}
            copyright_path = args.copyright
        else:
            if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
                print("error: needs apt-get and dpkg-deb (Debian/Ubuntu), or --src DIR", file=sys.stderr)
                return 2
            src, versions = fetch(Path(tmp))
            copyright_path = args.copyright or Path(tmp) / "root" / "usr/share/doc/fortunes/copyright"
        if not src.is_dir():
            print(f"error: {src} is not a folder", file=sys.stderr)
            return 2
        records = extract(src)
        text = copyright_path.read_text(errors="replace") if copyright_path and copyright_path.exists() else \
            "BSD licence of fortune-mod (Debian packages fortunes, fortunes-min).\n"
        write(records, args.out, versions, text)
    print(f"{len(records):,} quotes -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
