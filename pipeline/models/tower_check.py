"""The check of an OpenVINO tower (models/backends.py) against torch's fp32 vectors: the texts it is
checked on (seeded probe texts, or the corpus's first passages), the figures (cosines, and the largest
difference of one component as a fraction of its vector's length) and the gate of each precision, set at
what a correct conversion gives in it (the figures behind each gate are in its comment)."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import numpy as np
import torch

from .export_cache import input_names

COSINE_GATE = 0.9999   # fp32: min cosine to torch's fp32 vectors on the probe batches (the same computation)
# fp32: the largest difference of one component from torch's, as a fraction of the vector's length (scale-free:
# for a normalised tower, the absolute difference). A correct conversion, probe texts and 40 passages up to 256
# tokens, 1 and 2 threads: tiny BERT (cls, mean, max; normalised or not; fresh and moved weights) <= 1.6e-7,
# MiniLM (cls, mean, max) <= 2.4e-7 (minimum cosine 0.99999982 for both). The gate is ~10x that. A graph computing
# something else passes the cosine gate and fails this one: tiny BERT, a tanh Dense head's graph used for a hardtanh
# one, cosine 0.999968 and 5.7e-3 off (tests/unit/test_export_cache.py); issue 39: another activation 2.6e-4 off,
# a near-collinear model read through a tampered weight map 0.0285 off.
FP32_MAX_ERROR = 2.5e-6
BF16_MIN_GATE = 0.999  # bf16: min cosine to torch's fp32 vectors on the corpus's first passages
INT8_MEAN_GATE = 0.99  # int8, on the corpus's first passages: mean cosine to torch fp32 (a broken quantisation,
INT8_MIN_GATE = 0.95   # not its known cost: FAQ MiniLM min 0.986, mean 0.997) and a floor for the worst passage
CHECK_TEXTS = 128      # passages of the corpus's first ones that int8 is checked on (its mean gate wants many)
# bf16's error is its rounding, alike on every text of a model: MiniLM, OpenVINO bf16 on the family-25 EPYC, min
# cosine to torch fp32 over the first 16 / 32 / 128 / 512 passages: FAQ 0.999968 each, NFCorpus 0.999976, 0.999976,
# 0.999976, 0.999974 (the gate is 0.999). 32 passages cost a quarter of 128's torch fp32 pass, which was most of
# a first encode's start-up on a small corpus (bench/encode.py: ~4 s of 11.7 s at 880 passages).
BF16_CHECK_TEXTS = 32


def check_texts(precision: str) -> int:
    """How many of the corpus's first passages a tower in `precision` is checked on."""
    return BF16_CHECK_TEXTS if precision == "bf16" else CHECK_TEXTS


def token_batches(model, side: str, tokens: dict, size: int) -> list[dict[str, np.ndarray]]:
    """`tokenize_sorted`'s arrays as padded numpy batches of `size` rows (as embed_tokens pads them)."""
    from .tokens import padded_batch

    tok = model.token_spec(side)[0]
    n = len(tokens["lengths"])
    offsets = np.concatenate([[0], np.cumsum(tokens["lengths"], dtype=np.int64)])
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    left = getattr(tok, "padding_side", "right") == "left"
    return [padded_batch(tokens, offsets, s, min(n, s + size), pad, left) for s in range(0, n, size)]


PROBE_WORDS = (3, 9, 17, 30, 48, 70, 100, 140)  # the probe texts' lengths in words
SHORT_PROBE_WORDS = (3, 9, 17, 30)  # a refreshed tower's check: the graph is the one already checked


def probe_batches(model, side: str, words: tuple[int, ...] = PROBE_WORDS) -> list[dict[str, np.ndarray]]:
    """Token batches of several lengths (real words of the tokenizer's vocabulary, seeded)."""
    from .tokens import tokenize_sorted

    tok, prefix, max_len = model.token_spec(side)
    rng = np.random.default_rng(0)
    vocab = [w for w in sorted(tok.get_vocab()) if w.isalpha() and len(w) > 2][:5000] or ["probe"]
    texts = [" ".join(rng.choice(vocab, size=n)) for n in words]
    return token_batches(model, side, tokenize_sorted(tok, texts, prefix, max_len), 4)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


