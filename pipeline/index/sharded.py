"""An index of several parts: built part by part, searched part by part, merged into the one answer a single
index gives (#61).

    index_dir/index.json          the index's metadata as for one part (factory, metric, ntotal, dim, corpus and
                                  model identity) and `parts`: each part's name, rows, first global row, the
                                  embedding shards it holds and its bytes; written last: the folder is complete
    index_dir/plan.json           the build's plan (written first): what a re-run of a killed build resumes
    index_dir/trained.faiss       IVF/PQ: the one trained, empty index every part is a copy of (trained once on a
                                  sample of the whole corpus), so every part's codes and scores are comparable
    index_dir/part-000/           one part: index.faiss, pids.txt and part.json (written last: the part is
                                  complete), as a one-part index's files

Each part is a FAISS index over a contiguous run of embedding shards. A killed build keeps its finished parts
and a re-run builds only the missing ones; index.json is written once every part is complete.

Search (`ShardedIndex.search`) sends the queries, encoded once, to every part, each part returns its top k
(and a few more, `TIE_PAD`, so that passages tied with the k-th are all seen), and the merge keeps the global
top k by the tie rule every search of this tool follows (`order`): the higher score first (the lower distance
for l2), and among equal scores the passage that comes first in the corpus (the lower global row). For a Flat
index the merged run is the one-part run: the same passages in the same order, scores equal to float
precision. `resident` keeps every part loaded after its first use (the Python API, a search actor); without it
one part is loaded at a time (`retrieve.runner=local`: the memory of one part).

The sample that trains a shared quantizer is drawn as for one part (`faiss_index._sample`): `index.train_sample`
rows (at least 39 a list) chosen uniformly without replacement from all of the corpus's rows, seed 0.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from ..errors import ConfigError, InputError, PipelineError, ResourceError

PLAN_FILE, TRAINED_FILE, PART_FILE = "plan.json", "trained.faiss", "part.json"
TIE_PAD = 16  # extra hits asked of every search, so the passages tied with the k-th are seen before the cut
IDENTITY_KEYS = ("corpus_fingerprint", "variant", "title_join", "model", "model_config")


def order(scores: np.ndarray, ids: np.ndarray, k: int, metric: str = "ip") -> tuple[np.ndarray, np.ndarray]:
    """Each row's hits sorted by the tie rule (the higher score first, or the lower distance for l2; equal
    scores by the lower global row) and cut to k; missing hits (id -1) last."""
    scores = np.asarray(scores, dtype=np.float32)
    ids = np.asarray(ids, dtype=np.int64)
    key = -scores.astype(np.float64) if metric == "ip" else scores.astype(np.float64)
    key = np.where(ids < 0, np.inf, key)
    big = np.where(ids < 0, np.iinfo(np.int64).max, ids)
    rows = np.arange(len(scores))[:, None]
    idx = np.lexsort((big, key), axis=1)[:, :k] if scores.size else np.zeros((len(scores), 0), np.int64)
    return scores[rows, idx], ids[rows, idx]


def search_ordered(index, queries: np.ndarray, k: int, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """A FAISS index's top k by the tie rule (`order`): k + TIE_PAD asked, sorted, cut."""
    want = min(k + TIE_PAD, max(int(index.ntotal), 1))
    scores, ids = index.search(np.ascontiguousarray(queries, dtype=np.float32), want)
    if want < k:  # fewer passages than k: FAISS's -1 fill, to k columns
        pad = k - want
        scores = np.hstack([scores, np.full((len(scores), pad), -np.inf if metric == "ip" else np.inf, np.float32)])
        ids = np.hstack([ids, np.full((len(ids), pad), -1, np.int64)])
    return order(scores, ids, k, metric)


# --------------------------------------------------------------------------------------------- the plan


