"""The project stands on its own: a user clones it and nothing else, so no file of it refers to a
file outside the repository (the team's shared folder beside it, say), every document it names is in
it, every `§N` it cites exists, and every markdown link resolves."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BINARY = {".parquet", ".png", ".npy", ".faiss", ".safetensors", ".bin", ".gz", ".arrow"}


def _files() -> list[Path]:
    try:
        names = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file but the usual outputs
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
                 and not any(part in (".git", ".venv", "runs", "__pycache__") for part in p.relative_to(ROOT).parts)]
    return [ROOT / n for n in names if Path(n).suffix not in BINARY and (ROOT / n).is_file()]


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return ""


OUTSIDE = re.compile(r"\.\.[/\\](?:\.\.[/\\])*(shared|\.library)\b")
DOC = re.compile(r"(?<![\w/.-])((?:docs/)?[A-Z][A-Z_]+\.md)(?: (§\d+))?")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def _resolve_doc(name: str) -> Path | None:
    for cand in (ROOT / name, ROOT / "docs" / name):
        if cand.is_file():
            return cand
    return None


def test_no_file_refers_outside_the_repository():
    bad = []
    for path in _files():
        for n, line in enumerate(_text(path).splitlines(), 1):
            if OUTSIDE.search(line):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not bad, "references outside the repository:\n" + "\n".join(bad)


def test_every_document_and_section_named_exists():
    bad = []
    sections: dict[Path, set[str]] = {}
    for path in _files():
        for n, line in enumerate(_text(path).splitlines(), 1):
            for name, section in DOC.findall(line):
                doc = _resolve_doc(name)
                where = f"{path.relative_to(ROOT)}:{n}"
                if doc is None:
                    bad.append(f"{where}: {name} is not in the repository")
                    continue
                if section:
                    if doc not in sections:
                        sections[doc] = {m.group(1) for m in re.finditer(r"^#+ (\d+)\.", _text(doc), re.M)}
                    if section[1:] not in sections[doc]:
                        bad.append(f"{where}: {name} has no section {section}")
    assert not bad, "\n".join(bad)


def test_every_markdown_link_resolves():
    bad = []
    for path in _files():
        if path.suffix != ".md":
            continue
        for n, line in enumerate(_text(path).splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
                    continue
                if not (path.parent / target).exists():
                    bad.append(f"{path.relative_to(ROOT)}:{n}: {target}")
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_the_checks_catch_what_they_are_for(tmp_path):
    """The patterns are not vacuous: each finds the kind of reference it exists to refuse."""
    up = ".." + "/"  # (spelled apart, so this file passes its own check)
    assert OUTSIDE.search(f"see {up}shared/STACK.md") and OUTSIDE.search(f"({up}{up}shared/seeds/000.txt)")
    assert not OUTSIDE.search("--out /shared/wiki/emb")  # a cluster's shared filesystem, not a file of ours
    assert DOC.findall("as METHODS.md §3 says") == [("METHODS.md", "§3")]
    assert _resolve_doc("STACK" + ".md") is None and _resolve_doc("METHODS.md") == ROOT / "docs" / "METHODS.md"
    assert LINK.findall("[x](docs/RAY.md#5-ray-data) and [y](https://ray.io)") == ["docs/RAY.md", "https://ray.io"]


def test_test_modules_have_unique_names():
    """pytest imports test modules by their base name (the test folders are not packages): two files
    with one name in tests/unit and tests/integration stop the whole collection with 'import file
    mismatch', which a run of one folder never shows."""
    seen: dict[str, Path] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        assert path.name not in seen, f"{path.relative_to(ROOT)} and {seen[path.name].relative_to(ROOT)} share a name"
        seen[path.name] = path


def test_free_port_never_hands_out_a_port_twice():
    """Ray head fixtures take several ports from free_port(); one port twice makes the head refuse to start."""
    from subprocs import free_port

    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
