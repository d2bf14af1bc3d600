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


@pytest.mark.parametrize("fresh", [False, True])
def test_a_folder_of_the_users_is_refused_and_left_as_it_was(tmp_path, spine, fresh):
    """`pipeline demo --out DIR` read a corpus already in DIR/corpus as the FAQ's, and with --fresh removed
    DIR whole (`shutil.rmtree(out)`), whatever it held. A folder the demo did not make is refused now."""
    from pipeline.errors import PipelineError

    mine = tmp_path / "mine"
    (mine / "corpus").mkdir(parents=True)
    (mine / "corpus" / "manifest.json").write_text('{"variant": "beir-scifact"}\n')
    (mine / "notes.txt").write_text("mine\n")
    before = sorted(p.relative_to(mine) for p in mine.rglob("*"))
    with pytest.raises(PipelineError, match=r"mine: exists and was not made by `pipeline demo`.*another --out"):
        demo.run_demo(mine, load_config(None, []), fresh=fresh, train=False)
    (mine / "notes.txt").unlink()  # only a corpus, but another one: not the demo's either
    with pytest.raises(PipelineError, match=r"exists and was not made by `pipeline demo`.*another --out"):
        demo.run_demo(mine, load_config(None, []), fresh=fresh, train=False)
    assert sorted(p.relative_to(mine) for p in mine.rglob("*")) == [p for p in before if p.name != "notes.txt"]


def test_fresh_removes_only_what_the_demo_wrote_and_a_demo_folder_is_marked(tmp_path, spine):
    out = tmp_path / "demo"
    demo.run_demo(out, load_config(None, []), fresh=False, train=False)
    assert (out / demo.DEMO_MARKER).is_file()
    (out / "zero_shot" / "mine.txt").write_text("inside an entry the demo owns: recomputed with it\n")
    demo.run_demo(out, load_config(None, []), fresh=True, train=False)
    assert not (out / "zero_shot" / "mine.txt").exists() and (out / "report-zero-shot.md").is_file()
    assert {p.name for p in out.iterdir()} <= demo.own_entries() | {demo.DEMO_MARKER, ".lock"}


def test_the_training_half_outside_a_checkout_is_refused_before_any_work(tmp_path, monkeypatch, spine):
    from pipeline.errors import PipelineError

    monkeypatch.setattr(demo, "REPO", tmp_path / "site-packages")
    with pytest.raises(PipelineError, match=r"jobs/configs/dpr.yaml not found: .*run it from a checkout, or "
                                            r"`pipeline demo --no-train` for the zero-shot half \(nothing was run\)"):
        demo.run_demo(tmp_path / "demo", load_config(None, []), train=True)
    assert not (tmp_path / "demo").exists()
