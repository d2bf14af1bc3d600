"""validation.dev_split: held-out training queries, the same for every trial and seed, disjoint
from what the run trains on; refused where it cannot apply."""

from __future__ import annotations

import pytest

from pipeline.data.readers import load_qrels
from pipeline.errors import ConfigError
from pipeline.train.config import load_train_config
from pipeline.train.dev_split import apply_dev_split


def _job(faq, tmp_path, *extra):
    return load_train_config(None, [f"data.corpus={faq}", f"train.storage_path={tmp_path}", "train.name=r",
                                    "validation.dev_split=0.2", *extra])


def test_the_dev_split_is_held_out_seeded_apart_from_train_seed_and_validated_on(faq, tmp_path):
    job = apply_dev_split(_job(faq, tmp_path))
    train, dev = load_qrels(job.data.qrels), load_qrels(job.validation.qrels)
    full = load_qrels(faq / "qrels" / "train.trec")
    assert set(train) | set(dev) == set(full) and not set(train) & set(dev)
    assert len(dev) == round(0.2 * len(full))
    assert job.validation.corpus == str(faq) and job.validation.qrels.endswith("/split/dev.trec")
    other = apply_dev_split(_job(faq, tmp_path / "o", "train.seed=7", "train.name=s"))
    assert load_qrels(other.validation.qrels) == dev  # another training seed: the same dev queries
    moved = apply_dev_split(_job(faq, tmp_path / "m", "validation.dev_seed=1"))
    assert set(load_qrels(moved.validation.qrels)) != set(dev)
    assert apply_dev_split(load_train_config(None, [f"data.corpus={faq}"])).validation.qrels is None  # off: unchanged


def test_a_dev_split_that_cannot_apply_is_refused(faq, tmp_path):
    with pytest.raises(ConfigError, match="both name the dev judgements"):
        apply_dev_split(_job(faq, tmp_path, f"validation.qrels={faq}/qrels/test.trec"))
    with pytest.raises(ConfigError, match="leaves no training query"):
        apply_dev_split(_job(faq, tmp_path, "validation.dev_split=0.9999"))
    with pytest.raises(ConfigError, match=r"validation.dev_split: must be in \[0, 1\)"):
        _job(faq, tmp_path, "validation.dev_split=1.5")
