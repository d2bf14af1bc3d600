"""Distillation from a teacher's scores (#62): MarginMSE and listwise KL equal their hand-computed values; the
teacher's scores are read from a TREC run or Hofstätter's TSV (malformed lines and pickles refused, missing
pairs counted) or from a columns file's label column; a tiny run of each loss trains and exports a model."""

from __future__ import annotations

import json
import math

import pytest
import torch
from fixtures import dpr_job

from pipeline.data.training_files import read_teacher_scores, tevatron_examples, with_teacher
from pipeline.errors import InputError
from pipeline.losses.configs import DistillKLConfig, MarginMSEConfig
from pipeline.losses.distill import distill_kl, margin_mse


def test_margin_mse_equals_its_hand_computed_value():
    cfg = MarginMSEConfig(similarity="dot", temperature=1.0)
    q = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    pos = torch.tensor([[2.0, 1.0], [1.0, 1.0]])
    neg = torch.tensor([[[1.0, 3.0], [0.0, 1.0]], [[3.0, 0.5], [1.0, -1.0]]])  # (B=2, h=2, D=2)
    t_pos, t_neg = torch.tensor([5.0, 1.0]), torch.tensor([[4.0, 2.0], [0.0, 3.0]])
    # student: s_pos = (2, 2), s_neg = ((1, 0), (1, -2)); margins (1, 2) and (1, 4); teacher (1, 3) and (1, -2)
    want = ((1 - 1) ** 2 + (2 - 3) ** 2 + (1 - 1) ** 2 + (4 - (-2)) ** 2) / 4
    assert margin_mse(q, pos, neg, t_pos, t_neg, cfg).item() == pytest.approx(want)
    cos = MarginMSEConfig(similarity="cos", temperature=0.5)
    got = margin_mse(q, pos, neg, t_pos, t_neg, cos).item()
    c = lambda a, b: float(torch.nn.functional.cosine_similarity(a, b, dim=0)) / 0.5  # noqa: E731
    hand = sum(((c(q[i], pos[i]) - c(q[i], neg[i, j])) - (t_pos[i] - t_neg[i, j]).item()) ** 2
               for i in range(2) for j in range(2)) / 4
    assert got == pytest.approx(hand, rel=1e-6)


def test_listwise_kl_equals_its_hand_computed_value_with_and_without_other_documents():
    cfg = DistillKLConfig(similarity="dot", temperature=1.0)
    q = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    docs = torch.tensor([[2.0, 0.0], [1.0, 0.0], [0.0, 1.0], [3.0, 0.0]], dtype=torch.float64)  # scores 2, 1, 0, 3
    group = torch.tensor([[0, 1]])                                          # the query's positive, its negative
    teacher = torch.tensor([[4.0, 2.0]], dtype=torch.float64)

    def kl(tt, student_over):
        pt = [math.exp(4 / tt) / (math.exp(4 / tt) + math.exp(2 / tt)), math.exp(2 / tt) / (math.exp(4 / tt) + math.exp(2 / tt))]
        z = sum(math.exp(s) for s in student_over)
        ps = [math.exp(2) / z, math.exp(1) / z]
        return sum(p * (math.log(p) - math.log(s)) for p, s in zip(pt, ps))

    assert distill_kl(q, docs[:2], group, teacher, cfg).item() == pytest.approx(kl(1.0, [2, 1]))
    assert distill_kl(q, docs, group, teacher, cfg, teacher_temperature=2.0).item() == pytest.approx(kl(2.0, [2, 1, 0, 3]))
    assert distill_kl(q, docs[:2], group, torch.tensor([[2.0, 1.0]], dtype=torch.float64), cfg).item() == pytest.approx(0.0, abs=1e-12)


def test_teacher_scores_are_read_counted_and_refused_by_line(tmp_path):
    (tmp_path / "t.trec").write_text("q0 Q0 p0 1 9.5 ce\nq0 Q0 n0 2 1.5 ce\nq9 Q0 x 1 3.0 ce\n")
    scores, lines = read_teacher_scores(tmp_path / "t.trec", "trec")
    assert scores == {("q0", "p0"): 9.5, ("q0", "n0"): 1.5, ("q9", "x"): 3.0} and lines == 3
    (tmp_path / "h.tsv").write_text("9.5\t1.5\tq0\tp0\tn0\n8.0\t2.0\tq1\tp1\tn1\n")
    assert read_teacher_scores(tmp_path / "h.tsv", "hofstaetter")[0][("q1", "n1")] == 2.0
    (tmp_path / "bad.tsv").write_text("9.5\t1.5\tq0\tp0\tn0\nhigh\t1.5\tq0\tp0\tn1\n")
    with pytest.raises(InputError, match=r"bad.tsv:2: a score that is not a number"):
        read_teacher_scores(tmp_path / "bad.tsv", "hofstaetter")
    (tmp_path / "twice.trec").write_text("q0 Q0 p0 1 9.5 ce\nq0 Q0 p0 1 2.0 ce\n")
    with pytest.raises(InputError, match=r"twice.trec:2: query 'q0', document 'p0' scored twice"):
        read_teacher_scores(tmp_path / "twice.trec", "trec")
    (tmp_path / "scores.pkl").write_bytes(b"\x80\x04")
    with pytest.raises(InputError, match=r"a pickle: never read"):
        read_teacher_scores(tmp_path / "scores.pkl", "trec")
    # joined with Tevatron's ids: the missing pairs counted, never silently dropped
    (tmp_path / "tev.jsonl").write_text(
        json.dumps({"query_id": "q0", "query": "a", "positive_passages": [{"docid": "p0", "text": "x"}],
                    "negative_passages": [{"docid": "n0", "text": "y"}, {"docid": "n7", "text": "z"}]}) + "\n"
        + json.dumps({"query_id": "q5", "query": "b", "positive_passages": [{"docid": "p5", "text": "x"}],
                      "negative_passages": [{"docid": "n5", "text": "y"}]}) + "\n")
    counts = {}
    got = list(with_teacher(tevatron_examples(tmp_path / "tev.jsonl", "{text}", counts, False), scores, counts))
    assert len(got) == 1 and got[0]["teacher_positive"] == 9.5 and got[0]["teacher_negatives"] == [1.5]
    assert got[0]["negatives"] == ["y"]
    assert counts == {"no_teacher_score_for_positive": 1, "negatives_without_teacher_score": 1,
                      "teacher_pairs_unused": 1}


