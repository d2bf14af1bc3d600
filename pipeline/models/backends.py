"""Inference backends of a tower for encoding on a CPU (`encode.backend`).

- `torch`: the model as it is (eager; bf16 autocast where the CPU has native bf16).
- `openvino`: the tower (transformer + pooling + normalisation) converted once to OpenVINO's IR and
  run by its CPU plugin (fused attention, MLP and layer-norm kernels; bf16 through its inference
  precision where the CPU has it natively). Measured on the FAQ with MiniLM on a 2-core AVX512-BF16
  EPYC (bench/encode.py): 2.2x torch's fp32 at cosine 1.000000, 1.5x torch's bf16.
- `auto`: openvino on a CPU when it is installed and passes its check, else torch.

The conversion (~1.5 s for MiniLM) is cached under `export_cache()` in a folder named by a digest of
everything the tower's output depends on: the model folder's files (each by its place in the folder,
symlinks followed), the tower's settings (pooling, normalisation, prompt length, the tokenizer's input
names) and the torch, transformers and OpenVINO versions. Another model, or the same folder with a
changed file, is another digest, so a stale export is never used. An entry is made under a lock in a
temporary folder and renamed into place with its marker (`export.json`, listing each file's digest):
two processes converting one model at once do it once, a complete entry is never replaced, one whose
files no longer match their digests is set aside and made again (with a note naming it), and what a
killed converter left is cleaned by the next. The cache is not kept in the model's folder: a model may
sit in a read-only package, and files added there would change its digest.

Every OpenVINO tower is checked when it is made, against torch's fp32 vectors: fp32 on seeded probe
batches (minimum cosine >= 0.9999, the same computation); bf16 on the corpus's first CHECK_TEXTS
passages (minimum cosine >= 0.999); int8 on the same passages (mean >= 0.99, minimum >= 0.95). The
figures go into each shard's marker and embeddings.json. A tower that fails is refused (`openvino`,
int8) or replaced by torch, and the reason kept (`auto`).

A model being trained (validation inside training) is converted in memory, once: `RefreshableTower`
writes the step's weights into that conversion at every validation (see it for how each constant is tied
to the weight it holds, and when a graph cannot be refreshed). Its weights are never cached as an export;
the converted graph is, under a digest of the architecture (`graph_key`, in `openvino-graphs/`), once it
has passed its check with real weights, so a later run of the architecture converts nothing.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError, PipelineError
from ..io_utils import sha256_files

BACKENDS = ("auto", "torch", "openvino")
EXPORT_VERSION = 3  # bump when the conversion changes: earlier exports are not used (3: made through the
# architecture's graph, which an export made now keeps for later models and for validation)
COSINE_GATE = 0.9999   # fp32: min cosine to torch's fp32 vectors on the probe batches (the same computation)
BF16_MIN_GATE = 0.999  # bf16: min cosine to torch's fp32 vectors on the corpus's first passages
INT8_MEAN_GATE = 0.99  # int8, on the corpus's first passages: mean cosine to torch fp32 (a broken quantisation,
INT8_MIN_GATE = 0.95   # not its known cost: FAQ MiniLM min 0.986, mean 0.997) and a floor for the worst passage
CHECK_TEXTS = 128      # passages of the corpus's first ones that bf16 and int8 are checked on


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
    """What the tower's output depends on: the model folder's files (each by its place in the folder,
    symlinks followed: models/loading.model_digest), its settings and the versions."""
    import openvino
    import transformers

    from .loading import model_digest, resolve_model_path

    cfg = model.cfg
    path = resolve_model_path(cfg.query_name_or_path if side == "query" and cfg.query_name_or_path
                              else cfg.name_or_path)
    h = hashlib.sha256(model_digest(path).encode())
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


PROBE_WORDS = (3, 9, 17, 30, 48, 70, 100, 140)  # the probe texts' lengths in words
SHORT_PROBE_WORDS = (3, 9, 17, 30)  # a refreshed tower's check: the graph is the one already checked


def _probe_batches(model, side: str, words: tuple[int, ...] = PROBE_WORDS) -> list[dict[str, np.ndarray]]:
    """Token batches of several lengths (real words of the tokenizer's vocabulary, seeded)."""
    from .tokens import tokenize_sorted

    tok, prefix, max_len = model.token_spec(side)
    rng = np.random.default_rng(0)
    vocab = [w for w in sorted(tok.get_vocab()) if w.isalpha() and len(w) > 2][:5000] or ["probe"]
    texts = [" ".join(rng.choice(vocab, size=n)) for n in words]
    return _token_batches(model, side, tokenize_sorted(tok, texts, prefix, max_len), 4)


# ---------------------------------------------------------------------------------------- the cache
# An entry (an export folder, or an `int8-*` folder inside one) is complete when its marker file is
# there and the files the marker lists have the digests it records. Whoever makes or repairs an entry
# holds its lock (`.<entry>.lock` beside it, fcntl.flock: also across the nodes sharing a home folder
# over NFS), so two encoders converting one model at once do the work once: the second waits, then
# finds the entry complete. A complete entry is never removed or replaced; one whose files no longer
# match their digests is set aside and made again, once, with a note naming it. What a killed converter
# left (`.<entry>-tmp-*`) is removed by the next lock holder.


def export_cache_dir(cache: str | Path | None = None) -> Path:
    """The cache folder, checked: $PIPELINE_EXPORT_CACHE (or `cache`) naming a file is a ConfigError."""
    folder = Path(cache) if cache is not None else export_cache()
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"PIPELINE_EXPORT_CACHE={folder}: not a folder (a file is there); point it at a folder "
                          "for the converted models (or unset it: the default is ~/.cache/dense-retrieval-pipeline)")
    return folder


