"""models/backends: encode.backend (torch / openvino / auto), the export cache and the cosine check."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.config import ModelConfig
from pipeline.errors import ConfigError, PipelineError
from pipeline.models import BiEncoder
from pipeline.models import backends, export_cache, openvino_graph, tower_check
from pipeline.models.backends import OpenVinoTower, resolve_backend, tower_runner

pytest.importorskip("openvino")

from fixtures import TOWER_TEXTS as TEXTS, tower_model as _model, tower_tokens as _tokens  # noqa: E402


def test_resolve_backend_rules():
    assert resolve_backend("auto", "cpu") == "openvino" and resolve_backend("torch", "cpu") == "torch"
    assert resolve_backend("auto", "cuda") == "torch"  # GPUs: torch
    with pytest.raises(ConfigError, match="runs on the CPU"):
        resolve_backend("openvino", "cuda")
    with pytest.raises(ConfigError, match="expected one of"):
        resolve_backend("onnx", "cpu")


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_openvino_tower_gives_torchs_vectors(tiny_model_dir, tmp_path, pooling):
    model = _model(tiny_model_dir, pooling=pooling, normalize=pooling == "mean")
    toks = _tokens(model)
    ref = model.embed_tokens(toks, "doc", batch_size=8, precision="fp32")
    used, runner, precision, note = tower_runner(model, "doc", "auto", "fp32", 1, cache=tmp_path)
    assert (used, precision, note) == ("openvino", "fp32", None) and runner.check["passed"]
    got = model.embed_tokens(toks, "doc", batch_size=8, precision="fp32", runner=runner)
    np.testing.assert_allclose(got, ref, atol=1e-5)  # same rows, same order, same values


@pytest.mark.slow
def test_the_export_is_cached_by_digest_and_never_stale(tiny_model_dir, tmp_path, monkeypatch):
    """One export per model folder's digest; another model (other weights) of an architecture exported before
    is made from the graph kept then, its weights written in: nothing converted, torch's vectors."""
    converted = []
    real_convert = openvino_graph.convert_tower
    monkeypatch.setattr(openvino_graph, "convert_tower", lambda *a, **k: converted.append(1) or real_convert(*a, **k))
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    cache = tmp_path / "cache"
    first = OpenVinoTower(_model(model_dir), cache=cache)
    again = OpenVinoTower(_model(model_dir), cache=cache)
    assert first.converted and not again.converted and again.folder == first.folder
    assert json.loads((first.folder / "export.json").read_text())["digest"] == first.digest
    # the same folder with other weights: another digest, converted anew, and its own vectors
    changed = _model(model_dir)
    with torch.no_grad():
        for p in changed.doc_encoder.parameters():
            p.add_(0.05)
    changed.doc_encoder.save_pretrained(model_dir)
    changed = _model(model_dir)
    fresh = OpenVinoTower(changed, cache=cache)
    assert fresh.converted and fresh.digest != first.digest and fresh.check["passed"]
    assert converted == [1]  # the first export's conversion; the second wrote its weights into the kept graph
    toks = _tokens(changed)
    np.testing.assert_allclose(changed.embed_tokens(toks, "doc", runner=fresh), changed.embed_tokens(toks, "doc"),
                               atol=1e-5)
    # an export without its completion file (a kill half-way) is made again, not read
    (fresh.folder / "export.json").unlink()
    assert OpenVinoTower(changed, cache=cache).converted


@pytest.mark.slow
def test_a_tower_that_fails_its_check_is_refused_or_replaced_by_torch(tiny_model_dir, tmp_path, monkeypatch):
    model = _model(tiny_model_dir)
    monkeypatch.setattr(tower_check, "COSINE_GATE", 1.5)  # no tower can pass
    used, runner, precision, note = tower_runner(model, "doc", "auto", "fp32", 1, cache=tmp_path)
    assert (used, runner, precision) == ("torch", None, "fp32") and "minimum cosine" in note and "torch used" in note
    with pytest.raises(PipelineError, match="encode.backend=openvino: openvino's fp32 vectors had a minimum cosine"):
        tower_runner(model, "doc", "openvino", "fp32", 1, cache=tmp_path)
    assert tower_runner(model, "doc", "torch", "fp32", 1) == ("torch", None, "fp32", None)


