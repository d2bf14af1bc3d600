"""What runs on the Ray workers of `pipeline encode` (index/encode.py plans and drives it).

    read_slice / read_texts   one shard's rows of a Parquet part (only the row groups it needs, through
                              `pyarrow.fs`), its pids checked against the plan
    tokenize_shards           the optional CPU task stage (`encode.tokenize=stage`): read, check,
                              tokenise and length-sort a shard into flat token arrays
    ShardEncoder              the encoder actor: (tokenise,) encode in length-sorted batches at the
                              configured precision, and write the shard itself (vectors, ids, then
                              `.done`); the driver gets back a receipt (name, rows), never vectors
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from ..config import ModelConfig
from ..data.manifest import join_titles
from ..errors import PipelineError
from .shards import location, pids_digest, write_shard

SPEC_KEYS = ("name", "part_index", "part", "part_rows", "start", "end", "pids_sha256", "path")


def read_slice(path: str, start: int, end: int, columns=("pid", "title", "text")):
    """Rows [start, end) of a Parquet file, reading only the row groups that hold them.

    `path` is a local path or any URI `pyarrow.fs` understands (s3://, gs://, hdfs://).
    """
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    if "://" in path:
        filesystem, inner = pafs.FileSystem.from_uri(path)
    else:
        filesystem, inner = pafs.LocalFileSystem(), path
    with filesystem.open_input_file(inner) as f:
        pf = pq.ParquetFile(f)
        groups, first, offset = [], None, 0
        for g in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(g).num_rows
            if offset + n > start and offset < end:
                groups.append(g)
                first = offset if first is None else first
            offset += n
        if not groups:
            return pf.schema_arrow.empty_table().select(list(columns))
        table = pf.read_row_groups(groups, columns=list(columns))
    return table.slice(start - first, end - start)


def _check_pids(spec: dict, pids: list[str]) -> None:
    if pids_digest(pids) != spec["pids_sha256"]:  # checked before spending time on the model
        raise PipelineError(f"{spec['name']}: the pids read from {spec['part']} rows {spec['start']}-"
                            f"{spec['end']} are not the ones planned (the corpus changed during the run?); "
                            "run `pipeline encode` again")


def read_texts(spec: dict, title_join: str) -> tuple[list[str], list[str]]:
    """(pids, texts) of one shard's slice, the pids checked against the plan."""
    table = read_slice(spec["path"], spec["start"], spec["end"])
    pids = [str(p) for p in table.column("pid").to_pylist()]
    _check_pids(spec, pids)
    texts = join_titles(table.column("title"), table.column("text"), title_join).to_pylist()
    return pids, texts


# A task worker may run any number of tokenising tasks (0 = no limit, Ray's default for CPU tasks).
# Stated explicitly because remote args the actor stage lacks keep Ray Data from fusing this stage
# into the encoder actors: it fuses a task stage into the next actor stage when their remote args
# are equal, e.g. tokenize_cpus == cpus_per_actor (ray/data/_internal/logical/rules/operator_fusion.py).
TOKENIZE_MAX_CALLS = 0

_TOKENIZERS: dict[str, object] = {}  # per worker process: unpickled once, reused by later tasks


class TokenizeSpec:
    """What the tokenising stage needs, picklable: the tokenizer (pickled once on the driver), prefix, max length."""

    def __init__(self, tokenizer, prefix: str, max_len: int, title_join: str):
        import hashlib
        import pickle

        self.blob = pickle.dumps(tokenizer)
        self.key = hashlib.sha256(self.blob).hexdigest()
        self.prefix, self.max_len, self.title_join = prefix, max_len, title_join

    def tokenizer(self):
        import pickle

        tok = _TOKENIZERS.get(self.key)
        if tok is None:
            tok = _TOKENIZERS[self.key] = pickle.loads(self.blob)
        return tok


def tokenize_shards(batch: dict[str, np.ndarray], spec: TokenizeSpec) -> dict[str, np.ndarray]:
    """Ray Data task (CPU stage ahead of the encoder actors): read each shard's slice, check
    its pids, tokenise and length-sort it. Out: the spec plus the pids (one string) and the
    token arrays as bytes (`tokenize_sorted`'s ids int32, types int8, lengths int32, order int64)."""
    from ..models.tokens import tokenize_sorted

    out: dict[str, list] = {k: [] for k in (*SPEC_KEYS, "pids", "ids", "types", "lengths", "order",
                                            "tokenize_seconds", "tokenize_pid")}
    for i in range(len(batch["name"])):
        t0 = time.perf_counter()
        sp = _spec_at(batch, i)
        pids, texts = read_texts(sp, spec.title_join)
        toks = tokenize_sorted(spec.tokenizer(), texts, spec.prefix, spec.max_len)
        for k in SPEC_KEYS:
            out[k].append(sp[k])
        out["pids"].append("\n".join(pids))
        out["ids"].append(toks["ids"].tobytes())
        out["types"].append(toks["types"].tobytes() if toks["types"] is not None else b"")
        out["lengths"].append(toks["lengths"].tobytes())
        out["order"].append(toks["order"].astype(np.int64).tobytes())
        out["tokenize_seconds"].append(time.perf_counter() - t0)
        out["tokenize_pid"].append(os.getpid())
    kinds = {"tokenize_seconds": np.float64, "tokenize_pid": np.int64}
    return {k: np.array(v, dtype=kinds.get(k, object)) for k, v in out.items()}


def _spec_at(batch: dict[str, np.ndarray], i: int) -> dict:
    return {k: batch[k][i].item() if hasattr(batch[k][i], "item") else batch[k][i] for k in SPEC_KEYS}


def _tokens_at(batch: dict[str, np.ndarray], i: int) -> tuple[list[str], dict]:
    """The pids and token arrays `tokenize_shards` made for row i."""
    pids = str(batch["pids"][i]).split("\n") if len(str(batch["pids"][i])) else []
    types = bytes(batch["types"][i])
    toks = {"ids": np.frombuffer(bytes(batch["ids"][i]), dtype=np.int32),
            "types": np.frombuffer(types, dtype=np.int8) if types else None,
            "lengths": np.frombuffer(bytes(batch["lengths"][i]), dtype=np.int32),
            "order": np.frombuffer(bytes(batch["order"][i]), dtype=np.int64)}
    return pids, toks


class ShardEncoder:
    """Ray Data callable class: shard specs (or `tokenize_shards`' output) in, shards written to
    `out_dir`, a receipt per shard out. Given token arrays, the actor only runs the model."""

    def __init__(self, model_cfg: dict, title_join: str, torch_threads: int, precision: str, batch_size: int,
                 dtype: str, out_dir: str, model=None, backend: str = "torch", calibration: list[str] | None = None,
                 backend_why: str | None = None):
        import torch

        from ..models import BiEncoder
        from ..models.backends import tower_runner
        from ..models.precision import resolve_precision

        torch.set_num_threads(max(1, torch_threads))
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        # `model`: one already loaded with this config (a local encoder gets the driver's), else loaded here
        self.model = (model if model is not None else BiEncoder.load(ModelConfig(**model_cfg))).to(self.device).eval()
        # encode.backend: the tower run by torch, or converted (cached) and checked for OpenVINO;
        # the precision is what the backend really computes in
        # (int8: quantised by NNCF on `calibration`, the driver's pick of the corpus's first passages,
        # the same for every encoder)
        wanted = precision if precision == "int8" else resolve_precision(precision, self.device)
        t0 = time.perf_counter()
        self.backend, self.runner, self.precision, self.backend_note = tower_runner(
            self.model, "doc", backend, wanted, torch_threads, self.device, calibration=calibration)
        if self.runner is not None and self.runner.converted and self.runner.folder is not None:
            # this encoder made the model's export: a one-time cost, said with what it was (in the shards' markers:
            # worded so that a resumed encode reading them back says nothing untrue)
            made = (f"the model's OpenVINO export was made when these shards were encoded, once, in "
                    f"{time.perf_counter() - t0:.1f}s (converted, checked against torch, compiled): kept in the "
                    "export cache, a later encode of this model does not pay it")
            self.backend_note = "; ".join(n for n in (self.backend_note, made) if n)
        if backend_why:  # the driver chose torch for encode.backend=auto (index/encode.backend_by_cost): why
            self.backend_note = "; ".join(n for n in (backend_why, self.backend_note) if n)
        self.backend_check = getattr(self.runner, "check", None)  # the figures of its check against torch
        if self.runner is None:  # torch runs the tower: a deferred one (the driver's) loads now, in the start-up
            self.model.load_weights()
        self.title_join, self.batch_size, self.dtype = title_join, batch_size, dtype
        self.out_dir = location(out_dir)  # a local path or a storage URI, resolved on this worker
        self.node = None  # outside Ray (tests, plain use, encode.runner=local): no node id, and no Ray imported
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():  # get_runtime_context() would start a local Ray otherwise
            self.node = ray.get_runtime_context().get_node_id()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            return self._encode(batch)
        except Exception:
            # Any error stops the run (Ray Data does not retry a task's own exception): this actor
            # leaves (its CPUs or GPU with it) once the error is on its way to the driver, so nothing
            # a caller keeps of the failed run can hold it: a PipelineError, or an OSError such as a
            # full disk (actors are not restarted: `max_restarts=0`, a re-run resumes instead)
            import threading

            threading.Timer(2.0, os._exit, args=(0,)).start()
            raise

    def _encode(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from ..models.tokens import tokenize_sorted

        names, rows, secs = [], [], []
        staged = "ids" in batch
        for i in range(len(batch["name"])):
            spec = _spec_at(batch, i)
            t0 = time.perf_counter()
            info = {}
            if staged:  # tokenised by the CPU stage: only the model runs here
                pids, toks = _tokens_at(batch, i)
                _check_pids(spec, pids)
                info["tokenize_seconds"] = round(float(batch["tokenize_seconds"][i]), 3)
                info["tokenize_pid"] = int(batch["tokenize_pid"][i])
            else:
                pids, texts = read_texts(spec, self.title_join)
                tok, prefix, max_len = self.model.token_spec("doc")
                toks = tokenize_sorted(tok, texts, prefix, max_len)
            vectors = self.model.embed_tokens(toks, "doc", batch_size=self.batch_size, device=self.device,
                                              precision=self.precision, runner=self.runner)
            secs.append(time.perf_counter() - t0)
            try:
                write_shard(self.out_dir, spec, pids, vectors.astype(self.dtype, copy=False),
                            precision=self.precision, backend=self.backend, backend_note=self.backend_note,
                            backend_check=self.backend_check,
                            device=str(self.device), node=self.node, pid=os.getpid(),
                            tokenize="stage" if staged else "actor", seconds=round(secs[-1], 3), **info)
            except ValueError as e:
                raise PipelineError(str(e)) from None
            names.append(spec["name"])
            rows.append(len(pids))
        return {"name": np.array(names, dtype=object), "rows": np.array(rows, dtype=np.int64),
                "seconds": np.array(secs, dtype=np.float64)}
