"""validation.dev_split: held-out training queries, the same for every trial and seed, disjoint
from what the run trains on; refused where it cannot apply."""

from __future__ import annotations

from pathlib import Path

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


def test_rcls_dev_split_follows_validation_dev_seed_not_train_seed(faq, tmp_path):
    """RCL's `rcl.dev_split` is the same split as `validation.dev_split` (train/dev_split.py): replicates
    over train.seed validate on the same held-out queries, validation.dev_seed moves them."""
    from pipeline.recipes.rcl import split_dev

    def dev_of(root, *extra):
        job = load_train_config(None, ["loss.name=rcl", f"data.corpus={faq}", "rcl.dev_split=0.2", *extra])
        return (root / "split" / "dev.trec").read_text() if split_dev(job, root) else None

    a = dev_of(tmp_path / "a", "train.seed=0")
    assert a and a == dev_of(tmp_path / "b", "train.seed=7")
    assert a != dev_of(tmp_path / "c", "train.seed=0", "validation.dev_seed=1")
    plain = apply_dev_split(_job(faq, tmp_path / "v"))  # and it equals validation.dev_split's at the same seed
    assert a == Path(plain.validation.qrels).read_text()