def plan_parts(shards: list[tuple[str, int]], bytes_per_vec: float, base: int, shards_wanted: int,
               shard_max_gb: float, fits_bytes: float) -> tuple[list[dict], str]:
    """The parts: contiguous runs of the embedding shards `[(name, rows)]`, balanced by rows. `shards_wanted`
    parts (index.shards), or as few as keep every part within `shard_max_gb` GB of vectors, or (neither asked) as
    few as fit `fits_bytes` each. Returns (parts, why: the one line that says what was chosen)."""
    total = sum(r for _, r in shards)
    need = bytes_per_vec * total + base
    if shards_wanted:
        n, why = shards_wanted, f"index.shards={shards_wanted}"
    elif shard_max_gb:
        n = max(1, math.ceil(bytes_per_vec * total / (shard_max_gb * 1e9)))
        why = f"index.shard_max_gb={shard_max_gb:g}: {n} part{'s' if n > 1 else ''} of at most {shard_max_gb:g} GB"
    else:
        n = max(1, math.ceil(need / max(fits_bytes, 1.0)))
        why = (f"one part would need ~{need / 2**30:.2f} GiB, more than the {fits_bytes / 2**30:.2f} GiB a part may "
               f"take here (index.max_ram_fraction of the available memory): {n} parts") if n > 1 else "one part"
    if n > len(shards):
        raise ConfigError(f"{why}: the embeddings have {len(shards)} shard{'s' if len(shards) > 1 else ''}, and a part "
                          f"holds whole shards: at most {len(shards)} parts (encode with smaller "
                          "encode.shard_rows for more)")
    parts, start, row = [], 0, 0
    for p in range(n):
        # the part ends at the shard boundary nearest to (p + 1) / n of the rows, leaving a shard for each later part
        target = total * (p + 1) / n
        end, rows = start, 0
        while end < len(shards) - (n - p - 1):
            nxt = rows + shards[end][1]
            if end > start and abs(row + nxt - target) > abs(row + rows - target):
                break
            rows, end = nxt, end + 1
        if p == n - 1:
            rows += sum(r for _, r in shards[end:])
            end = len(shards)
        parts.append({"name": f"part-{p:03d}", "offset": row, "rows": rows,
                      "shards": [name for name, _ in shards[start:end]],
                      "bytes": int(bytes_per_vec * rows + base)})
        row += rows
        start = end
    return parts, why


def _part_fits(part: dict, fits_bytes: float, what: str) -> None:
    if part["bytes"] > fits_bytes:
        raise ResourceError(f"{what}: part {part['name']} ({part['rows']:,} vectors) needs ~{part['bytes'] / 2**30:.2f} "
                            f"GiB, more than the {fits_bytes / 2**30:.2f} GiB it may take (index.max_ram_fraction of "
                            "the available memory); ask for more parts (index.shards, index.shard_max_gb), or a "
                            "compressed factory")


# --------------------------------------------------------------------------------------------- building


