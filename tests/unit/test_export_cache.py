"""models/export_cache and the checks of models/backends: what names an export and a kept graph (every setting
of the head, the model code), a kept graph's weight map under its marker's digest, and the fp32 gate at what a
correct conversion gives."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from pipeline.errors import PipelineError
from pipeline.models import BiEncoder, backends, export_cache, openvino_graph, tower_check
from pipeline.models.backends import OpenVinoTower, tower_runner
from pipeline.models.heads import DenseLayer, Head

pytest.importorskip("openvino")

from fixtures import TOWER_TEXTS as TEXTS, tower_model as _model, tower_tokens as _tokens  # noqa: E402


def _nudge(model, seed: int, scale: float = 0.05):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


def _with_head(model, head: Head) -> BiEncoder:
    model.doc_head = model.query_head = head
    return model


def _dense_head(activation: nn.Module, use_residual: bool = False, bias: bool = True, pooling: str = "mean",
                normalize: bool = True, include_prompt: bool = True) -> Head:
    torch.manual_seed(3)  # the same Dense weights for every variant
    dense = DenseLayer(32, 32, bias=bias, activation=activation, use_residual=use_residual)
    return Head(pooling, normalize, include_prompt, sentence_dense=[dense])


@pytest.mark.parametrize("variant", [
    dict(activation=nn.Hardtanh()), dict(activation=nn.GELU()), dict(activation=nn.GELU(approximate="tanh")),
    dict(activation=nn.Tanh(), use_residual=True), dict(activation=nn.Tanh(), bias=False),
    dict(activation=nn.Tanh(), normalize=False), dict(activation=nn.Tanh(), pooling="max"),
    dict(activation=nn.Tanh(), include_prompt=False)])
def test_every_head_setting_that_changes_the_computation_is_in_both_keys(tiny_model_dir, variant):
    """Heads whose parameters have the same names and shapes (a Dense layer's activation, its residual flag when
    in == out) but compute differently never share a graph; the same head with other weights does."""
    base = _with_head(_model(tiny_model_dir), _dense_head(nn.Tanh()))
    other_weights = _with_head(_nudge(_model(tiny_model_dir), 1), _dense_head(nn.Tanh()))
    assert export_cache.graph_key(base, "doc") == export_cache.graph_key(other_weights, "doc")
    other = _with_head(_model(tiny_model_dir), _dense_head(**variant))
    assert export_cache.graph_key(other, "doc") != export_cache.graph_key(base, "doc")
    assert export_cache.tower_digest(other, "doc") != export_cache.tower_digest(base, "doc")


@pytest.mark.slow
def test_two_models_differing_only_in_the_dense_activation_each_export_their_own_vectors(tiny_model_dir, tmp_path,
                                                                                        monkeypatch):
    """Saved models equal but for the Dense activation (same weights, same parameter shapes): two graphs, and
    each export gives its own model's vectors. Were their keys to collide (as before issue 39), the fp32 gate
    would refuse the graph of the other (cosine > 0.9999, but components off by far more than a correct
    conversion's) and convert the model as it is."""
    dirs = {}
    for name, act in (("tanh", nn.Tanh()), ("hardtanh", nn.Hardtanh())):
        head = _dense_head(act)
        with torch.no_grad():  # small inputs to the activation, where tanh(x) and hardtanh(x) = x differ a little
            for p in head.parameters():
                p.mul_(0.2)
        _with_head(_nudge(_model(tiny_model_dir), 0), head).save(tmp_path / name)
        dirs[name] = tmp_path / name
    models = {name: _model(d) for name, d in dirs.items()}
    assert isinstance(models["hardtanh"].doc_head.sentence_dense[0].activation_function, nn.Hardtanh)
    assert export_cache.graph_key(models["tanh"], "doc") != export_cache.graph_key(models["hardtanh"], "doc")
    cache = tmp_path / "cache"
    vectors = {}
    for name, model in models.items():
        tower = OpenVinoTower(model, cache=cache)
        assert tower.converted and tower.check["passed"]
        toks = _tokens(model)
        vectors[name] = model.embed_tokens(toks, "doc", runner=tower)
        np.testing.assert_allclose(vectors[name], model.embed_tokens(toks, "doc"), atol=1e-5)
    assert np.abs(vectors["tanh"] - vectors["hardtanh"]).max() > 1e-4  # the two models do differ
    assert len([p for p in (cache / "openvino-graphs").iterdir() if not p.name.startswith(".")]) == 2
    # the old key (no activation in it): the second model finds the first's graph, which fails the fp32 gate
    monkeypatch.setattr(openvino_graph, "graph_key", lambda *a: "one-key-for-both")
    checks = []
    real = tower_check.probe_check
    monkeypatch.setattr(backends, "probe_check", lambda *a, **k: checks.append(real(*a, **k)) or checks[-1])
    OpenVinoTower(models["tanh"], cache=tmp_path / "collide")
    tower = OpenVinoTower(models["hardtanh"], cache=tmp_path / "collide")
    assert checks[0]["passed"] and not checks[1]["passed"], checks
    assert checks[1]["min_cosine"] > 0.9999 and checks[1]["max_error"] > 10 * tower_check.FP32_MAX_ERROR, checks[1]
    toks = _tokens(models["hardtanh"])
    np.testing.assert_allclose(models["hardtanh"].embed_tokens(toks, "doc", runner=tower), vectors["hardtanh"],
                               atol=1e-5)


@pytest.mark.slow
def test_a_tampered_weight_map_of_a_kept_graph_is_detected_set_aside_and_made_again(tiny_model_dir, tmp_path):
    """graph.json (which constant holds which weight) is under the marker's own digest: two weights of one
    shape swapped in it (their files untouched) is a broken entry, said in one line, set aside and made again;
    the next export reads the remade graph and gives torch's vectors."""
    model = _nudge(_model(tiny_model_dir, pooling="mean", normalize=True), 0)
    cache = tmp_path / "cache"
    OpenVinoTower(model, cache=cache)
    entry = backends.RefreshableTower(model, "doc", cache=cache).entry
    assert export_cache.entry_problem(entry, "graph.json") is None
    record = json.loads((entry / "graph.json").read_text())
    weights = record["weights"]
    a, b = (i for i, (_, name, _) in enumerate(weights) if name.endswith("attention.output.LayerNorm.weight"))
    weights[a][1], weights[b][1] = weights[b][1], weights[a][1]
    (entry / "graph.json").write_text(json.dumps(record))  # the files' digests as they were
    assert "graph.json does not match its recorded digest" in export_cache.entry_problem(entry, "graph.json")
    _nudge(_model(tiny_model_dir, pooling="mean", normalize=True), 7).save(tmp_path / "later")
    later = _model(tmp_path / "later")  # another model of the architecture (a checkpoint), exported
    assert backends.RefreshableTower(later, "doc", cache=cache).entry == entry
    tower = OpenVinoTower(later, cache=cache)
    broken = [n for n in tower.notes if "was broken" in n]
    assert len(broken) == 1 and str(entry) in broken[0] and "graph.json does not match" in broken[0], tower.notes
    assert "made again" in broken[0] and "\n" not in broken[0]
    assert export_cache.entry_problem(entry, "graph.json") is None
    assert json.loads((entry / "graph.json").read_text())["weights"][a][1] == weights[b][1]  # the true map again
    assert not [p for p in entry.parent.iterdir() if "-broken-" in p.name or "-tmp-" in p.name]
    toks = _tokens(later)
    np.testing.assert_allclose(later.embed_tokens(toks, "doc", runner=tower), later.embed_tokens(toks, "doc"),
                               atol=1e-5)
    assert backends.RefreshableTower(later, "doc", cache=cache).source == "cache"


@pytest.mark.slow
def test_vectors_off_by_more_than_the_fp32_floor_are_refused_at_fp32_though_their_cosine_passes(
        tiny_model_dir, tmp_path, monkeypatch):
    model = _model(tiny_model_dir, pooling="mean", normalize=True)
    real_call = OpenVinoTower.__call__

    def off(self, batch):  # one component off by 1e-4 of the vector's length: cosine ~ 1 - 5e-9
        out = real_call(self, batch)
        out[:, 0] += 1e-4 * np.linalg.norm(out, axis=1)
        return out

    monkeypatch.setattr(OpenVinoTower, "__call__", off)
    # nothing kept: the export's own fp32 check (its graph compiled apart) would vouch for the tower otherwise
    monkeypatch.setattr(backends, "_keep_figures", lambda *a: None)
    with pytest.raises(PipelineError, match=r"openvino's fp32 vectors had a minimum cosine of 1\.0 and a component "
                                            r"off by 0\.0001 of its vector's length .*needed >= 0\.9999 and <= 2\.5e-06"):
        tower_runner(model, "doc", "openvino", "fp32", 1, cache=tmp_path)
    used, runner, _, note = tower_runner(model, "doc", "auto", "fp32", 1, cache=tmp_path)
    assert (used, runner) == ("torch", None) and "component off by" in note and "torch used" in note


@pytest.mark.slow
def test_a_graph_is_kept_only_once_it_passed_the_fp32_gate_whatever_the_precision_it_is_used_in(
        tiny_model_dir, tmp_path, monkeypatch):
    """A validation in bf16 (simulated: this CPU may not have it) checks its tower at bf16's gate, and verifies
    the graph in fp32 before keeping it: a graph with one weight slightly wrong passes the bf16 gate, fails the
    fp32 one, is not kept, and the model is converted as it is."""
    real_compile = OpenVinoTower._compile

    def as_bf16(self, converted, xml, precision):
        real_compile(self, converted, xml, precision)
        if precision == "bf16":
            self.precision = "bf16"

    monkeypatch.setattr(OpenVinoTower, "_compile", as_bf16)
    model = _nudge(_model(tiny_model_dir, pooling="mean", normalize=True), 0)
    good = backends.RefreshableTower(model, "doc", cache=tmp_path / "good")
    used, runner, precision, _ = tower_runner(model, "doc", "openvino", "bf16", 1, keep=False, refreshable=good)
    assert (used, precision) == ("openvino", "bf16") and runner.check["min_gate"] == tower_check.BF16_MIN_GATE
    assert good.reason is None and backends.graph_cached(model, "doc", cache=tmp_path / "good")
    real_refreshed = backends.RefreshableTower.refreshed
    last_norm = [n for n, _ in model.named_parameters() if n.endswith("output.LayerNorm.bias")][-1]

    def slightly_wrong(self, m):
        graph = real_refreshed(self, m)
        for memory, name, _ in self.buffers:
            if name == last_norm:
                memory += 2e-3
        return graph

    monkeypatch.setattr(backends.RefreshableTower, "refreshed", slightly_wrong)
    bad = backends.RefreshableTower(model, "doc", cache=tmp_path / "bad")
    used, runner, precision, _ = tower_runner(model, "doc", "openvino", "bf16", 1, keep=False, refreshable=bad)
    assert (used, precision) == ("openvino", "bf16") and runner.check["passed"]  # converted as it is
    assert bad.reason is not None and "component off by" in bad.reason and "probe texts" in bad.reason, bad.reason
    assert not backends.graph_cached(model, "doc", cache=tmp_path / "bad")


@pytest.mark.slow
def test_the_model_code_is_in_the_export_key(tiny_model_dir, tmp_path, monkeypatch):
    """A change to the model modules' source (a fix to pooling or a head) is a new export, with no version to
    bump by hand; the same code finds its export."""
    model = _model(tiny_model_dir, pooling="mean", normalize=True)
    cache = tmp_path / "cache"
    first = OpenVinoTower(model, cache=cache)
    again = OpenVinoTower(model, cache=cache)
    assert first.converted and not again.converted and again.folder == first.folder
    key, digest = export_cache.graph_key(model, "doc"), export_cache.tower_digest(model, "doc")
    monkeypatch.setattr(export_cache, "model_code_digest", lambda: "the model code, changed")
    assert export_cache.tower_digest(model, "doc") != digest and export_cache.graph_key(model, "doc") != key
    changed = OpenVinoTower(model, cache=cache)
    assert changed.converted and changed.folder != first.folder and changed.check["passed"]


@pytest.mark.slow
def test_a_bf16_check_stands_on_the_fp32_export_only_where_its_fp32_check_passed_on_this_cpu(
        tiny_model_dir, tmp_path, monkeypatch):
    """An export keeps its fp32 check against torch (made when the export is made); a bf16 tower's check on the
    corpus's passages then compares with the export compiled in fp32 and leaves torch's tower alone. Where that
    check is missing, failed the fp32 gate, was made on another CPU, or the export's files are altered, torch's
    fp32 vectors are the reference again, and the export is checked in fp32 then and kept for the next time."""
    from pipeline.config import ModelConfig
    from pipeline.models import tower_check as tc

    real_compile = OpenVinoTower._compile

    def as_bf16(self, converted, xml, precision):  # the bf16 path on any CPU
        real_compile(self, converted, xml, precision)
        if precision == "bf16":
            self.precision = "bf16"

    monkeypatch.setattr(OpenVinoTower, "_compile", as_bf16)
    cfg = ModelConfig(name_or_path=str(tiny_model_dir), pooling="mean", normalize=True, doc_max_length=64)
    cache = tmp_path / "cache"
    texts = [f"passage {i} about {' '.join(['lists'] * i)}" for i in range(40)]
    OpenVinoTower(BiEncoder.load(cfg).eval(), cache=cache)  # the export, checked in fp32 against torch
    (folder,) = [f for f in (cache / "openvino").iterdir() if not f.name.startswith(".")]
    (kept,) = folder.glob("check-*.json")
    figures = json.loads(kept.read_text())
    assert figures["precision"] == "fp32" and figures["on"] == "probe texts", figures

    def bf16_check(tag):
        lazy = BiEncoder.load(cfg, defer=True).eval()
        tc._REFERENCES.clear()
        tower = OpenVinoTower(lazy, precision="bf16", cache=cache, calibration=[f"{tag} {t}" for t in texts])
        assert tower.check["passed"] and tower.check["texts"] == 32, tower.check
        return tower.check["reference"], lazy.deferred

    assert bf16_check("first") == ("openvino-fp32", True)  # torch's tower never loaded
    kept.write_text(json.dumps({**figures, "max_error": 1e-3}))  # a check that failed the fp32 gate
    assert bf16_check("second") == ("torch-fp32", False)
    again = json.loads(kept.read_text())  # with torch loaded, the export was checked in fp32 again and kept
    assert again["max_error"] <= tc.FP32_MAX_ERROR and again["texts"] == len(tc.PROBE_WORDS), again
    assert bf16_check("third") == ("openvino-fp32", True)
    real_key = tc.cpu_key
    monkeypatch.setattr(tc, "cpu_key", lambda: "another-cpu")  # kept on another CPU: not this one's
    assert bf16_check("fourth") == ("torch-fp32", False)
    monkeypatch.setattr(tc, "cpu_key", real_key)
    lazy = BiEncoder.load(cfg, defer=True)
    assert tc.verified_export(lazy, "doc", cache=cache) is not None
    (folder / "tower.xml").write_text((folder / "tower.xml").read_text() + " ")  # the export altered
    assert tc.verified_export(lazy, "doc", cache=cache) is None and lazy.deferred
