"""pipeline.data.manifest: title joins, variant and join checks, fingerprints, comparisons."""

from __future__ import annotations

import json

import pytest

from pipeline.data.manifest import (TITLE_JOINS, check_comparable, check_title_join, check_variant,
                                    describe, fingerprint, join_title, load_manifest)
from pipeline.errors import InputError, PipelineError


@pytest.mark.parametrize("join, expected", [
    ("none", "Body text."),
    ("{title} [SEP] {text}", "Aaron [SEP] Body text."),
    ("{title} {text}", "Aaron Body text."),
])
def test_join_title(join, expected):
    assert join_title("Aaron", "Body text.", join) == expected


@pytest.mark.parametrize("join", list(TITLE_JOINS))
@pytest.mark.parametrize("title", ["", "  ", "\t"])
def test_empty_title_leaves_no_separator(join, title):
    assert join_title(title, "Body text.", join) == "Body text."


def test_join_title_keeps_braces_in_content():
    assert join_title("{x}", "a {title} b", "{title} [SEP] {text}") == "{x} [SEP] a {title} b"


@pytest.mark.parametrize("variant", ["wiki-dpr", "msmarco-official", "msmarco-titled", "custom", "beir-scifact"])
def test_check_variant_accepts(variant):
    assert check_variant(variant) == variant


@pytest.mark.parametrize("variant", ["msmarco", "beir-", "wiki", "", "MSMARCO-OFFICIAL"])
def test_check_variant_rejects(variant):
    with pytest.raises(PipelineError, match="variant"):
        check_variant(variant)


@pytest.mark.parametrize("join", ["none", "{title} [SEP] {text}", "{title} {text}"])
def test_check_title_join_accepts(join):
    assert check_title_join(join) == join


@pytest.mark.parametrize("join", ["{text}", "{text} {title}", "{title}[SEP]{text}", "", "None"])
def test_check_title_join_rejects(join):
    with pytest.raises(PipelineError, match="title join"):
        check_title_join(join)


def _manifest(**kw):
    m = {"variant": "msmarco-official", "sources": [{"sha256": "aa"}, {"sha256": "bb"}],
         "title_join": "none", "rows": 10, "parts": []}
    m.update(kw)
    return m


def test_fingerprint_covers_what_is_encoded():
    base = fingerprint(_manifest())
    assert base == fingerprint(_manifest(sources=[{"sha256": "bb"}, {"sha256": "aa"}], created_at="x"))
    for change in ({"variant": "msmarco-titled"}, {"title_join": "{title} {text}"}, {"rows": 11},
                   {"sources": [{"sha256": "aa"}]}):
        assert fingerprint(_manifest(**change)) != base, change


def test_check_comparable():
    a = {**_manifest(), "fingerprint": "1111"}
    b = {**_manifest(variant="msmarco-titled"), "fingerprint": "2222"}
    assert check_comparable({"x": a, "y": dict(a)}) is None
    assert check_comparable({}) is None
    with pytest.raises(PipelineError) as info:
        check_comparable({"x": a, "y": b})
    assert "msmarco-titled" in str(info.value) and "1111" in str(info.value)
    warning = check_comparable({"x": a, "y": b}, allow_mixed=True)
    assert warning.startswith("WARNING") and "NOT comparable" in warning
    assert "msmarco-official" in describe(a)


def test_load_manifest(tmp_path):
    with pytest.raises(InputError, match="no manifest"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text('{\n  "variant": "custom",\n  oops\n}\n')
    with pytest.raises(InputError) as info:
        load_manifest(tmp_path)
    assert info.value.line == 3
    (tmp_path / "manifest.json").write_text(json.dumps({"variant": "custom"}))
    with pytest.raises(InputError, match="sources"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps(_manifest()))
    assert load_manifest(tmp_path) == _manifest()


@pytest.mark.parametrize("content, match", [
    ("[1, 2]", "JSON object"),
    (json.dumps(_manifest(parts=[{"file": "corpus/p.parquet"}])), "parts"),
    (json.dumps(_manifest(parts="corpus")), "parts"),
    (json.dumps(_manifest(parts=[{"file": "../../etc/passwd", "rows": 1}])), "inside the corpus folder"),
    (json.dumps(_manifest(parts=[{"file": "/etc/passwd", "rows": 1}])), "inside the corpus folder"),
])
def test_load_manifest_refuses_malformed_parts(tmp_path, content, match):
    (tmp_path / "manifest.json").write_text(content)
    with pytest.raises(InputError, match=match):
        load_manifest(tmp_path)


def test_load_manifest_names_an_interrupted_ingest_and_a_file(tmp_path):
    (tmp_path / ".tmp-ingest-abc").mkdir()
    with pytest.raises(InputError, match="interrupted"):
        load_manifest(tmp_path)
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError, match="is a file"):
        load_manifest(tmp_path / "f")


@pytest.mark.parametrize("join", ["none", "{title} [SEP] {text}", "{title} {text}"])
def test_join_titles_over_arrow_equals_join_title_row_by_row(join):
    """The column-wise join (passage store, encoder actors) gives exactly the row-wise texts, blank
    and Unicode-whitespace titles included (no dangling separator)."""
    import pyarrow as pa

    from pipeline.data.manifest import join_title, join_titles

    titles = ["Hamlet", "", " ", "\t", "\u3000", "\u00a0", "\u2028", "\x1c", "\x85", " a ", None, "Ünïcode",
              "x\u200by", "\u200b", "\ufeff"]
    texts = [f"text {i}" for i in range(len(titles))]
    got = join_titles(pa.array(titles, pa.string()), pa.array(texts), join).to_pylist()
    assert got == [join_title(t or "", x, join) for t, x in zip(titles, texts)]