@contextlib.contextmanager
def _entry_lock(entry: Path, wait: bool = True):
    """Exclusive lock of one cache entry, held while it is made, checked or repaired. Yields False
    (without the lock) when `wait` is off and another process holds it."""
    import fcntl

    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.parent / f".{entry.name}.lock", "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _file_digests(folder: Path, names) -> dict[str, str]:
    from ..io_utils import sha256_file

    return {n: sha256_file(folder / n) for n in names}


def entry_problem(entry: Path, marker: str) -> str | None:
    """None when `entry` is complete and whole; else why not ("missing" when there is no marker)."""
    try:
        record = json.loads((entry / marker).read_text())
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError) as e:
        return f"its {marker} is unreadable ({e})"
    files = record.get("files") or {}
    if not files:
        return f"its {marker} lists no file digests (made by an older version)"
    for name, want in files.items():
        try:
            got = _file_digests(entry, [name])[name]
        except OSError:
            return f"{name} is missing"
        if got != want:
            return f"{name} does not match its recorded digest (truncated or altered)"
    return None


def _set_aside(entry: Path) -> None:
    """Move a broken entry out of the way (one rename), then delete it."""
    aside = entry.with_name(f".{entry.name}-broken-{os.getpid()}-{os.urandom(4).hex()}")
    with contextlib.suppress(FileNotFoundError):
        os.rename(entry, aside)
        shutil.rmtree(aside, ignore_errors=True)


def _clean_temporaries(entry: Path) -> None:
    """What a converter killed while making `entry` left beside it (only the lock holder calls this)."""
    for tmp in entry.parent.glob(f".{entry.name}-tmp-*"):
        shutil.rmtree(tmp, ignore_errors=True)


def cached_entry(entry: Path, marker: str, make, notes: list[str]) -> bool:
    """Make sure `entry` holds a complete, whole export: `make(tmp)` writes one into a temporary folder
    (its files; the marker with their digests is written here, last) when there is none, or when the one
    there is broken (set aside first, with a note in `notes`). Returns True when this call made it."""
    if entry_problem(entry, marker) is None:
        if any(entry.parent.glob(f".{entry.name}-tmp-*")):  # a killed converter's leftovers, if nobody works now
            with _entry_lock(entry, wait=False) as held:
                if held:
                    _clean_temporaries(entry)
        return False
    with _entry_lock(entry):
        problem = entry_problem(entry, marker)
        if problem is None:  # another process made it while this one waited
            return False
        _clean_temporaries(entry)
        if problem != "missing" or entry.exists():
            notes.append(f"the export cache entry {entry} was broken ({problem if problem != 'missing' else 'incomplete'}); "
                         "set aside and made again")
            _set_aside(entry)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-tmp-", dir=entry.parent))
        try:
            record = make(tmp) or {}
            names = sorted(p.name for p in tmp.iterdir() if p.is_file())
            record["files"] = _file_digests(tmp, names)
            (tmp / marker).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
            os.rename(tmp, entry)  # the entry appears whole, marker included (nothing is there: checked above)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return True


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


