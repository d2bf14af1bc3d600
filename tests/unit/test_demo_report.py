"""`pipeline demo --no-train` writes its own report (report-zero-shot.md, results-zero-shot.json): the
full demo's report.md, results.json and training_curves.png are never replaced by a zero-shot run, with
or without --fresh. The spine's steps are replaced by the bundled FAQ's recorded MiniLM run (the demo's
encode/index/retrieve are tested elsewhere; this is about which files the report goes to)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.recipes import demo

DATA = Path(__file__).parents[1] / "data"


@pytest.fixture
def spine(monkeypatch):
    from pipeline.eval.metrics import evaluate_files

    def fake_spine(corpus, work, cfg, split_files):
        work.mkdir(parents=True, exist_ok=True)
        shutil.copy(DATA / "python_faq_minilm_top20.trec", work / "run.trec")
        out = {}
        for split, qrels in split_files.items():
            out[split] = {**evaluate_files(work / "run.trec", qrels, cfg.eval),
                          "corpus": {"fingerprint": "f", "variant": "beir-python_faq", "title_join": "{title} {text}"}}
        return out

    monkeypatch.setattr(demo, "_spine", fake_spine)


def _full_run(out: Path) -> dict[str, bytes]:
    """What a full demo left: its report, results and curves (and its training runs)."""
    out.mkdir(parents=True)
    files = {"report.md": b"# full demo report\n", "results.json": b'{"training": {"dpr": {}}}\n',
             "training_curves.png": b"\x89PNG curves", "train/dpr/summary.json": b"{}\n"}
    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    return files


@pytest.mark.parametrize("fresh", [False, True])
def test_a_zero_shot_run_never_replaces_the_full_demos_report(tmp_path, spine, capsys, fresh):
    out = tmp_path / "demo"
    full = _full_run(out)
    demo.run_demo(out, load_config(None, []), fresh=fresh, train=False)
    for name, data in full.items():
        assert (out / name).read_bytes() == data, name
    report = (out / "report-zero-shot.md").read_text()
    assert report.startswith("# Demo: dense retrieval on the Python FAQ") and "MiniLM zero-shot" in report
    assert "Training" not in report and "training_curves.png" not in report
    assert '"zero-shot"' in (out / "results-zero-shot.json").read_text()
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert f"report: {out / 'report-zero-shot.md'}" in line and f"the full demo's {out / 'report.md'} is kept" in line


def test_the_report_files_of_each_kind_of_run():
    out = Path("runs/demo")
    assert demo.report_files(out, train=True) == (out / "report.md", out / "results.json")
    assert demo.report_files(out, train=False) == (out / "report-zero-shot.md", out / "results-zero-shot.json")