ROWS = [("how do I sort a list", "Use sorted() or list.sort().", "Tuples are immutable."),
        ("what is a tuple", "A tuple is an immutable sequence.", "Dictionaries map keys to values."),
        ("unique elements", "Sets hold unique elements.", "Generators yield values lazily."),
        ("lazy values", "Generators produce values lazily with yield.", "Strings are sequences.")] * 4


@pytest.mark.parametrize("loss, source", [("margin_mse", "columns"), ("distill_kl", "columns"),
                                          ("margin_mse", "tevatron"), ("distill_kl", "tevatron-in-batch")])
@pytest.mark.slow
def test_a_tiny_distillation_run_trains_on_the_teachers_scores(loss, source, tiny_model_dir, faq, tmp_path):
    from sentence_transformers import SentenceTransformer

    from pipeline.train.trainer import train

    extra = []
    if source == "columns":
        path = tmp_path / "train.jsonl"
        label = (lambda i: 3.0 - i % 3) if loss == "margin_mse" else (lambda i: [5.0, 1.0 + i % 2])
        path.write_text("".join(json.dumps({"anchor": q, "positive": p, "negative": n, "label": label(i)}) + "\n"
                                for i, (q, p, n) in enumerate(ROWS)))
    else:
        path = tmp_path / "train.jsonl"
        path.write_text("".join(json.dumps({"query_id": f"q{i}", "query": q,
                                            "positive_passages": [{"docid": f"p{i}", "text": p}],
                                            "negative_passages": [{"docid": f"n{i}", "text": n}]}) + "\n"
                                for i, (q, p, n) in enumerate(ROWS)))
        run = tmp_path / "teacher.trec"
        run.write_text("".join(f"q{i} Q0 p{i} 1 {8.0 + i % 3} ce\nq{i} Q0 n{i} 2 {1.0 + i % 2} ce\n"
                               for i in range(len(ROWS))))
        extra = [f"data.teacher_scores={run}", "data.teacher_format=trec"]
        if source.endswith("in-batch"):
            extra.append("loss.in_batch_negatives=true")
    job = dpr_job(tiny_model_dir, faq, tmp_path / "runs", "run", "train.num_workers=1", "train.runner=local",
                  "train.max_steps=3", "train.batch_size=4", f"data.source={source.split('-')[0]}",
                  f"data.path={path}", "data.hard_negatives=1", f"loss.name={loss}", *extra)
    done = train(job, progress=False)
    assert done["steps"] == 3 and done["loss"] == loss and math.isfinite(done["final_metrics"]["loss"])
    SentenceTransformer(str(tmp_path / "runs" / "run" / "model"), device="cpu")


def test_margin_mse_on_msmarco_id_triples_with_hofstaetters_scores(tiny_model_dir, faq, tmp_path):
    """Hofstätter's teacher file names MS MARCO's id triples: read with data.source=msmarco-id-triples, each
    triple gets its two scores (a triple the file does not score is a counted skip), and MarginMSE trains on them."""
    from pipeline.data.readers import load_qrels
    from pipeline.train.trainer import train

    judged = load_qrels(faq / "qrels" / "train.trec")
    pids = sorted({d for docs in judged.values() for d in docs})
    triples = [(q, sorted(docs)[0], next(p for p in pids[(i * 7) % len(pids):] + pids if p not in docs))
               for i, (q, docs) in enumerate(sorted(judged.items()))]
    (tmp_path / "triples.tsv").write_text("".join(f"{q}\t{p}\t{n}\n" for q, p, n in triples))
    (tmp_path / "teacher.tsv").write_text("".join(f"{9.0 - i % 3}\t{1.0 + i % 2}\t{q}\t{p}\t{n}\n"
                                                  for i, (q, p, n) in enumerate(triples[:-1])))
    job = dpr_job(tiny_model_dir, faq, tmp_path / "runs", "run", "train.num_workers=1", "train.runner=local",
                  "train.max_steps=2", "train.batch_size=4", "data.source=msmarco-id-triples",
                  f"data.path={tmp_path / 'triples.tsv'}", f"data.queries={faq / 'queries.tsv'}",
                  f"data.teacher_scores={tmp_path / 'teacher.tsv'}", "data.teacher_format=hofstaetter",
                  "data.hard_negatives=1", "loss.name=margin_mse")
    done = train(job, progress=False)
    meta = json.loads((tmp_path / "runs" / "run" / "examples" / "examples.json").read_text())
    assert done["examples"] == len(triples) - 1 and meta["skipped"] == {"no_teacher_score": 1}
    assert done["steps"] == 2 and math.isfinite(done["final_metrics"]["loss"])