def _cpu_key() -> str:
    """The CPU a check ran on (model name and ISA flags): a check's result holds for that CPU only."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "")
    flags = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("flags")), "")
    return hashlib.sha256(f"{model}|{flags}".encode()).hexdigest()[:16]


class OpenVinoTower:
    """A tower compiled by OpenVINO for the CPU: numpy token batch in, float32 (B, D) vectors out.
    `precision` int8: the exported tower quantised by NNCF (post-training, transformer preset with
    SmoothQuant), calibrated on `calibration` (the corpus's first passages), cached beside the export
    under a digest of their tokens and the quantisation's settings. bf16 and int8 are checked on the
    first CHECK_TEXTS of those passages (the user's own text), fp32 on seeded probe batches."""

    def __init__(self, model, side: str = "doc", precision: str = "fp32", threads: int = 1,
                 cache: str | Path | None = None, calibration: list[str] | None = None, keep: bool = True,
                 refreshable: "RefreshableTower | None" = None):
        import openvino as ov

        self.side, self.names = side, _input_names(model, side)
        self.threads = max(1, int(threads))
        self.converted = self.quantized = self.refreshed = False
        self.notes: list[str] = []
        self.keep, self._cache = keep, cache
        if keep:
            self.digest = tower_digest(model, side)
            self.folder = export_cache_dir(cache) / "openvino" / self.digest[:32]
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
        self._hint = {"bf16": "bf16", "fp16": "f16"}.get(precision, "f32")
        self._core = ov.Core()
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
            if self.check["passed"]:
                refreshable.passed()
                self.notes.extend(refreshable.notes)
            else:  # a constant computed from the weights holds what the random ones gave: converted as it is
                refreshable.failed(f"with this model's weights written in, its graph gave a minimum cosine of "
                                   f"{self.check['min_cosine']} with torch's vectors on {self.check['texts']} "
                                   f"{self.check['on']} (a constant of the graph is computed from the weights)")
                self._compile(self._convert(model), xml, precision)
                self.check = self._check(model, calibration)

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
            raise PipelineError(f"OpenVINO could not load the converted model at {xml.parent} ({first[:300]})") from None
        # what the plugin will really compute in (a bf16 hint on a CPU without bf16 runs f32)
        used = str(self.compiled.get_property("INFERENCE_PRECISION_HINT")).lower()  # e.g. <Type: 'bfloat16'>
        self.precision = "bf16" if "bfloat16" in used or "bf16" in used else (
            "fp16" if "float16" in used or "f16" in used else "fp32")
        if precision == "int8":
            self.precision = "int8"  # the quantised matmuls in int8, the rest in f32
        self.request = self.compiled.create_infer_request()

    def _convert(self, model):
        """The tower as OpenVINO's model, in memory (dynamic batch and length)."""
        return convert_tower(model, self.side)

    def _export(self, model) -> Path:
        """The cached IR for this digest, converted and put in place first when missing or broken."""
        def make(tmp: Path) -> dict:
            import openvino as ov

            graph, owner = self._graph_with_weights(model)
            ov.save_model(graph, str(tmp / "tower.xml"), compress_to_fp16=False)
            del owner  # (the memory the graph's weight constants read, held until it is saved)
            return {"digest": self.digest, "side": self.side, "inputs": self.names}

        self.converted = cached_entry(self.folder, "export.json", make, self.notes)
        return self.folder / "tower.xml"

    def _graph_with_weights(self, model):
        """(graph, what holds its weights' memory): the tower with `model`'s weights for its export: the architecture's graph kept in the cache with
        the weights written in, or a conversion with random weights that is kept once it gives torch's
        vectors (RefreshableTower: a later model of the architecture, say each checkpoint of a training
        run, converts nothing); else (a constant computed from the weights, say) the model converted as it is."""
        tower = RefreshableTower(model, self.side, self._cache)
        graph = tower.refreshed(model)
        if graph is not None:
            words = SHORT_PROBE_WORDS if tower.checked else PROBE_WORDS
            cosine = _probe_cosine(graph, model, self.side, words, self.threads)
            if cosine >= COSINE_GATE:
                tower.passed()
                self.notes.extend(tower.notes)
                return graph, tower
            tower.failed(f"with the weights written in, its graph gave a minimum cosine of {cosine:.6f}")
        self.notes.extend(tower.notes)
        return self._convert(model), None

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
        batches = _token_batches(model, self.side, tokens, 8)
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

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        out = self.request.infer([np.ascontiguousarray(batch[n], dtype=np.int64) for n in self.names])
        return np.array(out[0], dtype=np.float32)

    def _check(self, model, texts: list[str] | None = None) -> dict:
        """This tower's vectors against torch's fp32 ones (see the module doc): bf16 and int8 on the
        user's passages (`texts`, the first CHECK_TEXTS), fp32 on the probe batches. A check's figures are
        kept in the export's folder per CPU and text sample, so an encode of the same corpus on the same
        machine does not pay for it twice."""
        from .tokens import tokenize_sorted

        on_texts = self.precision in ("bf16", "int8") and texts
        if on_texts:
            tok, prefix, max_len = model.token_spec(self.side)
            sample = list(texts[:CHECK_TEXTS])
            batches = _token_batches(model, self.side, tokenize_sorted(tok, sample, prefix, max_len), 16)
        else:  # a refreshed graph was checked whole when converted; wrong weights show on short texts too
            # (every layer acts on every token; an embedding table is written whole, the rows read vouch for it)
            batches = _probe_batches(model, self.side, SHORT_PROBE_WORDS if self.refreshed else PROBE_WORDS)
        key = hashlib.sha256(json.dumps([self.precision, _cpu_key(), sorted(sample) if on_texts else "probe",
                                         self.digest, self.model_file.parent.name]).encode()).hexdigest()[:16]
        memo = self.folder / f"check-{key}.json" if self.keep else None
        try:
            figures = json.loads(memo.read_text()) if memo is not None else None
        except (OSError, ValueError):
            figures = None
        if figures is None:
            ours, ref_v = _against_torch(self, model, self.side, batches)
            model.check_finite(ref_v, self.side)  # a broken model is named as such, not as a failed conversion
            cosines = _cosines(ours, ref_v)
            figures = {"min_cosine": round(float(cosines.min()), 6), "mean_cosine": round(float(cosines.mean()), 6),
                       "texts": len(cosines), "on": "the corpus's first passages" if on_texts else "probe texts",
                       "precision": self.precision}
            if memo is not None:
                with contextlib.suppress(OSError):  # a read-only cache: the check is simply made again next time
                    from ..io_utils import write_text_atomic

                    write_text_atomic(memo, json.dumps(figures, sort_keys=True) + "\n")
        if self.precision == "int8":  # a quality cost by design (stated, measured by the bench): sanity floors
            gates = {"min_gate": INT8_MIN_GATE, "mean_gate": INT8_MEAN_GATE}
            passed = figures["min_cosine"] >= INT8_MIN_GATE and figures["mean_cosine"] >= INT8_MEAN_GATE
        else:
            gates = {"min_gate": BF16_MIN_GATE if self.precision == "bf16" else COSINE_GATE}
            passed = figures["min_cosine"] >= gates["min_gate"]
        return {**figures, **gates, "passed": bool(passed)}


def _against_torch(run, model, side: str, batches) -> tuple[np.ndarray, np.ndarray]:
    """(`run`'s vectors, torch's fp32 vectors) for the same token batches."""
    names = _input_names(model, side)
    encode = model.encode_queries if side == "query" else model.encode_docs
    ours, ref = [], []
    with torch.inference_mode():
        for b in batches:
            ref.append(encode({n: torch.from_numpy(b[n]) for n in names}).float().numpy())
            ours.append(run(b))
    return np.concatenate(ours), np.concatenate(ref)


def _probe_cosine(graph, model, side: str, words: tuple[int, ...], threads: int) -> float:
    """The least cosine between `graph`'s fp32 vectors and torch's on the probe texts of `words`."""
    import openvino as ov

    names = _input_names(model, side)
    request = ov.Core().compile_model(graph, "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                     "INFERENCE_NUM_THREADS": max(1, int(threads)),
                                                     "ENABLE_CPU_PINNING": False}).create_infer_request()
    ours, ref = _against_torch(
        lambda b: np.array(request.infer([np.ascontiguousarray(b[n], dtype=np.int64) for n in names])[0],
                           dtype=np.float32), model, side, _probe_batches(model, side, words))
    return float(_cosines(ours, ref).min())


_CONVERTING = threading.Lock()


def convert_tower(model, side: str, share_weights: bool = True):
    """One side of `model` as OpenVINO's model, in memory (dynamic batch and length)."""
    import warnings

    import openvino as ov

    names = _input_names(model, side)
    tower = _Tower(model, side).eval()
    example = tuple(torch.from_numpy(_probe_batches(model, side)[0][n]) for n in names)
    # one conversion at a time in a process: warnings.catch_warnings is not thread-safe (the tracer's notes
    # would leak from a thread converting beside another), and tracing holds the GIL most of the time anyway
    with _CONVERTING, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on the model's Python branches
        try:  # traced once: torch's check of the trace (a second trace, ~40 % of a conversion) is left out,
            # OpenVinoTower's own check of the converted tower against torch's vectors stands in for it
            from openvino.frontend.pytorch.ts_decoder import TorchScriptPythonDecoder

            source = TorchScriptPythonDecoder(tower, example_input=example, shared_memory=share_weights,
                                              trace_kwargs={"check_trace": False})
        except ImportError:  # another OpenVINO layout: its own tracing, check included
            source = tower
        return ov.convert_model(source, example_input=example, input=[(n, [-1, -1], ov.Type.i64) for n in names],
                                share_weights=share_weights)


class RefreshableTower:
    """One side of a model being trained, converted for OpenVINO once; each use writes the model's current
    weights into the converted graph and only compiles it (validation inside training: MiniLM on one
    thread, ~0.3 s to write the weights, compile and check against ~1.7 s to convert).

    The conversion is made with every parameter set to seeded random values (then put back: the same
    tensors, untouched), so the graph is the one the converter builds for weights in general (a model
    freshly initialised multiplies its layer norms by exactly 1, which the converter would drop) and each
    constant that holds a parameter is found by its values (as they are, reshaped or a matrix transposed).
    A constant the converter computed from parameters cannot be written that way: it still holds what
    the random values gave, so the first use's check against torch fails by a wide margin, and then
    `reason` says why and the caller converts the model as it is at every use.

    The graph and which constant holds which parameter are kept in the export cache under a digest of
    the architecture (`graph_key`: not the weights), once the graph has passed its check with real
    weights: a later run of the same architecture (the next trial of a sweep, DAR after DPR) converts
    nothing and writes its weights in at once. A graph used before (checked whole in this process, or
    before it was cached) is checked on the short probe texts (a weight written wrong shows on any text)."""

    MARKER = "graph.json"

    def __init__(self, model, side: str = "doc", cache: str | Path | None = None):
        import weakref

        self.side, self._model = side, weakref.ref(model)
        self._shapes = _parameter_shapes(model)
        self.reason: str | None = None
        self.buffers: list[tuple[np.ndarray, str, bool]] = []  # (constant's memory, parameter, transposed)
        self.names: list[str] = []  # the constants' friendly names, as `buffers`
        self.uses = 0
        self.graph = None
        self.checked = False  # passed a check on the full probe texts (at a use here, or before it was cached)
        self.source: str | None = None  # "cache" (read from the export cache) or "converted" (here)
        self.notes: list[str] = []
        self.entry: Path | None = None
        self._unreadable = False
        if any(p.dtype != torch.float32 or p.device.type != "cpu" for p in model.parameters()):
            self.reason = "its weights are not float32 on the CPU"
            return
        try:
            self.entry = export_cache_dir(cache) / "openvino-graphs" / graph_key(model, side)[:32]
        except Exception as e:  # a cache path naming a file, say: converted, not kept (and said)
            self.notes.append(f"the converted graph is not kept in the export cache ({e})")
        try:
            if self.entry is not None and entry_problem(self.entry, self.MARKER) is None and self._read():
                self.source, self.checked = "cache", True
        except Exception as e:  # an entry OpenVINO cannot read: converted instead, and made again once it passes
            self.buffers, self.names, self.graph, self._unreadable = [], [], None, True
            first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)[:200]
            self.notes.append(f"the converted graph kept at {self.entry} could not be read ({first}); converted again")
        try:
            if self.source is None:
                self._convert(model)
                self.source = "converted"
        except Exception as e:  # the caller's own conversion then fails too, and says so (or torch is used)
            first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")[:200]
            self.reason = f"the conversion failed ({type(e).__name__}: {first})"
            self.graph = None

    def is_of(self, model, side: str) -> bool:
        """Whether this conversion is of `model`'s `side` (refreshable or not)."""
        return side == self.side and self._model() is model and _parameter_shapes(model) == self._shapes

    def fits(self, model, side: str) -> bool:
        """Whether this conversion is of `model`'s `side` (the same module, the same parameters) and can
        still be refreshed."""
        return self.reason is None and self.is_of(model, side)

    def refreshed(self, model):
        """The converted graph holding `model`'s weights as they are now, or None where it cannot be
        refreshed (`reason`)."""
        if self.reason is not None:
            return None
        self.uses += 1
        params = dict(model.named_parameters())
        with torch.no_grad():
            for memory, name, transposed in self.buffers:
                value = params[name].detach().float().cpu().numpy()
                np.copyto(memory, (value.T if transposed else value).reshape(memory.shape))
        return self.graph

    def passed(self) -> None:
        """The graph, with real weights written in, passed its check on the full probe texts: later uses
        are checked on the short ones, and a graph converted here is kept in the export cache."""
        first, self.checked = not self.checked, True
        if not first or self.source != "converted" or self.entry is None or len(set(self.names)) != len(self.names):
            return

        def make(tmp: Path) -> dict:
            import openvino as ov

            ov.save_model(self.graph, str(tmp / "tower.xml"), compress_to_fp16=False)
            return {"weights": [[op, name, transposed] for op, (_, name, transposed) in zip(self.names, self.buffers)],
                    "side": self.side, "parameters": [[n, list(s)] for n, s in self._shapes]}

        try:
            if self._unreadable:  # an entry whose files match their digests, which OpenVINO could not read
                with _entry_lock(self.entry):
                    _set_aside(self.entry)
            cached_entry(self.entry, self.MARKER, make, self.notes)
        except Exception as e:  # a read-only or full cache: the next run converts again
            self.notes.append(f"the converted graph could not be kept in the export cache "
                              f"({getattr(e, 'strerror', None) or e})")

    def failed(self, reason: str) -> None:
        """The graph with real weights written in failed its first check: it cannot be refreshed."""
        self.reason, self.graph, self.buffers = reason, None, []

    def _own(self, op, name: str, transposed: bool, copy: bool = True) -> None:
        """The constant `op` of the graph reads memory of ours from now on, which `refreshed` writes
        (`copy`: holding the constant's values until then)."""
        import openvino as ov

        memory = (np.array(op.get_data(), dtype=np.float32, copy=True, order="C") if copy
                  else np.empty(tuple(op.get_output_shape(0)), dtype=np.float32))
        fresh = ov.op.Constant(ov.Tensor(memory, shared_memory=True), shared_memory=True)
        fresh.set_friendly_name(op.get_friendly_name())  # the name a kept graph finds it by
        op.output(0).replace(fresh.output(0))
        self.buffers.append((memory, name, transposed))
        self.names.append(op.get_friendly_name())

    def _convert(self, model) -> None:
        """Converted with seeded random weights, each constant holding a parameter found by its values."""
        import openvino as ov

        params = dict(model.named_parameters())
        generator = torch.Generator().manual_seed(0)
        marks = {name: torch.randn(p.shape, generator=generator) for name, p in params.items()}
        kept = {name: p.data for name, p in params.items()}
        try:
            for name, p in params.items():
                p.data = marks[name]
            self.graph = convert_tower(model, self.side, share_weights=False)
        finally:
            for name, p in params.items():
                p.data = kept[name]
        # a parameter's values, found by their first values and size (each way round for a matrix)
        heads: dict[tuple, list[tuple[str, bool]]] = {}
        for name, mark in marks.items():
            values = mark.numpy()
            for transposed in ((False, True) if values.ndim == 2 else (False,)):
                flat = (values.T if transposed else values).reshape(-1)
                heads.setdefault((flat.size, flat[:8].tobytes()), []).append((name, transposed))
        for op in self.graph.get_ordered_ops():
            if op.get_type_name() != "Constant" or op.get_element_type() != ov.Type.f32:
                continue
            value = op.get_data()
            flat = value.reshape(-1)
            source = next(((name, t) for name, t in heads.get((flat.size, flat[:8].tobytes()), [])
                           if _holds(value, marks[name].numpy(), t)), None)
            if source is not None:
                self._own(op, *source)

    def _read(self) -> bool:
        """The graph kept in the export cache for this architecture, its weight constants ours; False
        (converted instead) where it does not fit this model."""
        import openvino as ov

        record = json.loads((self.entry / self.MARKER).read_text())
        shapes = dict(self._shapes)
        weights = record.get("weights") or []
        if any(name not in shapes for _, name, _ in weights):
            return False
        graph = ov.Core().read_model(str(self.entry / "tower.xml"))
        ops = {op.get_friendly_name(): op for op in graph.get_ordered_ops() if op.get_type_name() == "Constant"}
        for op_name, name, transposed in weights:
            op = ops.get(op_name)
            size = int(np.prod(shapes[name])) if shapes[name] else 1
            if op is None or op.get_element_type() != ov.Type.f32 or int(np.prod(op.get_output_shape(0))) != size:
                self.buffers, self.names = [], []
                return False
            self._own(op, name, bool(transposed), copy=False)  # (each use writes the weights first)
        self.graph = graph
        return True


