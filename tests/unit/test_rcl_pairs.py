"""RCL's STS setting without Ray: sentence-pairs files (JSONL, CSV, TSV, malformed lines), the
seeded dev share, examples built from them, and STS dev Spearman as the stages' validation hook."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.data.sentence_pairs import pair_examples, read_pairs, split_pairs
from pipeline.errors import InputError
from pipeline.eval.sts import STSValidator, correlations, cosine_scores
from pipeline.models import BiEncoder
from pipeline.train.config import load_train_config


def test_layouts(tmp_path):
    j = tmp_path / "p.jsonl"
    j.write_text(json.dumps({"anchor": "a1", "positive": "p1", "negative": "n1"}) + "\n\n"
                 + json.dumps({"sentence1": "a2", "sentence2": "p2"}) + "\n")
    assert list(read_pairs(j)) == [(1, "a1", "p1", "n1"), (3, "a2", "p2", None)]
    c = tmp_path / "nli_for_simcse.csv"  # SimCSE's NLI layout, quoted commas
    c.write_text('\ufeffsent0,sent1,hard_neg\n"A man, outside",A person is outdoors,Nobody is outside\nx,y,\n')
    assert list(read_pairs(c)) == [(2, "A man, outside", "A person is outdoors", "Nobody is outside"), (3, "x", "y", None)]
    t = tmp_path / "pairs.tsv.gz"
    with gzip.open(t, "wt") as f:
        f.write("q one\tp one\nq two\tp two\tn two\n")
    assert list(read_pairs(t)) == [(1, "q one", "p one", None), (2, "q two", "p two", "n two")]
    h = tmp_path / "h.tsv"
    h.write_text("id\tpremise\thypothesis\n7\ta\tb\n")
    assert list(read_pairs(h)) == [(2, "a", "b", None)]


@pytest.mark.parametrize("name,text,line,reason", [
    ("bad.jsonl", '{"anchor": "a", "positive": "p"}\n{"anchor": "a"\n', 2, "invalid JSON"),
    ("keys.jsonl", '{"text": "a"}\n', 1, "needs an anchor"),
    ("empty.tsv", "a\tp\n\tp\n", 2, "anchor sentence is missing or empty"),
    ("one.tsv", "a\tp\nonly one field\n", 2, "1 tab-separated field"),
    ("nohead.csv", "a,b\nc,d\n", 1, "needs a header"),
    ("short.csv", "anchor,positive\nonly\n", 2, "1 field(s)"),
])
def test_malformed_lines_name_file_and_line(tmp_path, name, text, line, reason):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(InputError) as e:
        list(read_pairs(p))
    assert e.value.line == line and reason in str(e.value) and name in str(e.value)


def test_dev_share_is_seeded_disjoint_and_held_out_of_the_examples(tmp_path):
    p = tmp_path / "pairs.tsv"
    p.write_text("".join(f"anchor {i}\tpositive {i}\tneg {i}\n" for i in range(40)))
    train, dev = split_pairs(p, 0.25, seed=3)
    assert len(dev) == 10 and len(train) == 30 and not {x[1] for x in train} & {x[1] for x in dev}
    assert split_pairs(p, 0.25, seed=3) == (train, dev) and split_pairs(p, 0.25, seed=4)[1] != dev
    meta = pair_examples(p, tmp_path / "ex", 0.25, 3, hard_negatives=1, progress=False)
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "ex" / "part-00000.parquet").to_pylist()
    assert meta["examples"] == 30 and meta["dev_pairs"] == 10
    assert {r["query"] for r in rows} == {x[1] for x in train} and rows[0]["negatives"] == [train[0][3]]
    assert pair_examples(p, tmp_path / "ex", 0.25, 3, hard_negatives=1, progress=False) == meta  # reused


def test_sts_dev_validator_is_the_spearman_of_cosine(tiny_model_dir, tmp_path):
    dev = tmp_path / "sts-dev.csv"
    rng = np.random.default_rng(0)
    dev.write_text("genre,sentence1,sentence2,score\n" + "".join(
        f"x,sentence {i} about cats,sentence {i * 3 % 7} on dogs,{rng.uniform(0, 5):.2f}\n" for i in range(12)))
    v = STSValidator(dev)
    model = BiEncoder.load(load_train_config(None, [f"model.name_or_path={tiny_model_dir}"]).model)
    out = v(model)
    ref = correlations(cosine_scores(model, v.pairs), [p[2] for p in v.pairs])
    assert out["val_metric"] == out["val_spearman"] == pytest.approx(ref["spearman"])
    assert out["val_pearson"] == pytest.approx(ref["pearson"])


def test_sts_setting_stages_use_the_pairs_and_sts_dev(tmp_path):
    """Stubbed training: entropy models from the base, every stage trains on `rcl.pairs` less its
    dev share, early stopping scores the held-out pairs, the final model is selected on STS dev."""
    import pipeline.recipes.rcl as rcl
    from pipeline.train.methods import get_method

    pairs = tmp_path / "nli.tsv"
    pairs.write_text("".join(f"premise {i}\thypothesis {i}\n" for i in range(20)))
    dev = tmp_path / "sts-dev.tsv"
    dev.write_text("".join(f"s{i}\tt{i}\t{i % 5}\n" for i in range(6)))
    seen: dict = {}

    def fake_train(job, validate_fn=None, progress=True):
        run = Path(job.train.storage_path) / job.train.name
        meta = get_method("rcl").build_examples(job, run / "examples", progress=False)
        seen[job.train.name] = (type(validate_fn).__name__, meta["examples"], job.model.name_or_path)
        if job.train.name == "final":
            seen["final_inner"] = type(validate_fn.validator).__name__
        (run / "model").mkdir(parents=True, exist_ok=True)
        (run / "model" / "modules.json").write_text(json.dumps([job.train.name]))
        return {"steps": 1, "wall_seconds": 0.0}

    orig = rcl.build_regulators
    rcl.build_regulators = lambda models, job, ex, out, progress=True: [str(out / Path(p).parent.name) for p in models.values()]
    try:
        job = load_train_config(None, ["loss.name=rcl", f"train.storage_path={tmp_path}", "train.name=sts",
                                       "model.name_or_path=BASE", "rcl.entropy_lambdas=[0.01,0.02]",
                                       "rcl.entropy_init=base", "rcl.eval_every=2", f"rcl.pairs={pairs}",
                                       "rcl.dev_split=0.2", f"rcl.sts_dev={dev}", "rcl.final_select=best"])
        assert len(rcl.dev_pairs(job)) == 4 and rcl.split_dev(job, tmp_path) is job
        rec = run_rcl_quiet(rcl, job, fake_train)
    finally:
        rcl.build_regulators = orig
    assert seen["entropy-0.01"] == ("EarlyStop", 16, "BASE") and seen["entropy-0.02"][0] == "EarlyStop"
    assert seen["final"][:2] == ("SelectBest", 16) and seen["final_inner"] == "STSValidator"
    assert "initial" not in seen and rec["stages"]["final"]["inputs"]["pairs"]["dev_split"] == 0.2


def run_rcl_quiet(rcl, job, fake_train):
    return rcl.run_rcl(job, progress=False, train_fn=fake_train, validator_fn=lambda j: None)