@pytest.mark.slow
def test_bf16_is_checked_on_fewer_of_the_corpus_passages_than_int8(tiny_model_dir, tmp_path):
    """bf16's check reads the corpus's first BF16_CHECK_TEXTS passages (its error is rounding, alike on every
    text), int8's the first CHECK_TEXTS (its mean gate); each check's figures name how many it read."""
    assert tower_check.check_texts("bf16") == tower_check.BF16_CHECK_TEXTS < tower_check.CHECK_TEXTS
    assert tower_check.check_texts("int8") == tower_check.CHECK_TEXTS
    model = _model(tiny_model_dir)
    tower = OpenVinoTower(model, "doc", "fp32", 1, cache=tmp_path)  # compiled in fp32 on any CPU
    texts = [f"{t} {i}" for i in range(5) for t in TEXTS]  # 200 passages, more than either count
    for precision in ("bf16", "int8"):
        tower.precision = precision  # the check as that precision makes it (the gates are its own)
        check = tower._check(model, texts)
        assert check["texts"] == tower_check.check_texts(precision) and check["passed"]
        assert check["on"] == "the corpus's first passages"


@pytest.mark.slow
def test_int8_is_opt_in_calibrated_cached_and_refused_without_openvino(tiny_model_dir, tmp_path):
    """encode.precision=int8: OpenVINO + NNCF only (torch or a GPU refused), quantised on the given
    texts and cached under their digest; its vectors stay near fp32 (a known cost, bounded here)."""
    pytest.importorskip("nncf")
    model = _model(tiny_model_dir)
    calib = TEXTS[:24]
    used, runner, precision, note = tower_runner(model, "doc", "auto", "int8", 1, cache=tmp_path, calibration=calib)
    assert (used, precision) == ("openvino", "int8") and runner.quantized
    from pipeline.models.precision import cpu_has_vnni

    # on a CPU without VNNI/AMX the user is told int8 buys no speed there
    assert (note is None) if cpu_has_vnni() else ("no int8 dot-product instructions" in note)
    assert cpu_has_vnni("flags : fpu avx2 avx512_vnni") and not cpu_has_vnni("flags : fpu avx2 fma")
    toks = _tokens(model)
    ref = model.embed_tokens(toks, "doc", precision="fp32")
    got = model.embed_tokens(toks, "doc", precision="int8", runner=runner)
    cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.mean() >= 0.99 and runner.check["passed"] and "mean_cosine" in runner.check
    again = OpenVinoTower(model, "doc", "int8", 1, tmp_path, calibration=calib)
    assert not again.quantized and not again.converted  # both the export and the int8 tower from the cache
    other = OpenVinoTower(model, "doc", "int8", 1, tmp_path, calibration=TEXTS[24:])
    assert other.quantized  # other calibration texts: quantised anew
    with pytest.raises(ConfigError, match="int8 runs in OpenVINO"):
        tower_runner(model, "doc", "torch", "int8", 1)
    with pytest.raises(ConfigError, match="int8 runs in OpenVINO"):
        resolve_backend("auto", "cuda", "int8")
    with pytest.raises(PipelineError, match="calibration texts"):
        tower_runner(model, "doc", "openvino", "int8", 1, cache=tmp_path / "none", calibration=[])


_CONVERT = """
import json, sys
from pipeline.config import ModelConfig
from pipeline.models import BiEncoder
from pipeline.models.backends import OpenVinoTower
m = BiEncoder.load(ModelConfig(name_or_path=sys.argv[1], pooling="mean", normalize=True))
t = OpenVinoTower(m, "doc", sys.argv[3], 1, cache=sys.argv[2],
                  calibration=["alpha beta gamma", "delta epsilon", "zeta eta theta iota"] * 4)
print("RESULT" + json.dumps({"converted": t.converted, "quantized": t.quantized, "folder": str(t.folder),
                             "passed": t.check["passed"]}))
"""


