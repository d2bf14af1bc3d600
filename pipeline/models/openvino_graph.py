"""One side of a model as OpenVINO's graph: `convert_tower` (the model traced and converted in memory) and
`RefreshableTower` (a model being trained, converted once; each use writes the step's weights into the
graph, which is kept in the export cache under a digest of the architecture). models/backends.py compiles
and checks what these give (`OpenVinoTower`)."""

from __future__ import annotations

import json
import threading
import weakref
from pathlib import Path

import numpy as np
import torch

from .export_cache import (GRAPH_MARKER, cached_entry, entry_lock, entry_problem, export_cache_dir, graph_key,
                           in_use, input_names, mark_used, parameter_shapes, set_aside)
from .tower_check import probe_batches


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


_CONVERTING = threading.Lock()


def _telemetry_off() -> None:
    """OpenVINO's converter reports each conversion to Google Analytics unless the user has opted out
    (openvino_telemetry: ~38 events a conversion, each from a forked copy of this process waiting up to 3 s
    for the network; ~1.3 s a conversion where the network refuses at once, more where it drops packets,
    and a "Fatal Python error: Aborted" where the fork lands beside a running thread). Nothing of this tool
    reaches the network on its own: the converter's modules are pointed at the do-nothing Telemetry that
    OpenVINO ships for installs without openvino_telemetry (openvino.tools.ovc.telemetry_stub)."""
    import importlib
    import sys

    try:
        stub = importlib.import_module("openvino.tools.ovc.telemetry_stub")
    except ImportError:
        return  # another OpenVINO layout: nothing of ours to point
    for name in ("openvino.tools.ovc.convert_impl", "openvino.tools.ovc.telemetry_utils", "openvino.tools.ovc.utils",
                 "openvino.tools.ovc.main"):  # (the converter's command line, only where it is loaded)
        module = sys.modules.get(name)
        if module is None and not name.endswith(".main"):
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
        if getattr(module, "tm", stub) is not stub:
            module.tm = stub


def convert_tower(model, side: str, share_weights: bool = True):
    """One side of `model` as OpenVINO's model, in memory (dynamic batch and length)."""
    import warnings

    import openvino as ov

    _telemetry_off()
    names = input_names(model, side)
    tower = _Tower(model, side).eval()
    example = tuple(torch.from_numpy(probe_batches(model, side)[0][n]) for n in names)
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
    the architecture (`graph_key`: not the weights), once the graph has passed the fp32 check with real
    weights (a use in bf16 verifies it in fp32 first): a later run of the same architecture (the next trial of a sweep, DAR after DPR) converts
    nothing and writes its weights in at once. A graph used before (checked whole in this process, or
    before it was cached) is checked on the short probe texts (a weight written wrong shows on any text).

    A compiled model may read its weights from the graph's memory, which each refresh rewrites: every tower
    compiled from the graph (`bind`) is ended by the next refresh (`OpenVinoTower.end`), so using one raises
    a PipelineError instead of computing with another step's weights."""

    MARKER = GRAPH_MARKER

    def __init__(self, model, side: str = "doc", cache: str | Path | None = None):
        self.side, self._model = side, weakref.ref(model)
        self._shapes = parameter_shapes(model)
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
        self._users = weakref.WeakSet()  # the towers compiled from the graph as the last refresh left it
        if any(p.dtype != torch.float32 or p.device.type != "cpu" for p in model.parameters()):
            self.reason = "its weights are not float32 on the CPU"
            return
        try:
            self.entry = export_cache_dir(cache) / "openvino-graphs" / graph_key(model, side)[:32]
        except Exception as e:  # a cache path naming a file, say: converted, not kept (and said)
            self.notes.append(f"the converted graph is not kept in the export cache ({e})")
        try:
            if self.entry is not None and self._read_held():
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
        return side == self.side and self._model() is model and parameter_shapes(model) == self._shapes

    def fits(self, model, side: str) -> bool:
        """Whether this conversion is of `model`'s `side` (the same module, the same parameters) and can
        still be refreshed."""
        return self.reason is None and self.is_of(model, side)

    def refreshed(self, model):
        """The converted graph holding `model`'s weights as they are now, or None where it cannot be
        refreshed (`reason`)."""
        if self.reason is not None:
            return None
        # a compiled model may read its constants from the graph's memory, which is written below (an older
        # compiled tower drifted 0.047 from its own weights): every tower compiled before is ended first, so
        # using one raises instead of computing with another step's weights
        for tower in list(self._users):
            tower.end(f"this OpenVINO tower of the {self.side} side was compiled before the model's converted graph "
                      f"was refreshed with newer weights (use {self.uses + 1}), so it would compute with them; "
                      "compile a tower from the refreshed graph instead")
        self._users = weakref.WeakSet()
        self.uses += 1
        params = dict(model.named_parameters())
        with torch.no_grad():
            for memory, name, transposed in self.buffers:
                value = params[name].detach().float().cpu().numpy()
                np.copyto(memory, (value.T if transposed else value).reshape(memory.shape))
        return self.graph

    def bind(self, tower: "OpenVinoTower") -> None:
        """`tower` was compiled from the graph as it is now: the next `refreshed` ends it (`OpenVinoTower.end`)."""
        self._users.add(tower)

    def passed(self) -> None:
        """The graph, with real weights written in, passed the fp32 check on the full probe texts: later uses
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
                with entry_lock(self.entry):
                    set_aside(self.entry)
            cached_entry(self.entry, self.MARKER, make, self.notes)
        except Exception as e:  # a read-only or full cache: the next run converts again
            self.notes.append(f"the converted graph could not be kept in the export cache "
                              f"({getattr(e, 'strerror', None) or e})")

    def _read_held(self) -> bool:
        """The kept graph read, in use (export_cache.in_use) from its check until it is read: a prune in
        another process cannot remove it in between."""
        with in_use(self.entry):
            if entry_problem(self.entry, self.MARKER) is not None or not self._read():
                return False
            mark_used(self.entry)
            return True

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


def _holds(constant: np.ndarray, parameter: np.ndarray, transposed: bool) -> bool:
    """Whether `constant` is `parameter`'s values (reshaped, or a matrix transposed)."""
    if transposed:
        return parameter.ndim == 2 and np.array_equal(constant.reshape(parameter.shape[::-1]), parameter.T)
    return np.array_equal(constant.reshape(-1), parameter.reshape(-1))