@functools.lru_cache(maxsize=1)
def _model_code_digest() -> str:
    """This package's model modules (encoder, heads, tokens: how a tower computes), read once a process."""
    h = hashlib.sha256()
    for source in sorted(Path(__file__).parent.glob("*.py")):
        h.update(source.read_bytes())
    return h.hexdigest()


def graph_key(model, side: str) -> str:
    """What a tower's converted graph depends on apart from the weights' values: the architecture (the
    transformer's config, the parameters' names and shapes, the buffers' values), the tower's settings,
    the code that computes it (this package's model modules) and the versions."""
    import openvino
    import transformers

    encoder = model.query_encoder if side == "query" else model.doc_encoder
    config = encoder.config.to_dict() if hasattr(encoder, "config") else {}
    config = {k: v for k, v in config.items() if not k.startswith("_") and k not in ("torch_dtype", "dtype",
                                                                                       "transformers_version")}
    h = hashlib.sha256()
    for name, buffer in model.named_buffers():
        h.update(name.encode() + buffer.detach().cpu().contiguous().numpy().tobytes())
    h.update(_model_code_digest().encode())
    settings = {"side": side, "config": config, "parameters": _parameter_shapes(model),
                "pooling": model.cfg.pooling, "normalize": model.cfg.normalize,
                "prompt_length": model._prompt_lengths[side], "inputs": _input_names(model, side),
                "dim": model.dim, "export_version": EXPORT_VERSION, "torch": torch.__version__,
                "transformers": transformers.__version__, "openvino": openvino.__version__}
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return h.hexdigest()


def graph_cached(model, side: str, cache: str | Path | None = None) -> bool:
    """Whether the export cache holds a converted graph of this architecture (RefreshableTower)."""
    try:
        entry = export_cache_dir(cache) / "openvino-graphs" / graph_key(model, side)[:32]
    except Exception:
        return False
    return (entry / RefreshableTower.MARKER).is_file()


def _parameter_shapes(model) -> list[tuple[str, tuple[int, ...]]]:
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def _holds(constant: np.ndarray, parameter: np.ndarray, transposed: bool) -> bool:
    """Whether `constant` is `parameter`'s values (reshaped, or a matrix transposed)."""
    if transposed:
        return parameter.ndim == 2 and np.array_equal(constant.reshape(parameter.shape[::-1]), parameter.T)
    return np.array_equal(constant.reshape(-1), parameter.reshape(-1))


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
        reason = (f"openvino's {check['precision']} vectors had a minimum cosine of {check['min_cosine']}"
                  + (f" and a mean of {check['mean_cosine']}" if "mean_gate" in check else "")
                  + f" with torch's fp32 ones on {check['texts']} {check['on']} (needed >= {check['min_gate']}"
                  + (f" and a mean >= {check['mean_gate']}" if "mean_gate" in check else "") + ")")
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