def build_sharded(emb_dir, out_dir: Path, cfg, meta: dict, trained, bytes_per_vec: float, base: int,
                  parts: list[dict], why: str, progress: bool, t0: float, sample_rows: int | None) -> dict:
    """Build `parts` into `out_dir` (new, or a killed build of the same plan: its complete parts are kept),
    one part after another (`cfg.build_runner`, when Ray is asked for, builds them as tasks), then index.json."""
    import faiss

    from ..io_utils import write_json_atomic
    from ..models.precision import query_precision

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    import hashlib

    from .shards import META_NAME, location

    # the embedding set as written (its model, shards and their digests): vectors encoded again into the same folder
    # are another plan, so a killed build's parts of the old vectors are never kept beside parts of the new
    written = hashlib.sha256((location(emb_dir) / META_NAME).read_bytes()).hexdigest()[:16]
    from .search_params import search_settings

    # the search settings are part of the plan: a resume asked for other ones is another plan, refused
    plan = {"embeddings": str(emb_dir), "embeddings_sha256": written, "factory": cfg.factory, "metric": cfg.metric,
            "dim": int(meta["dim"]), "corpus_fingerprint": meta.get("corpus_fingerprint"), "parts": parts,
            "search": search_settings(cfg)}
    old_plan = _read_json(out_dir / PLAN_FILE)
    if isinstance(old_plan, dict):
        old_plan.setdefault("search", {})  # (a plan written before search settings were part of it: none)
    if old_plan is not None and old_plan != plan:
        raise PipelineError(f"{out_dir}: holds an unfinished build of another plan (other embeddings, factory, "
                            "parts or search settings); give another --out, or remove that folder to start again")
    write_json_atomic(out_dir / PLAN_FILE, plan)
    if not trained.is_trained:
        raise PipelineError("the shared quantizer is not trained")
    if not trained.ntotal == 0:
        raise PipelineError("the shared quantizer holds vectors")
    if _needs_training(cfg.factory, trained):
        faiss.write_index(trained, str(out_dir / TRAINED_FILE))
    if progress:
        print(f"[index] {len(parts)} parts ({why}); each a {cfg.factory} over a contiguous run of embedding shards"
              + (f", sharing one quantizer trained on {sample_rows:,} sampled vectors" if sample_rows else ""),
              flush=True)
    kept = 0
    todo = []
    for i, part in enumerate(parts, 1):
        if part_problem(out_dir / part["name"], part, plan) is None:
            kept += 1
        else:
            todo.append((i, part))
    if todo and build_on_ray(cfg):
        _build_parts_on_ray(emb_dir, out_dir, todo, plan, trained, cfg, len(parts), progress)
    for i, part in ([] if todo and build_on_ray(cfg) else todo):
        t = time.time()
        _build_part(faiss, emb_dir, out_dir / part["name"], part, plan, trained, cfg)
        if progress:
            print(f"[index] part {i}/{len(parts)} ({part['name']}): {part['rows']:,} vectors in "
                  f"{time.time() - t:.1f}s", flush=True)
    if progress and kept:
        print(f"[index] {kept} part{'s' if kept > 1 else ''} kept from an earlier build of this plan", flush=True)
    info = {"factory": cfg.factory, "metric": cfg.metric, "ntotal": sum(p["rows"] for p in parts),
            "dim": int(meta["dim"]), "gpu_build": False, "bytes_per_vector_est": round(bytes_per_vec, 1),
            "seconds": round(time.time() - t0, 2), "embeddings": str(emb_dir),
            **{k: meta.get(k) for k in IDENTITY_KEYS + ("corpus", "precision", "precision_resolved",
                                                         "backend_resolved")},
            "query_precision": query_precision(),
            "parts": [{k: p[k] for k in ("name", "offset", "rows", "shards", "bytes")} for p in parts],
            "shared_quantizer": TRAINED_FILE if (out_dir / TRAINED_FILE).exists() else None,
            "embeddings_sha256": plan["embeddings_sha256"],
            "train_sample": sample_rows,
            "search": plan["search"]}  # kept in every part's file (clones of the index they were set on)
    write_json_atomic(out_dir / "index.json", info)
    (out_dir / PLAN_FILE).unlink(missing_ok=True)
    return info


def build_on_ray(cfg) -> bool:
    """Whether the parts are built as Ray tasks: `index.build_runner=ray`, or auto with RAY_ADDRESS naming a cluster
    (as `ray job submit` sets it for its entrypoint)."""
    import os

    runner = getattr(cfg, "build_runner", "auto")
    if runner != "auto":
        return runner == "ray"
    address = os.environ.get("RAY_ADDRESS", "")
    return bool(address) and address != "local"


def _part_task(emb_dir: str, folder: str, part: dict, plan: dict, trained_bytes, cfg) -> dict:
    """One part built in a Ray task (where its memory is free); what node built it."""
    import faiss
    import ray

    trained = faiss.deserialize_index(trained_bytes)
    t = time.time()
    _build_part(faiss, emb_dir, Path(folder), part, plan, trained, cfg)
    return {"node": ray.get_runtime_context().get_node_id(), "seconds": time.time() - t}


