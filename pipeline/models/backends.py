"""Inference backends of a tower for encoding on a CPU (`encode.backend`).

- `torch`: the model as it is (eager; bf16 autocast where the CPU has native bf16).
- `openvino`: the tower (transformer + pooling + normalisation) converted once to OpenVINO's IR and
  run by its CPU plugin (fused attention, MLP and layer-norm kernels; bf16 through its inference
  precision where the CPU has it natively). Measured on the FAQ with MiniLM on a 2-core AVX512-BF16
  EPYC (bench/encode.py): 2.2x torch's fp32 at cosine 1.000000, 1.5x torch's bf16.
- `auto`: openvino on a CPU when it is installed and passes its check, else torch; `pipeline encode` makes
  a model's export only for a corpus that pays it back (index/encode.backend_by_cost) and otherwise runs
  torch, unless the export is cached.

The conversion (~1.5 s for MiniLM) is kept in the export cache (models/export_cache.py: the keys, and
how an entry is made under a lock, checked against its digests and repaired).

Every OpenVINO tower is checked when it is made, against torch's fp32 vectors, at what a correct
conversion gives in its precision (models/tower_check.py): fp32 on seeded probe batches (the same
computation: minimum cosine >= 0.9999 and no component off by more than 2.5e-6 of its vector's length);
bf16 on the corpus's first 32 passages (minimum cosine >= 0.999); int8 on its first 128 (mean >= 0.99,
minimum >= 0.95): tower_check.check_texts. The figures go into each shard's marker and embeddings.json. A tower
that fails is refused (`openvino`, int8) or replaced by torch, and the reason kept (`auto`). An export's fp32 check
is made when it is made and kept beside it per CPU; on the passages, the export compiled in fp32 then stands in for
torch (tower_check.verified_export), so a first encode of a corpus with the export cached loads no torch weights.

A model being trained (validation inside training) is converted in memory, once: `RefreshableTower`
(models/openvino_graph.py, with the conversion itself)
writes the step's weights into that conversion at every validation (see it for how each constant is tied
to the weight it holds, and when a graph cannot be refreshed). Its weights are never cached as an export;
the converted graph is, under a digest of the architecture (`graph_key`, in `openvino-graphs/`), once it
has passed the fp32 check with real weights (a tower used in bf16 is verified in fp32 first), so a later
run of the architecture converts nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError, PipelineError
from .export_cache import (GRAPH_MARKER, cached_entry, entry_lock, entry_problem, export_cache_dir, in_use,  # noqa: F401
                           graph_cached, graph_key, input_names, parameter_shapes, set_aside, tower_digest)
# the gates live in tower_check (a test changes them there); the probe texts are named here too
from .tower_check import (PROBE_WORDS, SHORT_PROBE_WORDS, against_torch, check_figures, check_memo,  # noqa: F401
                          check_texts, cpu_key, describe_check, gates_for, passes, probe_batches, probe_check,
                          read_figures, release_references, token_batches, verified_export)
from . import openvino_graph
from .openvino_graph import RefreshableTower, _Tower, convert_tower  # noqa: F401  (the names users import)

_input_names, _probe_batches = input_names, probe_batches  # (bench/encode.py's names for them)
BACKENDS = ("auto", "torch", "openvino")


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


def export_cached(model, side: str = "doc", cache: str | Path | None = None) -> bool:
    """Whether the export cache holds this model's OpenVINO export, whole (its digests): read from the model's
    files, no weights loaded."""
    from .export_cache import entry_problem

    try:
        folder = export_cache_dir(cache) / "openvino" / tower_digest(model, side)[:32]
    except Exception:  # a cache path that is a file, a model folder that cannot be read: not cached
        return False
    return entry_problem(folder, "export.json") is None


def cpu_hint(core, precision: str) -> str:
    """OpenVINO's inference precision hint for `precision` on this CPU: bf16 or f16 only where the plugin lists it
    among its OPTIMIZATION_CAPABILITIES (AVX512-BF16/AMX; AVX512-FP16/AMX-FP16), f32 elsewhere. On an AVX512 CPU
    without BF16 the plugin accepts a bf16 hint, reports it back and still computes almost every op in f32
    (measured: 1 of 7 ops of a matmul graph in bf16), so a bf16 hint there would be a wrong label, not a speed-up.
    An f16 hint without native f16 runs bf16 where the CPU has that, as the plugin itself does."""
    try:
        caps = {str(c).upper() for c in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")}
    except RuntimeError:
        caps = set()
    if precision == "bf16":
        return "bf16" if "BF16" in caps else "f32"
    if precision == "fp16":
        return "f16" if "FP16" in caps else "bf16" if "BF16" in caps else "f32"
    return "f32"


class OpenVinoTower:
    """A tower compiled by OpenVINO for the CPU: numpy token batch in, float32 (B, D) vectors out.
    `precision` int8: the exported tower quantised by NNCF (post-training, transformer preset with
    SmoothQuant), calibrated on `calibration` (the corpus's first passages), cached beside the export
    under a digest of their tokens and the quantisation's settings. bf16 and int8 are checked on the
    first passages (the user's own text: tower_check.check_texts), fp32 on seeded probe batches."""

    def __init__(self, model, side: str = "doc", precision: str = "fp32", threads: int = 1,
                 cache: str | Path | None = None, calibration: list[str] | None = None, keep: bool = True,
                 refreshable: "RefreshableTower | None" = None):
        self.side, self.names = side, input_names(model, side)
        self.threads = max(1, int(threads))
        self.converted = self.quantized = self.refreshed = False
        self.stale: str | None = None  # why this tower may no longer be used (RefreshableTower.refreshed)
        self.notes: list[str] = []
        self.keep, self._cache = keep, cache
        # the cache entry read here is held in use (shared) until it is compiled: no prune removes it meanwhile
        with contextlib.ExitStack() as held:
            self._build(model, side, precision, calibration, refreshable, held)

    def _build(self, model, side, precision, calibration, refreshable, held) -> None:
        import openvino as ov

        keep, cache = self.keep, self._cache
        if keep:
            self.digest = tower_digest(model, side)
            self.folder = export_cache_dir(cache) / "openvino" / self.digest[:32]
            held.enter_context(in_use(self.folder))
            xml = self._export(model)
            if precision == "int8":
                xml = self._quantize(model, xml, calibration or [])
        else:
            # keep=False: the module as it is now (a model being trained, whose weights are not its folder's),
            # converted in memory and never cached
            if precision == "int8":
                raise PipelineError("an int8 tower is quantised into the export cache: it needs keep=True")
            self.digest, self.folder = None, None
            xml = Path("(in memory)")
            self.converted = True
        self.model_file = xml  # the IR compiled below (the export's, or an int8 entry's): its check is its own
        self._core = ov.Core()
        self._hint = cpu_hint(self._core, precision)
        written = False  # the graph is a RefreshableTower's, this step's weights written in
        if keep:
            converted = self._core.read_model(str(xml))
        else:  # converted once and refreshed with this step's weights where it can be, else converted now
            fits = refreshable is not None and refreshable.fits(model, side)
            converted = refreshable.refreshed(model) if fits else None
            written = converted is not None
            self.refreshed = written and refreshable.checked
            if converted is None:
                converted = self._convert(model)
        self._compile(converted, xml, precision)
        self.check = self._check(model, calibration)
        if written and not refreshable.checked:  # its first check on the full probe texts
            # a graph is kept (and read back later for any precision) only once it passed the fp32 gate: a
            # tower used in bf16 or fp16 is verified in fp32 first (the bf16 gate is bf16's rounding, not a graph's)
            verified = self.check
            if self.check["passed"] and self.precision != "fp32":
                verified = probe_check(converted, model, side, PROBE_WORDS, self.threads)
            if verified["passed"]:
                refreshable.passed()
                self.notes.extend(refreshable.notes)
            else:  # a constant computed from the weights holds what the random ones gave: converted as it is
                refreshable.failed(f"with this model's weights written in, its graph gave {describe_check(verified)} "
                                   "(a constant of the graph is computed from the weights)")
                self._compile(self._convert(model), xml, precision)
                self.check = self._check(model, calibration)
        if written and refreshable.reason is None:  # compiled from the refreshable graph: the next refresh ends it
            refreshable.bind(self)

    def _compile(self, converted, xml: Path, precision: str) -> None:
        try:
            # no pinning: the plugin pins its threads to the machine's first cores as if the process owned
            # them, so two processes on one node (training workers validating side by side, encode actors)
            # both run on the same cores (2 ranks x 1 thread: 35 psg/s pinned, 60 not; one process: the same)
            self.compiled = self._core.compile_model(converted, "CPU", {
                "INFERENCE_PRECISION_HINT": self._hint, "INFERENCE_NUM_THREADS": self.threads,
                "PERFORMANCE_HINT": "LATENCY", "ENABLE_CPU_PINNING": False})
        except RuntimeError as e:  # OpenVINO's C++ error: its first line, and the entry it read
            first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
            raise PipelineError(f"OpenVINO could not load the converted model at {xml.parent} "
                                f"({first[:300]})") from None
        # what the plugin will really compute in (the hint was chosen from its capabilities: cpu_hint)
        used = str(self.compiled.get_property("INFERENCE_PRECISION_HINT")).lower()  # e.g. <Type: 'bfloat16'>
        self.precision = "bf16" if "bfloat16" in used or "bf16" in used else (
            "fp16" if "float16" in used or "f16" in used else "fp32")
        if precision == "int8":
            self.precision = "int8"  # the quantised matmuls in int8, the rest in f32
        self.request = self.compiled.create_infer_request()

    def _convert(self, model):
        """The tower as OpenVINO's model, in memory (dynamic batch and length)."""
        return openvino_graph.convert_tower(model, self.side)  # (looked up at each call: tests count conversions)

    def _export(self, model) -> Path:
        """The cached IR for this digest, converted and put in place first when missing or broken. Its fp32 check
        against torch (made on the way) is kept beside it, so a later use in bf16 or int8 checks against the
        export compiled in fp32 (`_check`) and needs no torch weights."""
        verified: dict = {}

        def make(tmp: Path) -> dict:
            import openvino as ov

            graph, owner, check = self._graph_with_weights(model)
            ov.save_model(graph, str(tmp / "tower.xml"), compress_to_fp16=False)
            del owner  # (the memory the graph's weight constants read, held until it is saved)
            verified.update(check or {})
            return {"digest": self.digest, "side": self.side, "inputs": self.names}

        self.converted = cached_entry(self.folder, "export.json", make, self.notes)
        if verified.get("passed"):
            _keep_figures(check_memo(self.folder, "fp32", None, self.digest, self.folder.name), _figures(verified))
        return self.folder / "tower.xml"

    def _graph_with_weights(self, model):
        """(graph, what holds its weights' memory, its fp32 check against torch or None): the tower with `model`'s
        weights for its export: the architecture's graph kept in the cache with
        the weights written in, or a conversion with random weights that is kept once it gives torch's
        vectors (RefreshableTower: a later model of the architecture, say each checkpoint of a training
        run, converts nothing); else (a constant computed from the weights, say) the model converted as it is."""
        tower = RefreshableTower(model, self.side, self._cache)
        graph = tower.refreshed(model)
        if graph is not None:
            words = SHORT_PROBE_WORDS if tower.checked else PROBE_WORDS
            check = probe_check(graph, model, self.side, words, self.threads)  # in fp32, whatever the export's use
            if check["passed"]:
                tower.passed()
                self.notes.extend(tower.notes)
                return graph, tower, check
            tower.failed(f"with the weights written in, its graph gave {describe_check(check)}")
        self.notes.extend(tower.notes)
        graph = self._convert(model)
        try:
            check = probe_check(graph, model, self.side, PROBE_WORDS, self.threads)
        except Exception:  # (compiling it fails the same way at its use, and says so there)
            check = None
        return graph, None, check

    def _quantize(self, model, xml: Path, texts: list[str]) -> Path:
        """The int8 tower for these calibration texts, cached under a digest of their tokens and of the
        quantisation (NNCF's version, preset, model type, sample count)."""
        import nncf

        from .tokens import tokenize_sorted

        if not texts:
            raise PipelineError("encode.precision=int8 needs calibration texts (the corpus's first passages)")
        from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, OverflowFix

        from .precision import cpu_has_vnni

        tok, prefix, max_len = model.token_spec(self.side)
        tokens = tokenize_sorted(tok, texts, prefix, max_len)
        batches = token_batches(model, self.side, tokens, 8)
        # MIXED: asymmetric activations (GELU's outputs are far from symmetric). Without VNNI the CPU
        # multiplies int8 through a 16-bit saturating instruction; NNCF's overflow fix (7-bit weights in
        # every layer) keeps it exact. FAQ, MiniLM, an AVX2 EPYC: test nDCG@10 0.8812 (fp32 0.8813);
        # the PERFORMANCE preset without the fix gave 0.8665 there.
        overflow = "first_layer_only" if cpu_has_vnni() else "enable"
        settings = {"nncf": nncf.__version__, "preset": "MIXED", "model_type": "TRANSFORMER",
                    "overflow_fix": overflow, "subset_size": len(batches), "batch": 8}
        key = hashlib.sha256(tokens["ids"].tobytes() + tokens["lengths"].tobytes()
                             + json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
        entry = self.folder / f"int8-{key}"

        def make(tmp: Path) -> dict:
            import openvino as ov

            logging.getLogger("nncf").setLevel(logging.ERROR)  # its INFO lines and progress bars stay out
            core = ov.Core()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                quantized = nncf.quantize(core.read_model(str(xml)),  # (its progress bars stay out of the terminal)
                                          nncf.Dataset(batches, lambda b: [b[n] for n in self.names]),
                                          subset_size=len(batches), model_type=nncf.ModelType.TRANSFORMER,
                                          preset=nncf.QuantizationPreset.MIXED,
                                          advanced_parameters=AdvancedQuantizationParameters(
                                              overflow_fix=OverflowFix(overflow)))
            ov.save_model(quantized, str(tmp / "tower.xml"), compress_to_fp16=False)
            return {"calibration_texts": len(texts), "tokens": key, **settings}

        self.quantized = cached_entry(entry, "quantized.json", make, self.notes)
        return entry / "tower.xml"

    def end(self, reason: str) -> None:
        """This tower may not be used any more (`reason` is the error a use raises); the compiled model and
        its request are let go."""
        self.stale, self.compiled, self.request = reason, None, None

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        if self.stale:
            raise PipelineError(self.stale)
        out = self.request.infer([np.ascontiguousarray(batch[n], dtype=np.int64) for n in self.names])
        return np.array(out[0], dtype=np.float32)

    def _check(self, model, texts: list[str] | None = None) -> dict:
        """This tower's vectors against torch's fp32 ones (see the module doc): bf16 and int8 on the
        user's passages (`texts`, the first check_texts(precision)), fp32 on the probe batches. A check's figures are
        kept in the export's folder per CPU and text sample, so an encode of the same corpus on the same
        machine does not pay for it twice. On the passages, the export compiled in fp32 stands in for torch once it
        has passed the fp32 gate on this CPU (tower_check.verified_export): no torch weights are loaded for it."""
        from .tokens import tokenize_sorted

        on_texts = self.precision in ("bf16", "int8") and texts
        sample = None
        if on_texts:
            tok, prefix, max_len = model.token_spec(self.side)
            sample = list(texts[:check_texts(self.precision)])
            batches = token_batches(model, self.side, tokenize_sorted(tok, sample, prefix, max_len), 16)
        else:  # a refreshed graph was checked whole when converted; wrong weights show on short texts too
            # (every layer acts on every token; an embedding table is written whole, the rows read vouch for it)
            batches = probe_batches(model, self.side, SHORT_PROBE_WORDS if self.refreshed else PROBE_WORDS)
        memo = check_memo(self.folder, self.precision, sample, self.digest, self.model_file.parent.name) \
            if self.keep else None
        figures = read_figures(memo)
        if figures is None:
            reference = verified_export(model, self.side, self.threads, self._cache, self.digest) \
                if on_texts and self.keep else None
            if reference is not None:
                ours = np.concatenate([self(b) for b in batches])
                ref_v = np.concatenate([reference(b) for b in batches])
                release_references()  # (the last check that uses it: the model check is made before)
            else:
                ours, ref_v = against_torch(self, model, self.side, batches)
                if on_texts and self.keep:  # torch is loaded now: the export verified in fp32 for the next time
                    self._keep_fp32_check(model)
            model.check_finite(ref_v, self.side)  # a broken model is named as such, not as a failed conversion
            figures = {**check_figures(ours, ref_v), "on": "the corpus's first passages" if on_texts else "probe texts",
                       "precision": self.precision, "reference": "openvino-fp32" if reference else "torch-fp32"}
            if memo is not None:
                _keep_figures(memo, figures)
        gates = gates_for(self.precision)
        return {**figures, **gates, "passed": passes(figures, gates)}


    def _keep_fp32_check(self, model) -> None:
        """The export (made before its fp32 check was kept, or checked on another CPU) checked in fp32 against
        torch on the probe texts, and the figures kept beside it when it passes: a later check on a corpus's
        passages then needs no torch weights (tower_check.verified_export)."""
        try:
            check = probe_check(str(self.folder / "tower.xml"), model, self.side, PROBE_WORDS, self.threads)
        except Exception:  # (the check this tower is making says what is wrong, if anything)
            return
        if check["passed"]:
            _keep_figures(check_memo(self.folder, "fp32", None, self.digest, self.folder.name), _figures(check))


def _figures(check: dict) -> dict:
    """A check's own figures (not its gates or verdict), as they are kept."""
    return {k: check[k] for k in ("min_cosine", "mean_cosine", "max_error", "texts", "on", "precision")}


def _keep_figures(memo: Path, figures: dict) -> None:
    """A check's figures kept at `memo` (a read-only cache: the check is simply made again next time)."""
    from ..io_utils import write_text_atomic

    with contextlib.suppress(OSError):
        write_text_atomic(memo, json.dumps(figures, sort_keys=True) + "\n")


def tower_runner(model, side: str, backend: str, precision: str, threads: int,
                 device: str | torch.device = "cpu", cache: str | Path | None = None,
                 calibration: list[str] | None = None, keep: bool = True, option: str = "encode",
                 refreshable: RefreshableTower | None = None):
    """(backend used, runner or None for torch, precision used, note). `auto` falls back to torch
    when OpenVINO's tower fails to convert or fails its check, with the reason in `note` (int8 never
    falls back: torch has no int8 path here); a cache entry repaired on the way is noted too.
    `calibration`: the corpus's first passages (int8's calibration, bf16's and int8's check)."""
    chosen = resolve_backend(backend, device, precision)
    if chosen == "torch":
        return "torch", None, precision, None
    try:
        runner = OpenVinoTower(model, side, precision, threads, cache, calibration, keep, refreshable)
    except PipelineError:  # the model itself is unusable (non-finite vectors), a cache path that is a file,
        raise              # int8 without calibration texts, or a converted model OpenVINO cannot load
    except Exception as e:  # conversion failed
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")[:300]
        if backend == "openvino" or precision == "int8":
            raise PipelineError(f"{option}.backend=openvino: the model could not be converted "
                                f"({type(e).__name__}: {first})") from None
        return "torch", None, precision, f"openvino could not convert this model ({type(e).__name__}), torch used"
    check = runner.check
    if not check["passed"]:
        reason = f"openvino's {check['precision']} vectors had {describe_check(check)}"
        if precision == "int8":
            raise PipelineError(f"encode.precision=int8: {reason}; the quantised model is too far from the model, "
                                "use fp32 or bf16")
        if backend == "openvino":
            raise PipelineError(f"{option}.backend=openvino: {reason}; use {option}.backend=torch")
        return "torch", None, precision, reason + ", torch used"
    notes = list(runner.notes)
    if precision == "int8":
        from .precision import cpu_has_vnni

        if not cpu_has_vnni():
            notes.append("this CPU has no int8 dot-product instructions (VNNI/AMX): int8 runs no faster than fp32 "
                         "here (FAQ, MiniLM, AVX2: 0.7x OpenVINO fp32); encode.precision=fp32 is the better choice")
    return "openvino", runner, runner.precision, ("; ".join(notes) or None)