def cpu_key() -> str:
    """The CPU a check ran on (model name and ISA flags): a check's result holds for that CPU only."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "")
    flags = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("flags")), "")
    return hashlib.sha256(f"{model}|{flags}".encode()).hexdigest()[:16]


def check_figures(ours: np.ndarray, ref: np.ndarray) -> dict:
    """How far `ours` is from torch's fp32 vectors `ref`: cosines, and the largest difference of one component
    as a fraction of its vector's length."""
    cos = cosines(ours, ref)
    error = np.abs(ours - ref).max(1) / np.maximum(np.linalg.norm(ref, axis=1), 1e-12)
    return {"min_cosine": round(float(cos.min()), 6), "mean_cosine": round(float(cos.mean()), 6),
            "max_error": float(f"{float(error.max()):.3g}"), "texts": len(cos)}


def gates_for(precision: str) -> dict:
    """What a correct conversion gives in `precision` (see the module doc and the gates' comments)."""
    if precision == "int8":  # a quality cost by design (stated, measured by the bench): sanity floors
        return {"min_gate": INT8_MIN_GATE, "mean_gate": INT8_MEAN_GATE}
    if precision == "bf16":
        return {"min_gate": BF16_MIN_GATE}
    if precision == "fp32":
        return {"min_gate": COSINE_GATE, "max_error_gate": FP32_MAX_ERROR}
    return {"min_gate": COSINE_GATE}  # fp16 (a CPU with native fp16; not measured here)


def passes(figures: dict, gates: dict) -> bool:
    """Whether `figures` meet `gates` (written so that a NaN figure fails)."""
    return bool(figures["min_cosine"] >= gates["min_gate"]
                and ("mean_gate" not in gates or figures["mean_cosine"] >= gates["mean_gate"])
                and ("max_error_gate" not in gates or figures["max_error"] <= gates["max_error_gate"]))


def describe_check(check: dict) -> str:
    """A check's figures against its gates, as a reason says them."""
    said, need = f"a minimum cosine of {check['min_cosine']}", f">= {check['min_gate']}"
    if "mean_gate" in check:
        said, need = f"{said} and a mean of {check['mean_cosine']}", f"{need} and a mean >= {check['mean_gate']}"
    if "max_error_gate" in check:
        said += f" and a component off by {check['max_error']:.3g} of its vector's length"
        need += f" and <= {check['max_error_gate']:.2g} off"
    ref = ("the fp32 export's ones (verified against torch's)" if check.get("reference") == "openvino-fp32"
           else "torch's fp32 ones")
    return f"{said} with {ref} on {check['texts']} {check['on']} (needed {need})"


def against_torch(run, model, side: str, batches) -> tuple[np.ndarray, np.ndarray]:
    """(`run`'s vectors, torch's fp32 vectors) for the same token batches."""
    names = input_names(model, side)
    encode = model.encode_queries if side == "query" else model.encode_docs
    ours, ref = [], []
    with torch.inference_mode():
        for b in batches:
            ref.append(encode({n: torch.from_numpy(b[n]) for n in names}).float().numpy())
            ours.append(run(b))
    return np.concatenate(ours), np.concatenate(ref)


def probe_check(graph, model, side: str, words: tuple[int, ...], threads: int) -> dict:
    """`graph` compiled in fp32 against torch's fp32 vectors on the probe texts of `words`, at the fp32 gates
    (a converted graph is verified, and kept, at these only)."""
    run = _Fp32Export(graph, input_names(model, side), max(1, int(threads)))
    ours, ref = against_torch(run, model, side, probe_batches(model, side, words))
    said, gate = {**check_figures(ours, ref), "on": "probe texts", "precision": "fp32"}, gates_for("fp32")
    return {**said, **gate, "passed": passes(said, gate)}


