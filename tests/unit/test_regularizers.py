"""Attention dropout and DropHead (train/regularizers.py), the RCL paper's Tables 1-3 comparisons: each
equals its definition computed by hand on a tiny BERT, acts in training only, leaves the saved model's
config as it was, and is part of a run's identity."""

from __future__ import annotations

import json

import pytest
import torch
from fixtures import dpr_job

from pipeline.errors import ConfigError, PipelineError
from pipeline.models.checkpoint import finalize_checkpoint
from pipeline.train.config import dump_job, load_train_config
from pipeline.train.identity import check_identity, run_identity
from pipeline.train.regularizers import apply_attention_regularizers, drophead_mask, self_attention_modules


def _tiny(tiny_model_dir):
    from transformers import AutoModel

    torch.manual_seed(0)
    return AutoModel.from_pretrained(str(tiny_model_dir), local_files_only=True)


def test_drophead_mask_by_hand():
    g = torch.Generator().manual_seed(7)
    u = torch.rand(5, 4, generator=torch.Generator().manual_seed(7))
    mask = drophead_mask(5, 4, 0.5, generator=g)
    for i in range(5):
        keep = [float(x >= 0.5) for x in u[i]]
        kept = sum(keep)
        want = [k * 4 / kept if kept else 0.0 for k in keep]
        assert mask[i].tolist() == pytest.approx(want)
    assert torch.equal(drophead_mask(3, 6, 0.0), torch.ones(3, 6))       # p = 0 keeps every head, scale 1
    # an example that drops every head gets 0, never a division by 0
    assert torch.equal(drophead_mask(4, 3, 0.999999, generator=torch.Generator().manual_seed(1)), torch.zeros(4, 3))


def test_drophead_equals_the_heads_context_masked_and_rescaled(tiny_model_dir):
    """One self-attention layer in training with DropHead: its output is the plain layer's context with
    each example's dropped heads zeroed and the kept ones scaled by heads / kept (masks drawn as
    drophead_mask draws them from the same seed)."""
    model = _tiny(tiny_model_dir)
    attn = self_attention_modules(model)[0]
    h, d = attn.num_attention_heads, attn.attention_head_size
    x = torch.randn(3, 5, h * d)
    attn.eval()
    with torch.no_grad():
        plain = attn(x)[0]
    apply_attention_regularizers([model], attention_dropout=0.0, drophead=0.5)
    attn.train()
    torch.manual_seed(11)
    with torch.no_grad():
        got = attn(x)[0]
    torch.manual_seed(11)
    scale = drophead_mask(3, h, 0.5)
    want = (plain.view(3, 5, h, d) * scale[:, None, :, None]).view(3, 5, h * d)
    assert torch.allclose(got, want, atol=1e-6)
    assert not torch.allclose(got, plain)                                  # something was dropped
    attn.eval()
    with torch.no_grad():
        assert torch.equal(attn(x)[0], plain)                              # evaluation: the layer unchanged


def test_attention_dropout_sets_every_layer_in_training_only_and_keeps_the_config(tiny_model_dir):
    model = _tiny(tiny_model_dir)
    before = model.config.attention_probs_dropout_prob
    ids = torch.randint(5, 90, (2, 12))
    model.eval()
    with torch.no_grad():
        ref = model(input_ids=ids).last_hidden_state
    done = apply_attention_regularizers([model, model], attention_dropout=0.3, drophead=0.0)  # shared: once
    layers = self_attention_modules(model)
    assert done["layers"] == len(layers) == model.config.num_hidden_layers
    assert all(m.dropout.p == 0.3 for m in layers)
    assert model.config.attention_probs_dropout_prob == before             # config.json is saved as it was
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).last_hidden_state, ref)   # eval: no dropout
        model.train()
        for m in model.modules():                                          # every other dropout off
            if isinstance(m, torch.nn.Dropout) and all(m is not a.dropout for a in layers):
                m.p = 0.0
        a, b = model(input_ids=ids).last_hidden_state, model(input_ids=ids).last_hidden_state
    assert not torch.allclose(a, b)                                        # masks drawn on the attention
    for m in layers:
        m.dropout.p = 0.0
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).last_hidden_state, ref, atol=1e-5)


def test_nothing_asked_changes_nothing_and_a_model_without_self_attention_is_refused(tiny_model_dir):
    model = _tiny(tiny_model_dir)
    p = [m.dropout.p for m in self_attention_modules(model)]
    assert apply_attention_regularizers([model], None, 0.0)["layers"] == 0
    assert [m.dropout.p for m in self_attention_modules(model)] == p
    with pytest.raises(ConfigError, match=r"train.drophead: the model \(Linear\) has no BERT-like self-attention"):
        apply_attention_regularizers([torch.nn.Linear(2, 2)], None, 0.1)
    with pytest.raises(ConfigError):
        load_train_config(None, ["train.drophead=1"])                      # [0, 1): every head dropped is no run


META, DIGEST = {"examples": 10}, "0" * 64


def test_the_regularizers_are_part_of_the_identity(tmp_path):
    job = load_train_config(None, [])
    ident = run_identity(job, META, DIGEST, 1, 10, "fp32")
    assert ident["attention_regularizers"] == {"attention_dropout": None, "drophead": 0.0}
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.yaml").write_text(dump_job(job))
    finalize_checkpoint(d, {"step": 2, "identity": ident})
    other = load_train_config(None, ["train.drophead=0.1"])
    with pytest.raises(PipelineError, match=r"attention_regularizers .*train.attention_dropout=null train.drophead=0 "
                                            r"trains as the checkpoint did"):
        check_identity(d, run_identity(other, META, DIGEST, 1, 10, "fp32"))
    # a checkpoint made before the options existed trained without them: it resumes a run without them only
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.yaml").write_text(dump_job(job))
    finalize_checkpoint(old, {"step": 2, "identity": {k: v for k, v in ident.items() if k != "attention_regularizers"}})
    check_identity(old, ident)
    with pytest.raises(PipelineError, match="attention_regularizers"):
        check_identity(old, run_identity(other, META, DIGEST, 1, 10, "fp32"))


def test_a_run_trains_with_both_and_saves_the_model_as_it_was(tiny_model_dir, faq, tmp_path, capsys):
    """`pipeline train` with train.attention_dropout and train.drophead (local runner, 3 steps): the run
    finishes, its identity records them, and its model's config.json keeps the base's dropout."""
    from pipeline.train.trainer import train

    job = dpr_job(tiny_model_dir, faq, tmp_path / "runs", "reg", "train.num_workers=1", "train.max_steps=3",
                  "train.runner=local", "train.attention_dropout=0.2", "train.drophead=0.3")
    train(job, progress=True)
    assert ", attention dropout 0.2, DropHead 0.3" in capsys.readouterr().out  # the run's first line says so
    run = tmp_path / "runs" / "reg"
    base = json.loads((tiny_model_dir / "config.json").read_text())["attention_probs_dropout_prob"]
    saved = json.loads(next(run.rglob("model/config.json")).read_text())["attention_probs_dropout_prob"]
    assert saved == base
    states = [json.loads(p.read_text()) for p in run.rglob("state.json")]
    assert states and all(s["identity"]["attention_regularizers"] == {"attention_dropout": 0.2, "drophead": 0.3}
                          for s in states)
