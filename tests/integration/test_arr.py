"""ARR on a tiny BERT, a few steps each: CL on local Ray with 2 workers (each batch's authors are its worker's
alone), then MLL and ARR's distillation in this process (train.runner=local: one worker, the same loop and
methods; what they assert is the method's, not Ray Train's, and a Ray Train fit costs ~12 CPU-s of start-up)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from pipeline.eval.authorship import validator_for
from pipeline.data.authorship import SplitConfig, write_split
from pipeline.eval.authorship import evaluate_split
from pipeline.train.config import load_train_config
from pipeline.train.trainer import train

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def split_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("arr")
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma"]
    recs = []
    for a in range(24):
        for k in range(6 if a < 12 else 2 + a % 3):
            t = (a + k) % 3 if a < 12 else (a + k) % 6
            recs.append({"text": f"{words[a % 6]} writer {a} says {words[k % 6]} on topic{t}", "author": f"au{a:02d}",
                         "topic": f"topic{t}"})
    (d / "recs.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    write_split(d / "recs.jsonl", d / "split", SplitConfig(author_fraction=0.5, topic_fraction=0.5,
                                                           train_fraction=1.0), progress=False)
    return d / "split"


def _job(tiny_model_dir, split_dir, storage, name, method, *extra):
    return load_train_config(None, [
        f"loss.name={method}", f"model.name_or_path={tiny_model_dir}", "model.pooling=mean",
        "model.doc_max_length=32", f"authorship.split={split_dir}", "train.num_workers=2",
        "train.cpus_per_worker=0.5", "train.batch_size=4", f"train.storage_path={storage}", f"train.name={name}",
        "train.report_every=1", "optim.lr=1e-3", "train.max_steps=2", "train.log_batches=true", *extra])


LOCAL = ("train.num_workers=1", "train.runner=local")


def test_cl_mll_then_arr_distillation(ray_session, tiny_model_dir, split_dir, tmp_path):
    # step A, CL: 2 workers, each batch 2 authors x 2 texts, authors disjoint across workers
    job = _job(tiny_model_dir, split_dir, tmp_path, "cl", "arr_cl")
    cl = train(job, validate_fn=validator_for(job), progress=False)
    assert cl["steps"] == 2 and "supcon" in cl["final_metrics"] and "val_R@8" in cl["final_metrics"]
    examples = pq.read_table(tmp_path / "cl" / "examples" / "part-00000.parquet").to_pylist()
    author = {r["idx"]: r["author"] for r in examples}
    per_rank = {}
    for rank in (0, 1):
        for line in (tmp_path / "cl" / "batch_log" / f"rank{rank}.jsonl").read_text().splitlines():
            authors = [author[i] for i in json.loads(line)["idx"]]
            assert len(authors) == 4 and sorted(authors.count(a) for a in set(authors)) == [2, 2]
            per_rank.setdefault(rank, set()).update(authors)
    assert per_rank[0] and per_rank[1] and not per_rank[0] & per_rank[1]

    # step A, MLL: the classifier head is trained and checkpointed, not saved with the model
    mll = train(_job(tiny_model_dir, split_dir, tmp_path, "mll", "arr_mll", *LOCAL), progress=False)
    assert "mll" in mll["final_metrics"]
    from safetensors import safe_open

    for f in (tmp_path / "mll" / "model").rglob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            assert not any("head" in k or "classifier" in k for k in st.keys() if "pooler" not in k)
    import torch

    state = torch.load(next((tmp_path / "mll").glob("step-*")) / "training_state.pt", weights_only=False)
    assert state["heads"]["classifier.weight"].shape[0] == len({r["author"] for r in examples})

    # steps B + C: F from the pretrained encoder, distilled from the frozen CL model
    arr = train(_job(tiny_model_dir, split_dir, tmp_path, "arr", "arr", f"authorship.teacher={tmp_path / 'cl' / 'model'}",
                     *LOCAL),
                progress=False)
    m = arr["final_metrics"]
    assert {"distill", "B", "agreement"} <= set(m) and 0 <= m["B"] <= 1 and m["distill"] > 0
    assert json.loads((split_dir / "vectorizers" / "tfidf.json").read_text())["fitted_on"] == "train"

    # evaluation of the trained model: JSON keyed by test split, labelled from the run's summary
    res = evaluate_split(split_dir, model=str(tmp_path / "arr" / "model"), progress=False)
    assert res["system"]["label"] == "CL+ARR"
    for split in ("cross_topic_test", "same_topic_test"):
        assert 0 <= res[split]["R@8"] <= 1 and 0 <= res[split]["MRR"] <= res[split]["R@8"] + 1e-9
