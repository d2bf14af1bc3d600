"""The import graph of `pipeline/`: no circles, nothing imports a higher layer, `train/` and `index/`
never import each other (DESIGN.md, "Layers"). Every import counts, module-level or inside a
function: a lazy import that closes a circle is still a circle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "pipeline"

# Low to high. A module may import its own layer and the layers below it, never one above.
LAYERS = [
    ["pipeline", "pipeline.errors"],
    ["pipeline.io_utils", "pipeline.runtime_env", "pipeline.measures", "pipeline.progress", "pipeline.provenance"],
    ["pipeline.storage", "pipeline.remote_path", "pipeline.storage_io", "pipeline.storage_checks",
     "pipeline.credentials", "pipeline.config", "pipeline.device"],
    ["pipeline.ray_runtime"],
    ["pipeline.data", "pipeline.losses", "pipeline.models"],
    ["pipeline.eval"],
    ["pipeline.index", "pipeline.train"],
    ["pipeline.effects"],
    ["pipeline.search", "pipeline.info", "pipeline.reproduce"],
    ["pipeline.recipes"],
    ["pipeline.tune"],
    ["pipeline.confdoc", "pipeline.cli"],
]
NEVER = [("pipeline.train", "pipeline.index"), ("pipeline.index", "pipeline.train")]  # composed one level up


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the pipeline modules it imports (a `from x import name` of a submodule counts as it)."""
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = ".".join(package[:len(package) - node.level + 1] + [node.module] if node.level else [node.module]) \
                    if node.module else ".".join(package[:len(package) - node.level + 1])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != mod and t.startswith("pipeline"):
                    edges[mod].add(t)
    return edges


def _layer(mod: str) -> int:
    best = None
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            if mod == prefix or mod.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (i, len(prefix))
    assert best is not None, f"{mod} is in no layer: add it to LAYERS in {Path(__file__).name}"
    return best[0]


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read_as_python_imports_it():
    edges = import_graph()
    assert "pipeline.data.readers" in edges["pipeline.data.ingest"]
    assert "pipeline.recipes.ance" in edges["pipeline.cli.training"]  # a lazy import counts
    assert "pipeline.train.methods.registry" in edges["pipeline.train.methods.pairs"]  # from .registry import …


def test_no_circles():
    assert _circles(import_graph()) == []


def test_nothing_imports_a_higher_layer():
    upward = [f"{m} -> {t}" for m, ts in import_graph().items() for t in sorted(ts) if _layer(t) > _layer(m)]
    assert upward == []


def test_train_and_index_never_import_each_other():
    bad = [f"{m} -> {t}" for m, ts in import_graph().items() for t in ts
           for a, b in NEVER if (m == a or m.startswith(a + ".")) and (t == b or t.startswith(b + "."))]
    assert bad == []


def test_the_checks_fail_on_a_circle_and_an_upward_import():
    """The checks themselves can fail: a made-up graph with both defects is caught."""
    fake = {"pipeline.config": {"pipeline.cli"}, "pipeline.cli": {"pipeline.config"}}
    assert _circles(fake) == [["pipeline.cli", "pipeline.config"]]
    assert _layer("pipeline.cli") > _layer("pipeline.config")
    assert _layer("pipeline.recipes.rcl_regulators") == _layer("pipeline.recipes")
