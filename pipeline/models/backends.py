"""Inference backends of a tower for encoding on a CPU (`encode.backend`).

- `torch`: the model as it is (eager; bf16 autocast where the CPU has native bf16).
- `openvino`: the tower (transformer + pooling + normalisation) converted once to OpenVINO's IR and
  run by its CPU plugin (fused attention, MLP and layer-norm kernels; bf16 through its inference
  precision where the CPU has it natively). Measured on the FAQ with MiniLM on a 2-core AVX512-BF16
  EPYC (bench/encode.py): 2.2x torch's fp32 at cosine 1.000000, 1.5x torch's bf16.
- `auto`: openvino on a CPU when it is installed and passes its check, else torch.

The conversion (~1.5 s for MiniLM) is cached under `export_cache()` in a folder named by a digest of
everything the tower's output depends on: the model folder's files, the tower's settings (pooling,
normalisation, prompt length, the tokenizer's input names) and the torch, transformers and OpenVINO
versions. Another model, or the same folder with a changed file, is another digest, so a stale export
is never used; an export is written to a temporary folder and renamed into place, its `export.json`
last, so a half-written one is never read. The cache is not kept in the model's folder: a model may
sit in a read-only package, and files added there would change its digest.

Every OpenVINO tower is checked when it is made: on a probe of token batches of several lengths its
vectors must have a cosine of at least 0.9999 with torch's fp32 ones (or, in bf16, be no further from
them than torch's own bf16, less 1e-4). A tower that fails is refused (`openvino`) or replaced by
torch, and the reason kept (`auto`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError, PipelineError
from ..io_utils import sha256_files

BACKENDS = ("auto", "torch", "openvino")
EXPORT_VERSION = 1  # bump when the conversion changes: earlier exports are not used
COSINE_GATE = 0.9999
INT8_MEAN_GATE = 0.99  # int8: the probe's mean cosine to torch fp32 (a broken quantisation, not its known cost)


def export_cache() -> Path:
    """Where converted towers are kept: $PIPELINE_EXPORT_CACHE, else the user's cache folder."""
    if os.environ.get("PIPELINE_EXPORT_CACHE"):
        return Path(os.environ["PIPELINE_EXPORT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dense-retrieval-pipeline" / "exports"


def openvino_available() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(backend: str, device: str | torch.device = "cpu", precision: str = "fp32") -> str:
    """`auto` -> openvino on a CPU when OpenVINO is installed, else torch; an explicit choice is
    checked (openvino runs on the CPU only, and must be installed; int8 needs openvino and nncf)."""
    if backend not in BACKENDS:
        raise ConfigError(f"encode.backend={backend!r}: expected one of {list(BACKENDS)}")
    cpu = torch.device(device).type == "cpu"
    if precision == "int8":
        if backend == "torch" or not cpu:
            raise ConfigError("encode.precision=int8 runs in OpenVINO on a CPU: it needs encode.backend=openvino "
                              "or auto, and no GPU")
        try:
            import nncf  # noqa: F401
        except ImportError:
            raise ConfigError("encode.precision=int8 quantises the model with NNCF, which is not installed "
                              "(pip install nncf)") from None
        backend = "openvino"
    if backend == "auto":
        return "openvino" if cpu and openvino_available() else "torch"
    if backend == "openvino":
        if not cpu:
            raise ConfigError("encode.backend=openvino runs on the CPU; this encoder has a GPU "
                              "(encode.backend=torch or auto)")
        if not openvino_available():
            raise ConfigError("encode.backend=openvino: the openvino package is not installed "
                              "(pip install openvino; or encode.backend=torch / auto)")
    return backend


class _Tower(torch.nn.Module):
    """One side of a BiEncoder as a module of positional token arrays (what the converter traces)."""

    def __init__(self, model, side: str):
        super().__init__()
        self.model, self.side = model, side

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            batch["token_type_ids"] = token_type_ids
        return self.model.encode_queries(batch) if self.side == "query" else self.model.encode_docs(batch)


def _input_names(model, side: str) -> list[str]:
    tok = model.token_spec(side)[0]
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in tok("probe", truncation=True):
        names.append("token_type_ids")
    return names


def tower_digest(model, side: str) -> str:
    """What the tower's output depends on: the model folder's files, its settings and the versions."""
    import openvino
    import transformers

    from .loading import resolve_model_path

    cfg = model.cfg
    path = resolve_model_path(cfg.query_name_or_path if side == "query" and cfg.query_name_or_path
                              else cfg.name_or_path)
    h = hashlib.sha256(sha256_files(p for p in Path(path).rglob("*") if p.is_file()).encode())
    settings = {"side": side, "pooling": cfg.pooling, "normalize": cfg.normalize,
                "prompt_length": model._prompt_lengths[side], "inputs": _input_names(model, side),
                "dim": model.dim, "export_version": EXPORT_VERSION, "torch": torch.__version__,
                "transformers": transformers.__version__, "openvino": openvino.__version__}
    h.update(json.dumps(settings, sort_keys=True).encode())
    return h.hexdigest()


def _token_batches(model, side: str, tokens: dict, size: int) -> list[dict[str, np.ndarray]]:
    """`tokenize_sorted`'s arrays as padded numpy batches of `size` rows (as embed_tokens pads them)."""
    from .tokens import padded_batch

    tok = model.token_spec(side)[0]
    n = len(tokens["lengths"])
    offsets = np.concatenate([[0], np.cumsum(tokens["lengths"], dtype=np.int64)])
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    left = getattr(tok, "padding_side", "right") == "left"
    return [padded_batch(tokens, offsets, s, min(n, s + size), pad, left) for s in range(0, n, size)]


def _probe_batches(model, side: str) -> list[dict[str, np.ndarray]]:
    """Token batches of several lengths (real words of the tokenizer's vocabulary, seeded)."""
    from .tokens import tokenize_sorted

    tok, prefix, max_len = model.token_spec(side)
    rng = np.random.default_rng(0)
    vocab = [w for w in sorted(tok.get_vocab()) if w.isalpha() and len(w) > 2][:5000] or ["probe"]
    texts = [" ".join(rng.choice(vocab, size=n)) for n in (3, 9, 17, 30, 48, 70, 100, 140)]
    return _token_batches(model, side, tokenize_sorted(tok, texts, prefix, max_len), 4)


def _publish(tmp: Path, folder: Path, marker: str) -> None:
    """Put a finished export (`tmp`, its `marker` written last) at `folder`: a half-written one there
    is replaced; one another process finished meanwhile is kept."""
    if folder.exists():
        shutil.rmtree(folder, ignore_errors=True)
    try:
        os.rename(tmp, folder)
    except OSError:
        if not (folder / marker).exists():
            raise


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


class OpenVinoTower:
    """A tower compiled by OpenVINO for the CPU: numpy token batch in, float32 (B, D) vectors out.
    `precision` int8: the exported tower quantised by NNCF (post-training, transformer preset with
    SmoothQuant), calibrated on `calibration` (texts), cached beside the export under their digest."""

    def __init__(self, model, side: str = "doc", precision: str = "fp32", threads: int = 1,
                 cache: str | Path | None = None, calibration: list[str] | None = None):
        import openvino as ov

        self.side, self.names = side, _input_names(model, side)
        self.digest = tower_digest(model, side)
        self.folder = Path(cache or export_cache()) / "openvino" / self.digest[:32]
        self.converted = self.quantized = False
        xml = self._export(model)
        if precision == "int8":
            xml = self._quantize(model, xml, calibration or [])
        hint = {"bf16": "bf16", "fp16": "f16"}.get(precision, "f32")
        core = ov.Core()
        self.compiled = core.compile_model(core.read_model(str(xml)), "CPU", {
            "INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": max(1, int(threads)),
            "PERFORMANCE_HINT": "LATENCY"})
        # what the plugin will really compute in (a bf16 hint on a CPU without bf16 runs f32)
        used = str(self.compiled.get_property("INFERENCE_PRECISION_HINT")).lower()  # e.g. <Type: 'bfloat16'>
        self.precision = "bf16" if "bfloat16" in used or "bf16" in used else (
            "fp16" if "float16" in used or "f16" in used else "fp32")
        if precision == "int8":
            self.precision = "int8"  # the quantised matmuls in int8, the rest in f32
        self.request = self.compiled.create_infer_request()
        self.check = self._check(model)

    def _export(self, model) -> Path:
        """The cached IR for this digest, converted and put in place first when missing."""
        xml, done = self.folder / "tower.xml", self.folder / "export.json"
        if done.exists() and xml.exists() and (self.folder / "tower.bin").exists():
            return xml
        import openvino as ov

        self.folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.folder.name}-", dir=self.folder.parent))
        try:
            tower = _Tower(model, self.side).eval()
            example = tuple(torch.from_numpy(_probe_batches(model, self.side)[0][n]) for n in self.names)
            import warnings

            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the tracer's notes on the model's Python branches
                converted = ov.convert_model(tower, example_input=example,
                                             input=[(n, [-1, -1], ov.Type.i64) for n in self.names])
            ov.save_model(converted, str(tmp / "tower.xml"), compress_to_fp16=False)
            (tmp / "export.json").write_text(json.dumps({"digest": self.digest, "side": self.side,
                                                         "inputs": self.names}, indent=2) + "\n")
            _publish(tmp, self.folder, "export.json")
            self.converted = True
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return xml

    def _quantize(self, model, xml: Path, texts: list[str]) -> Path:
        """The int8 tower for these calibration texts: cached under their tokens' digest."""
        import openvino as ov

        from .tokens import tokenize_sorted

        if not texts:
            raise PipelineError("encode.precision=int8 needs calibration texts (the corpus's first passages)")
        tok, prefix, max_len = model.token_spec(self.side)
        tokens = tokenize_sorted(tok, texts, prefix, max_len)
        key = hashlib.sha256(tokens["ids"].tobytes() + tokens["lengths"].tobytes()).hexdigest()[:16]
        folder = self.folder / f"int8-{key}"
        if (folder / "quantized.json").exists() and (folder / "tower.xml").exists():
            return folder / "tower.xml"
        import nncf

        logging.getLogger("nncf").setLevel(logging.ERROR)  # its INFO lines and progress bars stay out
        batches = _token_batches(model, self.side, tokens, 8)
        core = ov.Core()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            quantized = nncf.quantize(core.read_model(str(xml)),  # (its progress bars stay out of the terminal)
                                      nncf.Dataset(batches, lambda b: [b[n] for n in self.names]),
                                      subset_size=len(batches), model_type=nncf.ModelType.TRANSFORMER,
                                      preset=nncf.QuantizationPreset.PERFORMANCE)
        tmp = Path(tempfile.mkdtemp(prefix=f".int8-{key}-", dir=self.folder))
        try:
            ov.save_model(quantized, str(tmp / "tower.xml"), compress_to_fp16=False)
            (tmp / "quantized.json").write_text(json.dumps({"calibration_texts": len(texts), "tokens": key,
                                                            "nncf": nncf.__version__}, indent=2) + "\n")
            _publish(tmp, folder, "quantized.json")
            self.quantized = True
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return folder / "tower.xml"

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        out = self.request.infer([np.ascontiguousarray(batch[n], dtype=np.int64) for n in self.names])
        return np.array(out[0], dtype=np.float32)

    def _check(self, model) -> dict:
        """Cosine of this tower's vectors with torch's on the probe batches (see the module doc)."""
        encode = model.encode_queries if self.side == "query" else model.encode_docs
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        ours, ref, near = [], [], []
        with torch.inference_mode():
            for b in _probe_batches(model, self.side):
                t = {n: torch.from_numpy(b[n]) for n in self.names}
                ref.append(encode(t).float().numpy())
                if dtype is not None:
                    with torch.autocast("cpu", dtype=dtype):
                        near.append(encode(t).float().numpy())
                ours.append(self(b))
        ref_v = np.concatenate(ref)
        model.check_finite(ref_v, self.side)  # a broken model is named as such, not as a failed conversion
        cosines = _cosines(np.concatenate(ours), ref_v)
        cos = float(cosines.min())
        if self.precision == "int8":  # a quality cost by design (stated, measured by the bench): a sanity floor
            return {"min_cosine": round(cos, 6), "mean_cosine": round(float(cosines.mean()), 6),
                    "gate": INT8_MEAN_GATE, "passed": bool(cosines.mean() >= INT8_MEAN_GATE)}
        gate = COSINE_GATE
        if near:  # bf16: at least as close to fp32 as torch's own bf16 (less 1e-4)
            gate = min(COSINE_GATE, float(_cosines(np.concatenate(near), ref_v).min()) - 1e-4)
        return {"min_cosine": round(cos, 6), "gate": round(gate, 6), "passed": bool(cos >= gate)}


def tower_runner(model, side: str, backend: str, precision: str, threads: int,
                 device: str | torch.device = "cpu", cache: str | Path | None = None,
                 calibration: list[str] | None = None):
    """(backend used, runner or None for torch, precision used, note). `auto` falls back to torch
    when OpenVINO's tower fails to convert or fails its check, with the reason in `note` (int8 never
    falls back: torch has no int8 path here)."""
    chosen = resolve_backend(backend, device, precision)
    if chosen == "torch":
        return "torch", None, precision, None
    try:
        runner = OpenVinoTower(model, side, precision, threads, cache, calibration)
    except PipelineError:  # the model itself is unusable (non-finite vectors), or int8 has no calibration
        raise
    except Exception as e:  # conversion or compilation failed
        if backend == "openvino" or precision == "int8":
            raise PipelineError(f"encode.backend=openvino: the model could not be converted or compiled "
                                f"({type(e).__name__}: {e})") from None
        return "torch", None, precision, f"openvino could not convert this model ({type(e).__name__}), torch used"
    if not runner.check["passed"]:
        if "mean_cosine" in runner.check:
            reason = (f"openvino's int8 vectors had a mean cosine of {runner.check['mean_cosine']} with torch's fp32 "
                      f"ones (needed {runner.check['gate']})")
        else:
            reason = (f"openvino's vectors had a minimum cosine of {runner.check['min_cosine']} with torch's fp32 "
                      f"ones (needed {runner.check['gate']})")
        if precision == "int8":
            raise PipelineError(f"encode.precision=int8: {reason}; the quantised model is broken, use fp32 or bf16")
        if backend == "openvino":
            raise PipelineError(f"encode.backend=openvino: {reason}; use encode.backend=torch")
        return "torch", None, precision, reason + ", torch used"
    return "openvino", runner, runner.precision, None
