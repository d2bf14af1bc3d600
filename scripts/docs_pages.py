"""Pages of the documentation site made at build time (mkdocs-gen-files, see properdocs.yml); nothing here is
written into docs/.

  index.md                 README.md, its links into docs/ made relative to the site
  reference/index.md       the API reference: one page per subpackage of `pipeline`, and one for its
  reference/<name>.md      top-level modules, each module rendered from its docstrings (mkdocstrings)
"""

from __future__ import annotations

import re
from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pipeline"
SKIP = {"__main__"}  # runs the CLI when imported


def readme_page() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.sub(r"\]\(docs/", "](", text)


def modules(folder: Path, dotted: str) -> list[str]:
    return [f"{dotted}.{p.stem}" for p in sorted(folder.glob("*.py")) if p.stem not in SKIP | {"__init__"}]


def reference_pages() -> dict[str, str]:
    """{page: Markdown}: each subpackage's modules on one page, headed by the subpackage's docstring."""
    pages: dict[str, str] = {}
    rows = []
    top = modules(PACKAGE, "pipeline")
    pages["reference/pipeline.md"] = "# pipeline (top-level modules)\n\n" + "".join(f"::: {m}\n\n" for m in top)
    rows.append("| [pipeline](pipeline.md) | the top-level modules: " + ", ".join(m.rsplit(".", 1)[1] for m in top) + " |")
    for sub in sorted(p for p in PACKAGE.iterdir() if p.is_dir() and list(p.glob("*.py"))):
        name = f"pipeline.{sub.name}"
        parts = [f"# {name}\n"]
        if (sub / "__init__.py").is_file():  # the subpackage's own docstring (a namespace package has none)
            parts.append(f"::: {name}\n    options:\n      members: false\n")
        members = modules(sub, name)
        for nested in sorted(p for p in sub.iterdir() if (p / "__init__.py").is_file()):
            members += [f"{name}.{nested.name}"] + modules(nested, f"{name}.{nested.name}")
        parts += [f"::: {m}\n" for m in members]
        pages[f"reference/{sub.name}.md"] = "\n".join(parts)
        rows.append(f"| [{name}]({sub.name}.md) | " + ", ".join(m.rsplit(".", 1)[1] for m in members) + " |")
    pages["reference/index.md"] = (
        "# API reference\n\nGenerated from the docstrings of the `pipeline` package (the layers and the rules "
        "between them: DESIGN.md in the repository).\n\n| package | modules |\n|---|---|\n" + "\n".join(rows) + "\n")
    return pages


with mkdocs_gen_files.open("index.md", "w") as f:
    f.write(readme_page())
mkdocs_gen_files.set_edit_path("index.md", "../README.md")
for page, text in reference_pages().items():
    with mkdocs_gen_files.open(page, "w") as f:
        f.write(text)