def check_memo(folder: Path, precision: str, sample: list[str] | None, digest: str | None, ir_name: str) -> Path:
    """Where a check's figures are kept beside an export (`folder`): per precision, CPU, texts (the corpus's
    first passages in `sample`, or the probe texts), export and IR (`ir_name`: the export's folder, or an int8
    entry's)."""
    key = hashlib.sha256(json.dumps([precision, cpu_key(), sorted(sample) if sample else "probe",
                                     digest, ir_name]).encode()).hexdigest()[:16]
    return folder / f"check-{key}.json"


def read_figures(memo: Path | None) -> dict | None:
    """A kept check's figures, or None (none kept, unreadable, or not a check's)."""
    try:
        figures = json.loads(memo.read_text()) if memo is not None else None
    except (OSError, ValueError):
        return None
    if not isinstance(figures, dict) or not {"min_cosine", "mean_cosine", "max_error", "texts"} <= set(figures):
        return None
    return figures


class _Fp32Export:
    """An IR (a file, or a graph in memory) compiled in fp32: numpy token batch in, float32 vectors out (one
    request, locked)."""

    def __init__(self, source, names: list[str], threads: int):
        import openvino as ov

        self.names, self.threads, self._lock = names, threads, threading.Lock()
        self.request = ov.Core().compile_model(str(source) if isinstance(source, Path) else source, "CPU", {
            "INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads,
            "PERFORMANCE_HINT": "LATENCY", "ENABLE_CPU_PINNING": False}).create_infer_request()

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        with self._lock:
            out = self.request.infer([np.ascontiguousarray(batch[n], dtype=np.int64) for n in self.names])
            return np.array(out[0], dtype=np.float32)


_REFERENCES: dict[str, _Fp32Export] = {}  # the last one compiled (a first encode's two checks share it)
_REFERENCES_LOCK = threading.Lock()


def release_references() -> None:
    """Let the compiled fp32 export go (its weights' memory) once the checks that use it are made."""
    with _REFERENCES_LOCK:
        _REFERENCES.clear()


def verified_export(model, side: str, threads: int = 1, cache: str | Path | None = None,
                    digest: str | None = None) -> _Fp32Export | None:
    """The model's OpenVINO export compiled in fp32, when that export (whole: its digests) has passed the fp32
    check against torch's vectors on this CPU (its probe check, kept beside it when the export was made, or at a
    first use in fp32); else None. Its vectors stand in for torch's fp32 ones where a check only needs those
    (a bf16 or int8 tower's check on the corpus's passages, encode's check of the model's vectors): the fp32
    gate (no component off by more than 2.5e-6 of its vector's length) is far inside what those checks tell
    apart, and a first encode of a corpus with the export cached then loads no torch weights at all."""
    from .export_cache import export_cache_dir, in_use, tower_digest

    try:
        digest = digest or tower_digest(model, side)
        folder = export_cache_dir(cache) / "openvino" / digest[:32]
    except Exception:  # a cache path that is a file, a model folder that cannot be read: torch's vectors then
        return None
    with in_use(folder):  # from its check until it is compiled: no prune in another process removes it between
        return _verified_export(folder, model, side, threads, digest)


def _verified_export(folder, model, side, threads, digest) -> _Fp32Export | None:
    from .export_cache import entry_problem, mark_used

    if entry_problem(folder, "export.json") is not None:
        return None
    mark_used(folder)
    figures = read_figures(check_memo(folder, "fp32", None, digest, folder.name))
    if figures is None or figures.get("precision") != "fp32" or not passes(figures, gates_for("fp32")):
        return None
    xml = folder / "tower.xml"
    with _REFERENCES_LOCK:
        runner = _REFERENCES.get(str(xml))
        if runner is None:
            try:
                runner = _Fp32Export(xml, input_names(model, side), max(1, int(threads)))
            except Exception:  # (a plugin that cannot compile it: torch's vectors then, and the tower says why)
                return None
            _REFERENCES.clear()
            _REFERENCES[str(xml)] = runner
    return runner