def _convert_at_once(model_dir, cache, precision: str, n: int = 2) -> list[dict]:
    """`n` real processes converting one model into one cache at the same moment."""
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", _CONVERT, str(model_dir), str(cache), precision],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr[-2000:]
        out.append(json.loads(next(ln for ln in stdout.splitlines() if ln.startswith("RESULT"))[6:]))
    return out


@pytest.mark.slow
def test_two_processes_converting_one_model_into_one_cache_both_succeed(tiny_model_dir, tmp_path):
    """The export is made once (under the entry's lock); the other process waits and uses it. A complete
    entry is never replaced: its files keep their inodes, and an int8 entry inside it survives."""
    pytest.importorskip("nncf")
    cache = tmp_path / "cache"
    runs = _convert_at_once(tiny_model_dir, cache, "fp32")
    assert sorted(r["converted"] for r in runs) == [False, True] and all(r["passed"] for r in runs)
    folder = Path(runs[0]["folder"])
    inode = (folder / "tower.bin").stat().st_ino
    runs = _convert_at_once(tiny_model_dir, cache, "int8")
    assert not any(r["converted"] for r in runs) and sorted(r["quantized"] for r in runs) == [False, True]
    assert (folder / "tower.bin").stat().st_ino == inode
    int8 = [p for p in folder.iterdir() if p.name.startswith("int8-")]
    assert len(int8) == 1 and (int8[0] / "quantized.json").exists()
    again = _convert_at_once(tiny_model_dir, cache, "fp32", n=1)[0]
    assert not again["converted"] and (int8[0] / "quantized.json").exists()
    assert not [p for p in folder.parent.iterdir() if "-tmp-" in p.name or "-broken-" in p.name]


