"""Search an index from Python (a notebook, a script): no CLI, no Ray.

    from pipeline.search import Searcher
    searcher = Searcher("runs/scifact/index")            # the model that encoded the corpus
    searcher.search("what causes scurvy?", k=10)        # [(docid, score), ...], best first
    searcher.batch_search(["q one", "q two"], k=100)     # [[(docid, score), ...], ...]
    searcher.batch_search(texts, k=100, qids=ids)        # {qid: [(docid, score), ...]}

Scores and order are those of `pipeline retrieve` (same query encoder, same FAISS search).

`export_pyserini(index_dir, out_dir)` writes the layout pyserini's `FaissSearcher` opens
(`index` = the FAISS index, `docid` = one id per line); `QueryEncoder` is a pyserini-style
query encoder (`encode`, `encode_batch`) over our model, for
`FaissSearcher(out_dir, QueryEncoder(index_dir))`. A `Searcher` opens such a folder too.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Sequence

import numpy as np

from .config import IndexConfig, ModelConfig
from .errors import ConfigError, InputError, PipelineError
from .index.faiss_index import INDEX_FILE, META_FILE, PIDS_FILE
from .index.retrieve import check_query_vectors, query_model_config
from .models.precision import query_precision
from .io_utils import OutputKind, atomic_path, check_output, register_output_kind

PYSERINI_INDEX, PYSERINI_DOCID, EXPORT_FILE = "index", "docid", "pipeline_export.json"

register_output_kind(OutputKind("pyserini", True, "a pyserini FAISS folder (pipeline.search.export_pyserini)",
                                marker=EXPORT_FILE, allowed=(PYSERINI_INDEX, PYSERINI_DOCID)))

Hit = tuple[str, float]


class _PyseriniIndex:
    """A pyserini FAISS folder (`index` + `docid`), searchable like a LoadedIndex."""

    def __init__(self, folder: Path, cfg: IndexConfig | None):
        import faiss

        try:
            self.index = faiss.read_index(str(folder / PYSERINI_INDEX))
        except RuntimeError as e:
            raise InputError(folder / PYSERINI_INDEX, None, f"not a readable FAISS index ({str(e).splitlines()[0]})") from None
        with open(folder / PYSERINI_DOCID, encoding="utf-8") as f:
            self.pids = [line.rstrip() for line in f]  # as pyserini reads it
        if len(self.pids) != self.index.ntotal:
            raise InputError(folder / PYSERINI_DOCID, None, f"{len(self.pids)} ids for {self.index.ntotal} vectors")
        self.meta = index_meta(folder)
        from .index.search_params import set_search_params

        set_search_params(self.index, cfg)

    def search(self, queries: np.ndarray, k: int):
        return self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k)


def open_index(index_dir: str | Path, cfg: IndexConfig | None = None):
    """Our index folder (index.json + index.faiss + pids.txt) or a pyserini one (index + docid);
    a storage URI (s3://...) of our index is fetched to a local copy first."""
    from .index.faiss_index import local_index_dir

    from .index.faiss_index import load_index

    folder = local_index_dir(index_dir)
    if not (folder / META_FILE).exists() and (folder / PYSERINI_INDEX).is_file() and (folder / PYSERINI_DOCID).is_file():
        return _PyseriniIndex(folder, cfg)
    return load_index(folder, cfg)  # one part, or several (their parts kept loaded once searched)


def index_meta(index_dir: str | Path) -> dict:
    """index.json of our folder, or what `export_pyserini` recorded of it; {} for a foreign pyserini folder."""
    from .index.faiss_index import local_index_dir

    folder = local_index_dir(index_dir)
    for path, key in ((folder / META_FILE, None), (folder / EXPORT_FILE, "index_meta")):
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except ValueError as e:
                raise InputError(path, None, f"unreadable ({e})") from None
            return (data.get(key) or {}) if key else data
    if (folder / PYSERINI_INDEX).is_file():
        return {}
    raise InputError(folder / META_FILE, None, "no index here: run `pipeline index` first")


def _load_model(model, meta: dict, where: Path):
    """None: the model that encoded the corpus; a ModelConfig, a model directory, or a loaded BiEncoder."""
    from .models import BiEncoder

    if model is None:
        if not meta.get("model_config"):
            raise ConfigError(f"{where}: the index does not say which model encoded it; "
                              "pass one: Searcher(index_dir, model='path/to/model')")
        return BiEncoder.load(query_model_config(meta, None, str(where)))
    if isinstance(model, ModelConfig):
        return BiEncoder.load(model)
    if isinstance(model, (str, os.PathLike)):
        return BiEncoder.load(ModelConfig(name_or_path=str(model)))
    if not hasattr(model, "embed"):
        raise ConfigError(f"model must be None, a ModelConfig, a model directory or a BiEncoder, not {type(model).__name__}")
    return model


def _device(device):
    if device is not None:
        return str(device)
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class QueryEncoder:
    """Our query tower with pyserini's QueryEncoder interface (`encode(text)` -> (D,), `encode_batch`)."""

    def __init__(self, model=None, device=None, batch_size: int = 64, index_dir: str | Path | None = None):
        meta = index_meta(index_dir) if index_dir is not None and model is None else {}
        self.model = _load_model(model, meta, Path(index_dir or "."))
        self.device = _device(device)
        self.model.to(self.device).eval()
        self.batch_size = batch_size
        self.precision = query_precision()  # as `pipeline retrieve` encodes them, whatever the index holds

    def encode_batch(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise ConfigError("queries must be a list of strings")
        return self.model.embed(list(texts), "query", batch_size=self.batch_size, device=self.device,
                                precision=self.precision)

    def encode(self, text: str, **_) -> np.ndarray:
        return self.encode_batch([text])[0]


class Searcher:
    """Dense search over an index folder, query encoding included.

    `model`: None (the model recorded in the index: same tower, pooling, prefixes and
    lengths as `pipeline retrieve`), a ModelConfig, a model directory, or a BiEncoder.
    `device`: "cpu", "cuda", ... (None: CUDA when available).
    """

    def __init__(self, index_dir: str | Path, model=None, device=None, index_cfg: IndexConfig | None = None,
                 batch_size: int = 64):
        self.index_dir = Path(index_dir)
        self.index = open_index(self.index_dir, index_cfg)
        self.encoder = QueryEncoder(_load_model(model, self.index.meta, self.index_dir), device, batch_size)
        self.model, self.device = self.encoder.model, self.encoder.device
        dim = getattr(self.model, "dim", None)
        if dim is not None and dim != self.index.index.d:
            raise PipelineError(f"the query model gives {dim}-dimensional vectors but the index at {self.index_dir} "
                                f"holds {self.index.index.d}-dimensional ones; use the model that encoded the corpus")

    @property
    def docids(self) -> list[str]:
        pids = self.index.pids
        return pids.tolist() if hasattr(pids, "tolist") else list(pids)

    def __len__(self) -> int:
        return int(self.index.index.ntotal)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Query vectors (N, D) float32, exactly as `pipeline retrieve` computes them."""
        return self.encoder.encode_batch(texts)

    def search_vectors(self, vectors: np.ndarray, k: int = 10) -> list[list[Hit]]:
        """Top-k (docid, score) per query vector, best first."""
        k = _check_k(k)
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.index.index.d:
            raise ConfigError(f"query vectors must be (N, {self.index.index.d}), got {vectors.shape}")
        check_query_vectors(vectors, [f"vector {i}" for i in range(len(vectors))])  # NaN, inf or overflowing
        scores, rows = self.index.search(vectors, k)
        pids = self.index.pids
        return [[(pids[r], float(s)) for s, r in zip(srow, rrow) if r >= 0] for srow, rrow in zip(scores, rows)]

    def search(self, text: str, k: int = 10) -> list[Hit]:
        """The top-k (docid, score) for one query text, best first."""
        if not isinstance(text, str):
            raise ConfigError(f"search() takes one query string (batch_search() takes a list), got {type(text).__name__}")
        return self.batch_search([text], k)[0]

    def batch_search(self, texts: Sequence[str], k: int = 10, qids: Sequence[str] | None = None):
        """Top-k hits for each query: a list in input order, or `{qid: hits}` when `qids` is given."""
        if isinstance(texts, str):
            raise ConfigError("batch_search() takes a list of query strings (search() takes one)")
        texts = list(texts)
        if qids is not None:
            qids = [str(q) for q in qids]
            if len(qids) != len(texts):
                raise ConfigError(f"{len(qids)} qids for {len(texts)} queries")
            if len(set(qids)) != len(qids):
                raise ConfigError("qids must be unique")
        k = _check_k(k)
        hits: list[list[Hit]] = []
        step = max(1, self.encoder.batch_size)
        for s in range(0, len(texts), step):
            vectors = self.encode(texts[s:s + step])
            # named by qid (else by position in `texts`) before search_vectors, which knows only the batch
            check_query_vectors(vectors, qids[s:s + step] if qids is not None
                                else [f"#{i}" for i in range(s, s + len(vectors))])
            hits += self.search_vectors(vectors, k)
        return dict(zip(qids, hits)) if qids is not None else hits


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ConfigError(f"k must be a positive integer, got {k!r}")
    return int(k)


def export_pyserini(index_dir: str | Path, out_dir: str | Path | None = None, overwrite: bool = False) -> Path:
    """Write the folder pyserini's `FaissSearcher(out_dir, encoder)` opens: `index` (the FAISS index,
    hard-linked when possible) and `docid` (one id per line, row order), plus `pipeline_export.json`
    (where it came from, the index metadata). `out_dir=None` (or the index folder itself) adds
    `index` and `docid` beside our files, so one folder opens in both tools. Returns the folder."""
    from .index.sharded import is_sharded

    if is_sharded(Path(index_dir)):
        raise ConfigError(f"{index_dir}: an index of several parts; pyserini's FaissSearcher reads one: merge it first "
                          "(pipeline index --merge INDEX --out ONE), then export that")
    src = Path(index_dir)
    meta_path = src / META_FILE
    if not meta_path.is_file():
        raise InputError(meta_path, None, "no index here: run `pipeline index` first")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise InputError(meta_path, None, f"unreadable index metadata ({e})") from None
    for name in (INDEX_FILE, PIDS_FILE):
        if not (src / name).is_file():
            raise InputError(src / name, None, "missing; rebuild with `pipeline index`")
    pids_text = (src / PIDS_FILE).read_text(encoding="utf-8")
    pids = pids_text.splitlines()
    if meta.get("ntotal") is not None and len(pids) != meta["ntotal"]:
        raise InputError(src / PIDS_FILE, None, f"{len(pids)} ids for {meta['ntotal']} vectors in index.json")
    for line, pid in enumerate(pids, 1):
        if pid != pid.rstrip():  # pyserini strips each line: the id would change
            raise InputError(src / PIDS_FILE, line, f"id {pid!r} ends in whitespace, which pyserini strips")
    export = {"source": str(src.resolve()), "format": "pyserini FaissSearcher: index + docid",
              "ntotal": len(pids), "index_meta": meta}

    def place(dst_folder: Path) -> None:
        tmp = dst_folder / f".tmp-{PYSERINI_INDEX}-{os.getpid()}"
        try:
            os.link(src / INDEX_FILE, tmp)
        except OSError:  # another filesystem, or no hard links: copy
            shutil.copyfile(src / INDEX_FILE, tmp)
        os.replace(tmp, dst_folder / PYSERINI_INDEX)
        tmp = dst_folder / f".tmp-{PYSERINI_DOCID}-{os.getpid()}"
        tmp.write_text("".join(p + "\n" for p in pids), encoding="utf-8")
        os.replace(tmp, dst_folder / PYSERINI_DOCID)

    if out_dir is None or Path(out_dir).resolve() == src.resolve():
        place(src)  # beside our own files; index.json stays the marker of the folder
        return src
    out = Path(out_dir)
    check_output(out, "pyserini", overwrite)
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        place(tmp)
        (tmp / EXPORT_FILE).write_text(json.dumps(export, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out