def _build_parts_on_ray(emb_dir, out_dir: Path, todo: list, plan: dict, trained, cfg, n_parts: int,
                        progress: bool) -> None:
    """The missing parts built as Ray tasks, in parallel where the cluster has the memory (each asks for its
    part's bytes of Ray's `memory` resource); the embeddings and the index folder must be where every node
    reads and writes them (shared storage), as a cluster's encode output is. A task that fails fails the
    build, naming its part; the parts finished meanwhile are kept for the re-run."""
    import faiss
    import ray

    from ..ray_runtime import init_ray

    init_ray()
    blob = ray.put(faiss.serialize_index(trained))
    task = ray.remote(_part_task)
    refs = {task.options(num_cpus=1, memory=max(int(part["bytes"]), 1)).remote(
        str(emb_dir), str(out_dir / part["name"]), part, plan, blob, cfg): (i, part) for i, part in todo}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        i, part = refs[done[0]]
        try:
            got = ray.get(done[0])
        except ray.exceptions.RayError as e:
            raise PipelineError(f"part {part['name']} of the index failed on Ray ({type(e).__name__}: "
                                f"{str(e).splitlines()[0][:200]}); the parts finished are kept: run again") from None
        if progress:
            print(f"[index] part {i}/{n_parts} ({part['name']}): {part['rows']:,} vectors in {got['seconds']:.1f}s "
                  f"on node {got['node'][:12]} (a Ray task)", flush=True)


def _needs_training(factory: str, trained) -> bool:
    import faiss

    try:
        return not faiss.index_factory(trained.d, factory, trained.metric_type).is_trained
    except RuntimeError:
        return True


def _build_part(faiss, emb_dir, folder: Path, part: dict, plan: dict, trained, cfg) -> None:
    from ..io_utils import atomic_path
    from .shards import iter_shards

    index = faiss.clone_index(trained)
    with atomic_path(folder) as tmp:
        tmp.mkdir(parents=True)
        with open(tmp / "pids.txt", "w", encoding="utf-8") as pid_file:
            for pids, vecs in iter_shards(emb_dir, only=set(part["shards"])):
                for s in range(0, len(vecs), cfg.add_batch_size):
                    index.add(np.ascontiguousarray(vecs[s:s + cfg.add_batch_size], dtype=np.float32))
                pid_file.write("".join(p + "\n" for p in pids))
        if index.ntotal != part["rows"]:
            raise InputError(emb_dir, None, f"the shards of {part['name']} hold {index.ntotal:,} vectors, the plan "
                             f"{part['rows']:,}: the embeddings changed while the index was built")
        faiss.write_index(index, str(tmp / "index.faiss"))
        (tmp / PART_FILE).write_text(json.dumps({**part, "factory": plan["factory"], "metric": plan["metric"],
                                                 "dim": plan["dim"], "embeddings_sha256": plan["embeddings_sha256"],
                                                 "corpus_fingerprint": plan["corpus_fingerprint"]},
                                                indent=2, sort_keys=True) + "\n")
    del index


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def part_problem(folder: Path, part: dict, meta: dict) -> str | None:
    """Why a part's folder is not the part `meta` (the index's, or the plan's) names: missing, incomplete, of
    another corpus, factory or size; None when it is (its FAISS file is read by `load_part`)."""
    record = _read_json(folder / PART_FILE)
    if not folder.is_dir():
        return "missing"
    if record is None:
        return "incomplete (no part.json: its build did not finish)"
    for key in ("rows", "offset", "shards"):
        if record.get(key) != part.get(key):
            return f"holds other rows ({key} {record.get(key)!r}, the index lists {part.get(key)!r})"
    for key in ("factory", "metric", "dim", "corpus_fingerprint", "embeddings_sha256"):
        if key in meta and record.get(key) != meta.get(key):
            return f"of another {key.replace('_', ' ')} ({record.get(key)!r}, the index's {meta.get(key)!r})"
    if not (folder / "index.faiss").is_file():
        return "index.faiss is missing"
    if not (folder / "pids.txt").is_file():
        return "pids.txt is missing"
    return None


# --------------------------------------------------------------------------------------------- searching


class _Shape:
    """What callers read of a loaded index's FAISS object: its size and dimension."""

    def __init__(self, ntotal: int, d: int):
        self.ntotal, self.d = ntotal, d