@pytest.mark.slow
def test_a_broken_cache_entry_is_set_aside_and_made_again_once(tiny_model_dir, tmp_path):
    from pipeline.models.backends import entry_problem

    model = _model(tiny_model_dir)
    cache = tmp_path / "cache"
    first = OpenVinoTower(model, cache=cache)
    assert first.converted and entry_problem(first.folder, "export.json") is None
    data = (first.folder / "tower.bin").read_bytes()
    (first.folder / "tower.bin").write_bytes(data[: len(data) // 2])  # truncated
    assert "tower.bin does not match" in entry_problem(first.folder, "export.json")
    fixed = OpenVinoTower(model, cache=cache)
    assert fixed.converted and len(fixed.notes) == 1 and str(first.folder) in fixed.notes[0]
    assert "tower.bin does not match its recorded digest" in fixed.notes[0] and "made again" in fixed.notes[0]
    toks = _tokens(model)
    np.testing.assert_allclose(model.embed_tokens(toks, "doc", runner=fixed), model.embed_tokens(toks, "doc"), atol=1e-5)
    (fixed.folder / "tower.xml").write_text("<garbled")  # the xml too: the same repair, never "could not convert"
    used, runner, precision, note = tower_runner(model, "doc", "openvino", "fp32", 1, cache=cache)
    assert used == "openvino" and "tower.xml does not match" in note
    # what a SIGKILLed converter left beside the entry is cleaned by the next run
    leftover = fixed.folder.parent / f".{fixed.folder.name}-tmp-abc123"
    leftover.mkdir()
    (leftover / "tower.xml").write_text("half")
    OpenVinoTower(model, cache=cache)
    assert not leftover.exists()
    assert not [p for p in fixed.folder.parent.iterdir() if "-broken-" in p.name]


def test_an_export_cache_that_is_a_file_is_one_clear_error(tiny_model_dir, tmp_path):
    f = tmp_path / "cache-file"
    f.write_text("x")
    with pytest.raises(PipelineError, match=r"PIPELINE_EXPORT_CACHE=.*cache-file: not a folder"):
        tower_runner(_model(tiny_model_dir), "doc", "auto", "fp32", 1, cache=f)


def test_an_export_cache_bound_that_is_not_a_size_is_one_clear_error_before_any_conversion(tiny_model_dir, tmp_path,
                                                                                             monkeypatch):
    monkeypatch.setenv("PIPELINE_EXPORT_CACHE_MAX_GB", "10GB")
    with pytest.raises(PipelineError, match=r"PIPELINE_EXPORT_CACHE_MAX_GB='10GB': not a size in GB"):
        tower_runner(_model(tiny_model_dir), "doc", "auto", "fp32", 1, cache=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()  # refused before anything was converted or written


def _nudge(model, seed: int, scale: float = 0.05):
    """Change every weight in place, as an optimizer step does."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


@pytest.mark.slow
def test_a_refreshable_tower_follows_the_weights_of_a_model_being_trained(tiny_model_dir, tmp_path, monkeypatch):
    """Converted once, with seeded random weights (a freshly initialised model multiplies its layer norms by
    exactly 1, which the converter would drop); at each use the model's weights as they are now (training
    steps change them in place) are written in, and the graph gives torch's vectors for them. The model is
    left as it was (the same tensors, the same values); no use after the first conversion converts."""
    converted = []
    real_convert = openvino_graph.convert_tower
    monkeypatch.setattr(openvino_graph, "convert_tower", lambda *a, **k: converted.append(1) or real_convert(*a, **k))
    model = _model(tiny_model_dir, pooling="mean", normalize=True)  # freshly initialised: layer norms exactly 1
    before = {n: (p.data_ptr(), p.detach().clone()) for n, p in model.named_parameters()}
    refreshable = backends.RefreshableTower(model, "doc", cache=tmp_path)
    for name, p in model.named_parameters():
        assert p.data_ptr() == before[name][0] and torch.equal(p.detach(), before[name][1]), name
    assert refreshable.reason is None and refreshable.fits(model, "doc") and refreshable.source == "converted"
    assert len(refreshable.buffers) == len(list(model.parameters())) - 2  # all but BERT's pooler (never used)
    toks = _tokens(model)
    for use in range(3):
        if use:
            _nudge(model, use)
        used, runner, precision, note = tower_runner(model, "doc", "openvino", "fp32", 1, keep=False,
                                                     option="validation", refreshable=refreshable)
        assert (used, precision, note) == ("openvino", "fp32", None) and runner.check["passed"]
        # checked whole at its first use; then on the short probe texts
        assert runner.refreshed == (use > 0)
        assert runner.check["texts"] == len(backends.SHORT_PROBE_WORDS if use else backends.PROBE_WORDS)
        ref = model.embed_tokens(toks, "doc", batch_size=8, precision="fp32")
        np.testing.assert_allclose(model.embed_tokens(toks, "doc", batch_size=8, precision="fp32", runner=runner),
                                   ref, atol=1e-5)
    assert converted == [1] and refreshable.uses == 3
    assert not refreshable.fits(_model(tiny_model_dir), "doc") and not refreshable.fits(model, "query")


@pytest.mark.slow
def test_a_converted_graph_is_kept_by_architecture_and_a_later_run_converts_nothing(tiny_model_dir, tmp_path,
                                                                                    monkeypatch):
    """Once its graph passed the check with real weights it is kept in the export cache under a digest of the
    architecture (not the weights): another model of that architecture (the next run, other weights) reads it,
    writes its own weights in, and is checked on the short probe texts. Another tower setting is another
    entry; an entry whose files were altered is not read, and is set aside and made again, with a note."""
    first = _model(tiny_model_dir, pooling="mean", normalize=True)
    _nudge(first, 0)
    tower = backends.RefreshableTower(first, "doc", cache=tmp_path)
    assert not backends.graph_cached(first, "doc", cache=tmp_path)  # kept once it has passed with real weights
    tower_runner(first, "doc", "openvino", "fp32", 1, keep=False, refreshable=tower)
    assert backends.graph_cached(first, "doc", cache=tmp_path)
    converted = []
    real_convert = openvino_graph.convert_tower
    monkeypatch.setattr(openvino_graph, "convert_tower", lambda *a, **k: converted.append(1) or real_convert(*a, **k))
    later = _model(tiny_model_dir, pooling="mean", normalize=True)
    _nudge(later, 7)  # other weights, the same architecture
    assert backends.graph_cached(later, "doc", cache=tmp_path)
    again = backends.RefreshableTower(later, "doc", cache=tmp_path)
    assert again.source == "cache" and again.reason is None and converted == []
    used, runner, _, note = tower_runner(later, "doc", "openvino", "fp32", 1, keep=False, refreshable=again)
    assert used == "openvino" and note is None and runner.refreshed and runner.check["passed"]
    assert runner.check["texts"] == len(backends.SHORT_PROBE_WORDS)
    toks = _tokens(later)
    np.testing.assert_allclose(later.embed_tokens(toks, "doc", batch_size=8, precision="fp32", runner=runner),
                               later.embed_tokens(toks, "doc", batch_size=8, precision="fp32"), atol=1e-5)
    assert converted == []
    # another pooling: another graph
    assert not backends.graph_cached(_model(tiny_model_dir, pooling="cls", normalize=True), "doc", cache=tmp_path)
    # a kept graph whose weights file was altered is not read: converted, then set aside and made again
    entry = tower.entry
    with open(entry / "tower.bin", "r+b") as f:
        f.truncate(1000)
    third = backends.RefreshableTower(later, "doc", cache=tmp_path)
    assert third.source == "converted" and converted == [1]
    used, runner, _, note = tower_runner(later, "doc", "openvino", "fp32", 1, keep=False, refreshable=third)
    assert used == "openvino" and runner.check["passed"] and "was broken" in note, note
    assert backends.entry_problem(entry, backends.RefreshableTower.MARKER) is None
    # one whose files match their digests but that OpenVINO cannot read: converted, said, and made again
    (entry / "tower.xml").write_text("<net>not a graph</net>")
    record = json.loads((entry / "graph.json").read_text())
    record["files"]["tower.xml"] = hashlib.sha256((entry / "tower.xml").read_bytes()).hexdigest()
    (entry / "graph.json").write_text(json.dumps(export_cache.seal(record)))
    fourth = backends.RefreshableTower(later, "doc", cache=tmp_path)
    assert fourth.source == "converted" and fourth.reason is None and converted == [1, 1]
    used, runner, _, note = tower_runner(later, "doc", "openvino", "fp32", 1, keep=False, refreshable=fourth)
    assert used == "openvino" and runner.check["passed"] and "could not be read" in note, note
    assert backends.RefreshableTower(later, "doc", cache=tmp_path).source == "cache"


@pytest.mark.slow
def test_the_short_check_of_a_refreshed_tower_catches_a_weight_written_wrong(tiny_model_dir, tmp_path, monkeypatch):
    """The short probe reads every layer: the last layer's feed-forward output matrix left unwritten fails
    the check (0.985 against the 0.9999 gate; the full probe gives the same figure), and auto encodes with
    torch, saying why. (A tiny random model's attention is near uniform: its query matrix barely shows.)"""
    model = _model(tiny_model_dir, pooling="mean", normalize=True)
    _nudge(model, 0)
    tower = backends.RefreshableTower(model, "doc", cache=tmp_path)
    tower_runner(model, "doc", "auto", "fp32", 1, keep=False, refreshable=tower)
    _nudge(model, 1)
    real = backends.RefreshableTower.refreshed
    last = max((n for n, _ in model.named_parameters() if n.endswith(".output.dense.weight") and "attention" not in n),
               key=lambda n: int(n.split(".layer.")[1].split(".")[0]))

    def stale_last_layer(self, m):
        graph = real(self, m)
        for memory, name, _ in self.buffers:
            if name == last:
                memory[...] = 0.0  # as if this weight had not been written
        return graph
    monkeypatch.setattr(backends.RefreshableTower, "refreshed", stale_last_layer)
    used, runner, _, note = tower_runner(model, "doc", "auto", "fp32", 1, keep=False, refreshable=tower)
    assert (used, runner) == ("torch", None) and "minimum cosine of 0.98" in note and "4 probe texts" in note, note


@pytest.mark.slow
def test_a_graph_with_a_constant_computed_from_the_weights_is_converted_each_time(tiny_model_dir, tmp_path,
                                                                                  monkeypatch):
    """A constant the converter folded from the (random) weights cannot be refreshed by copying weights in: the
    graph fails its first check by a wide margin, the tower says why, the model as it is is converted instead
    (torch's vectors for the current weights), and the graph is not kept."""
    model = _model(tiny_model_dir, pooling="mean", normalize=True)
    _nudge(model, 0)
    real_encode = model.encode_docs
    # a tower whose output adds a sum of one weight matrix: the converter folds that sum into one number
    monkeypatch.setattr(model, "encode_docs", lambda b: real_encode(b) + 0.01 * next(model.parameters()).sum())
    refreshable = backends.RefreshableTower(model, "doc", cache=tmp_path)
    used, runner, _, note = tower_runner(model, "doc", "openvino", "fp32", 1, keep=False, refreshable=refreshable)
    assert used == "openvino" and note is None and runner.check["passed"]  # converted with these weights
    assert not refreshable.fits(model, "doc") and refreshable.refreshed(model) is None
    assert "computed from the weights" in refreshable.reason and "minimum cosine" in refreshable.reason, refreshable.reason
    assert not backends.graph_cached(model, "doc", cache=tmp_path)


def test_a_conversion_that_fails_is_a_reason_and_auto_falls_back_to_torch(tiny_model_dir, tmp_path, monkeypatch):
    model = _model(tiny_model_dir, pooling="mean", normalize=True)

    def broken(*a, **k):
        raise ValueError("no such op\nmore detail")

    monkeypatch.setattr(openvino_graph, "convert_tower", broken)
    tower = backends.RefreshableTower(model, "doc", cache=tmp_path)
    assert tower.reason == "the conversion failed (ValueError: no such op)" and not tower.fits(model, "doc")
    assert tower.is_of(model, "doc")  # known for this model: a validator does not try it again
    used, runner, _, note = tower_runner(model, "doc", "auto", "fp32", 1, keep=False, refreshable=tower)
    assert (used, runner) == ("torch", None) and "could not convert" in note


@pytest.mark.slow
def test_a_conversion_reports_nothing_to_openvinos_telemetry(tiny_model_dir, monkeypatch):
    """OpenVINO's converter sends each conversion to Google Analytics from forked processes unless the user
    opted out (CI=true is one way it declines: unset here, as on a user's machine). Converting a tower starts
    no process and hands openvino_telemetry nothing to send."""
    import multiprocessing

    monkeypatch.delenv("CI", raising=False)
    started, sent = [], []
    monkeypatch.setattr(multiprocessing.Process, "start", lambda self: started.append(self))
    telemetry = pytest.importorskip("openvino_telemetry")
    from openvino_telemetry.utils.sender import TelemetrySender

    monkeypatch.setattr(TelemetrySender, "send", lambda self, *a, **k: sent.append(a))
    monkeypatch.setattr(telemetry.Telemetry, "send_event", lambda self, *a, **k: sent.append(a), raising=False)
    graph = openvino_graph.convert_tower(_model(tiny_model_dir), "doc")
    assert graph.inputs and started == [] and sent == []
