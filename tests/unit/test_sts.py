"""STS readers on every layout (malformed lines named by file:line), correlations equal to scipy's,
and `pipeline sts` end to end with the tiny model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from pipeline.errors import InputError, PipelineError
from pipeline.eval.sts import correlations, detect_format, parse_scale, read_sts

WANT = [("A man is smiling.", "A man smiles.", 4.5), ("A dog runs", "A cat, asleep", 0.5)]


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_stsb_csv_with_header_quotes_and_extra_columns(tmp_path):
    p = _write(tmp_path, "stsb.csv", "split,score,sentence1,sentence2\n"
                                     'test,4.5,A man is smiling.,A man smiles.\n'
                                     'test,0.5,A dog runs,"A cat, asleep"\n')
    assert detect_format(p) == "stsb-csv"
    assert read_sts(p) == WANT


def test_original_stsb_tsv_with_extra_source_columns(tmp_path):
    p = _write(tmp_path, "sts-test.csv",
               "main-captions\tMSRvid\t2012test\t0001\t4.500\tA man is smiling.\tA man smiles.\n"
               "main-news\theadlines\t2015\t0002\t0.5\tA dog runs\tA cat, asleep\tsrc-a\tsrc-b\n")
    assert detect_format(p) == "stsb-tsv"
    assert read_sts(p) == WANT


def test_sick(tmp_path):
    p = _write(tmp_path, "SICK.txt",
               "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
               "1\tA man is smiling.\tA man smiles.\t4.5\tENTAILMENT\n"
               "2\tA dog runs\tA cat, asleep\t0.5\tNEUTRAL\n")
    assert detect_format(p) == "sick"
    assert read_sts(p) == WANT


def test_plain_tsv_with_and_without_header(tmp_path):
    body = "A man is smiling.\tA man smiles.\t4.5\nA dog runs\tA cat, asleep\t0.5\n"
    assert read_sts(_write(tmp_path, "a.tsv", body)) == WANT
    assert read_sts(_write(tmp_path, "b.tsv", "sentence1\tsentence2\tscore\n" + body)) == WANT
    assert detect_format(tmp_path / "a.tsv") == "tsv"


@pytest.mark.parametrize("name,text,line,reason", [
    ("bad_score.csv", "sentence1,sentence2,score\na,b,1\nc,d,high\n", 3, "not a number"),
    ("short.csv", "sentence1,sentence2,score\na,b,1\nc,d\n", 3, "field"),
    ("nan.tsv", "a\tb\t1\nc\td\tnan\n", 2, "not finite"),
    ("fields.tsv", "a\tb\t1\nc\td\n", 2, "expected s1<TAB>s2<TAB>score"),
    ("empty_sentence.tsv", "a\tb\t1\n \td\t2\n", 2, "empty sentence"),
    ("stsb_short.txt", "g\tf\t2012\t1\t4.0\ta\tb\ng\tf\t2012\t2\t3.0\ta\n", 2, "7"),
    ("stsb_score.txt", "g\tf\t2012\t1\t4.0\ta\tb\ng\tf\t2012\t2\tx\ta\tb\n", 2, "not a number"),
    ("sick_short.txt", "pair_ID\tsentence_A\tsentence_B\trelatedness_score\n1\ta\tb\t3\n2\ta\n", 3, "field"),
    # a gold score outside the 0-5 scale: the wrong column (an id, a year) or another scale
    ("over.csv", "sentence1,sentence2,score\na,b,1\nc,d,5.01\n", 3, "outside the scale 0-5"),
    ("negative.tsv", "a\tb\t1\nc\td\t-0.5\n", 2, "outside the scale 0-5"),
    ("stsb_id.txt", "g\tf\t2012\t1\t4.0\ta\tb\ng\tf\t2012\t2\t1001\ta\tb\n", 2, "--scale LO:HI"),
    ("sick_over.txt", "pair_ID\tsentence_A\tsentence_B\trelatedness_score\n1\ta\tb\t3\n2\ta\tc\t7\n", 3,
     "gold score 7 is outside"),
])
def test_malformed_rows_name_file_and_line(tmp_path, name, text, line, reason):
    p = _write(tmp_path, name, text)
    with pytest.raises(InputError, match=reason) as e:
        read_sts(p)
    assert e.value.line == line and e.value.path == str(p)


def test_constant_gold_is_refused_and_another_scale_is_accepted_when_named(tmp_path):
    with pytest.raises(InputError, match="every gold score is 3 .3 pairs.: a constant gold list") as e:
        read_sts(_write(tmp_path, "flat.tsv", "a\tb\t3\nc\td\t3\ne\tf\t3.0\n"))
    assert e.value.path == str(tmp_path / "flat.tsv")
    p = _write(tmp_path, "pct.tsv", "a\tb\t80\nc\td\t20\n")
    with pytest.raises(InputError, match="outside the scale 0-5"):
        read_sts(p)
    assert read_sts(p, scale=parse_scale("0:100")) == [("a", "b", 80.0), ("c", "d", 20.0)]
    for bad in ("5", "a:b", "5:0", "0:inf"):
        with pytest.raises(PipelineError, match="--scale"):
            parse_scale(bad)


def test_unknown_layout_and_too_few_pairs(tmp_path):
    with pytest.raises(InputError, match="unknown STS layout"):
        read_sts(_write(tmp_path, "x.txt", "just some text\n"))
    with pytest.raises(InputError, match="at least 2"):
        read_sts(_write(tmp_path, "one.tsv", "a\tb\t1\n"))
    with pytest.raises(InputError, match="sentence2"):
        read_sts(_write(tmp_path, "hdr.csv", "sentence1,other,score\na,b,1\nc,d,2\n"))


def test_correlations_equal_scipy_on_a_real_size_case():
    rng = np.random.default_rng(0)
    gold = np.round(rng.uniform(0, 5, 1379) * 5) / 5  # STS-b test size, many ties (0.2 steps)
    pred = 0.3 * gold + rng.normal(0, 1, gold.size)
    got = correlations(pred, gold)
    assert got["spearman"] == pytest.approx(spearmanr(pred, gold).statistic, abs=1e-12)
    assert got["pearson"] == pytest.approx(pearsonr(pred, gold).statistic, abs=1e-12)
    assert 0.2 < got["spearman"] < 0.6
    with pytest.raises(PipelineError, match="constant"):
        correlations(np.ones(5), np.arange(5))


def test_pipeline_sts_command(tiny_model_dir, tmp_path, capsys):
    from pipeline.cli import main

    p = _write(tmp_path, "pairs.tsv", "".join(f"sentence {i} here\tanother {i % 3} one\t{i % 5}\n" for i in range(20)))
    out = tmp_path / "sts.json"
    assert main(["sts", "--pairs", str(p), "--model", str(tiny_model_dir), "--json", str(out),
                 "model.pooling=mean"]) == 0
    res = json.loads(out.read_text())
    assert res["pairs"] == 20 and -1 <= res["spearman"] <= 1 and -1 <= res["pearson"] <= 1
    assert "Spearman" in capsys.readouterr().out
    # an existing result is refused without --overwrite; a malformed file is exit 2, no traceback
    assert main(["sts", "--pairs", str(p), "--model", str(tiny_model_dir), "--json", str(out)]) == 2
    bad = _write(tmp_path, "bad.tsv", "a\tb\t1\nc\td\tx\n")
    assert main(["sts", "--pairs", str(bad), "--model", str(tiny_model_dir)]) == 2
    assert "bad.tsv:2" in capsys.readouterr().err
    # a score off the scale is refused before any model loads (this model folder does not exist)
    ids = _write(tmp_path, "ids.tsv", "a\tb\t1\nc\td\t17\n")
    assert main(["sts", "--pairs", str(ids), "--model", str(tmp_path / "no-model")]) == 2
    err = capsys.readouterr().err
    assert f"{ids}:2: gold score 17 is outside the scale 0-5" in err and "Spearman" not in err
    assert main(["sts", "--pairs", str(ids), "--model", str(tiny_model_dir), "--scale", "0:20",
                 "model.pooling=mean"]) == 0
    assert "Spearman" in capsys.readouterr().out


# --------------------------------------------------------------------------- FAQ k-fold and anisotropy


class _Lookup:
    """A stand-in model: fixed vectors per text."""

    def __init__(self, vecs):
        self.vecs = vecs

    def embed(self, texts, side, batch_size=64, device="cpu"):
        return np.array([self.vecs[t] for t in texts], dtype=np.float32)


def _faq(tmp_path):
    d = tmp_path / "faq"
    (d / "qrels").mkdir(parents=True)
    (d / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"a{i}", "text": f"answer {i}"}) + "\n" for i in range(3)))
    (d / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": f"question {i}"}) + "\n" for i in range(3)))
    (d / "qrels" / "all.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\ta{i}\t1\n" for i in range(3)))
    return d


def test_faq_metrics_by_hand(tmp_path):
    from pipeline.eval.faq import faq_metrics, kfold, kfold_eval, load_faq

    queries, answers, qrels = load_faq(_faq(tmp_path))
    e = np.eye(3)
    # q0 -> a0 first; q1 -> a1 second (a0 first); q2 -> a2 third
    vecs = {"answer 0": e[0], "answer 1": e[1], "answer 2": e[2],
            "question 0": e[0], "question 1": 0.9 * e[0] + 0.5 * e[1], "question 2": 0.9 * e[0] + 0.5 * e[1] + 0.1 * e[2]}
    m = faq_metrics(_Lookup(vecs), queries, answers, qrels, ["q0", "q1", "q2"])
    assert m["top1"] == pytest.approx(1 / 3) and m["top3"] == 1.0 and m["top5"] == 1.0
    assert m["MAP"] == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)
    folds = kfold(["q2", "q0", "q1"], k=3, seed=1)
    assert sorted(q for f in folds for q in f) == ["q0", "q1", "q2"] and all(len(f) == 1 for f in folds)
    assert kfold(["q2", "q0", "q1"], k=3, seed=1) == folds  # seeded
    res = kfold_eval(_Lookup(vecs), _faq(tmp_path / "x"), k=3)
    assert res["MAP"] == pytest.approx((1 + 1 / 2 + 1 / 3) / 3) and res["queries"] == 3
    seen = []
    kfold_eval(lambda i, train, test: seen.append((train, test)) or _Lookup(vecs), _faq(tmp_path / "y"), k=3)
    assert all(set(tr).isdisjoint(te) and len(tr) + len(te) == 3 for tr, te in seen)


def test_anisotropy():
    from pipeline.eval.faq import anisotropy

    e = np.eye(4)
    assert anisotropy(_Lookup({f"s{i}": e[i] for i in range(4)}), [f"s{i}" for i in range(4)]) == pytest.approx(0.0)
    same = {f"s{i}": np.array([1.0, 1.0]) * (i + 1) for i in range(5)}
    assert anisotropy(_Lookup(same), list(same)) == pytest.approx(1.0)


def test_glue_stsb_tsv_with_named_columns(tmp_path):
    p = _write(tmp_path, "dev.tsv", "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
                                    "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA man is smiling.\tA man smiles.\t4.5\n"
                                    "1\tmain-news\theadlines\t2015\t0002\tnone\tnone\tA dog runs\tA cat, asleep\t0.5\n")
    assert read_sts(p) == WANT