class ConcatPids:
    """The ids of every part, read as one sequence by global row."""

    def __init__(self, tables: list, offsets: list[int]):
        self.tables, self.offsets = tables, np.asarray(offsets, dtype=np.int64)
        self._n = int(self.offsets[-1] + len(tables[-1])) if tables else 0

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        i = int(i)
        if i < 0:
            i += self._n
        p = int(np.searchsorted(self.offsets, i, side="right") - 1)
        return self.tables[p][i - int(self.offsets[p])]

    def __iter__(self):
        for t in self.tables:
            yield from t

    def take(self, rows) -> list[str]:
        """The ids of many global rows at once (what a run writer asks for), each part's rows in one lookup."""
        rows = np.asarray(rows, dtype=np.int64)
        part = np.searchsorted(self.offsets, rows, side="right") - 1
        out: list = [None] * len(rows)
        for p in np.unique(part):
            at = np.flatnonzero(part == p)
            table = self.tables[int(p)]
            local = rows[at] - self.offsets[p]
            got = table.take(local) if hasattr(table, "take") else [table[int(i)] for i in local]
            for i, pid in zip(at.tolist(), got):
                out[i] = pid
        return out


def is_sharded(index_dir: Path) -> bool:
    meta = _read_json(Path(index_dir) / "index.json")
    return isinstance(meta, dict) and bool(meta.get("parts"))


class ShardedIndex:
    """A several-part index, searchable as a LoadedIndex: `search(queries, k)` -> (scores, global rows), `pids`
    by global row, `meta`, `index.ntotal` / `index.d`. Every part is checked when the index opens (its
    part.json against index.json, its ids, its FAISS file's size): a part missing, truncated, of another
    corpus or model, or rows that do not add up is one InputError naming the part, never a shorter run."""

    def __init__(self, index_dir, cfg=None, resident: bool = True):
        from ..config import IndexConfig
        from .pid_table import PidTable

        self.dir = Path(index_dir)
        self.cfg = cfg or IndexConfig()
        self.meta = _read_json(self.dir / "index.json")
        if not isinstance(self.meta, dict) or not self.meta.get("parts"):
            raise InputError(self.dir / "index.json", None, "not a several-part index")
        self.parts = self.meta["parts"]
        self.metric = self.meta.get("metric", "ip")
        self.resident = resident
        self._loaded: dict[str, object] = {}
        expected = 0
        tables = []
        for part in self.parts:
            folder = self.dir / part["name"]
            problem = part_problem(folder, part, self.meta)
            if problem:
                raise InputError(folder, None, f"part {part['name']} of the index is {problem}; rebuild it with "
                                 "`pipeline index` (a re-run builds only the missing parts)")
            if part["offset"] != expected:
                raise InputError(folder, None, f"part {part['name']} starts at row {part['offset']:,}, the parts "
                                 f"before it end at {expected:,}: the parts do not add up; rebuild the index")
            try:
                pids = PidTable(folder / "pids.txt")
            except (OSError, InputError) as e:
                raise InputError(folder / "pids.txt", None, f"part {part['name']}: unreadable ids ({e})") from None
            if len(pids) != part["rows"]:
                raise InputError(folder / "pids.txt", None, f"part {part['name']}: {len(pids):,} ids for its "
                                 f"{part['rows']:,} vectors; rebuild the index")
            n = _faiss_ntotal(folder / "index.faiss")
            if n != part["rows"]:
                raise InputError(folder / "index.faiss", None, f"part {part['name']}: holds {n} vectors, index.json "
                                 f"lists {part['rows']:,} (truncated or replaced); rebuild the index")
            tables.append(pids)
            expected += part["rows"]
        if expected != self.meta.get("ntotal"):
            raise InputError(self.dir / "index.json", None, f"the parts hold {expected:,} vectors, index.json says "
                             f"{self.meta.get('ntotal')}: rebuild the index")
        self.pids = ConcatPids(tables, [p["offset"] for p in self.parts])
        self.index = _Shape(expected, int(self.meta.get("dim") or 0))

    def load_part(self, part: dict):
        """The part's FAISS index (kept when resident), with the search parameters of `cfg`."""
        import faiss

        if part["name"] in self._loaded:
            return self._loaded[part["name"]]
        path = self.dir / part["name"] / "index.faiss"
        try:
            index = faiss.read_index(str(path))
        except RuntimeError as e:
            reason = " ".join(ln.strip() for ln in str(e).splitlines() if ln.strip())[:200]
            raise InputError(path, None, f"part {part['name']}: not a readable FAISS index ({reason}); "
                             "rebuild the index") from None
        from .search_params import set_search_params

        set_search_params(index, self.cfg, self.meta.get("factory"))
        gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
        if self.cfg.use_gpu != "no" and gpus:  # faiss-gpu: the part searched on the GPUs (a search actor's own)
            try:
                index = faiss.index_cpu_to_all_gpus(index)
            except RuntimeError:
                pass
        if self.resident:
            self._loaded[part["name"]] = index
        return index

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(Q, D) float32 -> scores (Q, k), global rows (Q, k), merged over the parts by the tie rule."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        best_s = best_i = None
        for part in self.parts:  # each part loaded once; what is held between parts: the running top k
            index = self.load_part(part)
            s, i = search_ordered(index, queries, k, self.metric)
            del index
            i = np.where(i >= 0, i + part["offset"], -1)
            if best_s is None:
                best_s, best_i = s, i
            else:
                best_s, best_i = order(np.hstack([best_s, s]), np.hstack([best_i, i]), k, self.metric)
        return best_s, best_i

    def largest_part_bytes(self) -> int:
        return max(int(p.get("bytes") or 0) for p in self.parts)


def _faiss_ntotal(path: Path) -> int | str:
    """The vector count a FAISS file's header gives, or why it cannot be read (the file is memory-mapped:
    nothing is loaded)."""
    import faiss

    try:
        index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    except RuntimeError:
        try:
            index = faiss.read_index(str(path))
        except RuntimeError as e:
            return f"no readable FAISS index ({str(e).splitlines()[0][:120]})"
    return int(index.ntotal)


def check_search_memory(index: ShardedIndex, what: str, fraction: float) -> None:
    """Before a search loads a part: the largest part within `fraction` of the available memory (all parts
    together when the index keeps them loaded), or refused in one line naming the number."""
    import psutil

    avail = psutil.virtual_memory().available
    need = sum(int(p.get("bytes") or 0) for p in index.parts) if index.resident else index.largest_part_bytes()
    if need > fraction * avail:
        held = "its parts together" if index.resident else "its largest part"
        raise ResourceError(f"{what}: {held} need ~{need / 2**30:.2f} GiB, more than {fraction:.0%} of the "
                            f"{avail / 2**30:.1f} GiB available; search one part at a time (retrieve.runner=local), "
                            "on a Ray cluster (retrieve.runner=ray), or build more parts")


# --------------------------------------------------------------------------------------------- merging


def merge_index(index_dir, out_dir, progress: bool = True) -> dict:
    """A several-part index merged into one part (today's layout, which pyserini's FaissSearcher opens through
    export_pyserini), where this machine has the memory for the whole."""
    import faiss
    import psutil

    from ..io_utils import atomic_path, check_output

    index = ShardedIndex(index_dir, resident=False)
    need = sum(int(p.get("bytes") or 0) for p in index.parts)
    avail = psutil.virtual_memory().available
    if need > 0.8 * avail:
        raise ResourceError(f"merging {index_dir}: the whole index needs ~{need / 2**30:.2f} GiB, more than 80% of the "
                            f"{avail / 2**30:.1f} GiB available here; merge it on a machine with more memory, or "
                            "search it as parts")
    check_output(out_dir, "index", overwrite=False)
    t0 = time.time()
    merged = None
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        with open(tmp / "pids.txt", "w", encoding="utf-8") as pid_file:
            for part, pids in zip(index.parts, index.pids.tables):
                one = index.load_part(part)
                if merged is None:
                    merged = one
                else:
                    merged.merge_from(one)
                pid_file.write("".join(p + "\n" for p in pids))
        faiss.write_index(merged, str(tmp / "index.faiss"))
        meta = {k: v for k, v in index.meta.items() if k not in ("parts", "shared_quantizer", "train_sample")}
        meta.update({"ntotal": int(merged.ntotal), "merged_from": str(index_dir), "seconds": round(time.time() - t0, 2)})
        (tmp / "index.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    if progress:
        print(f"[index] merged {len(index.parts)} parts ({meta['ntotal']:,} vectors) into one -> {out_dir}",
              flush=True)
    return meta
