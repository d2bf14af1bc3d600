"""RCL: (query, positive) pairs trained with eq. 1 / eq. 2 / eq. 3 (docs/METHODS.md §3, a reconstruction).

One method serves the three kinds of RCL run; `pipeline/rcl.py` orchestrates them:

    initial model  (FAQ setting)  loss.entropy_lambda = 0, no regulators  -> eq. 1
    entropy model k               loss.entropy_lambda = λ_k               -> eq. 2
    final model                   rcl.regulator_tables = [K tables]       -> eq. 3

Examples, tokenisation and the gathered document layout are those of DPR (`pairs.PairMethod`).
The regulator vectors are side inputs: tables written by stage 2 (`RegulatorTable`, the spine's
embedding shards), one per frozen entropy model, opened once per worker (memory-mapped) and looked
up per example by the hash of the text and its side (query / document). They are numpy arrays turned into tensors
without gradient: nothing of an entropy model is trained, and the loss detaches them again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from ...errors import PipelineError
from ...losses.dist import gather_with_grad
from ...losses.rcl import RCLConfig, rcl_batch_loss
from .registry import register
from .base import StepContext
from .configs import RCLSettings  # the `rcl:` section, torch-free in configs.py
from .pairs import PairMethod, _fp32


def text_key(text: str, side: str) -> str:
    """A sentence's id in a regulator table: sha1 of its side ('query' / 'doc') and text."""
    return hashlib.sha1(f"{side}\0{text}".encode()).hexdigest()


class RegulatorTable:
    """One frozen entropy model's vectors for every training sentence, keyed by `text_key`.

    Two layouts, told apart by `meta.json` (written last: no meta = incomplete):
      shards  (stage 2 as built) `query/` and `doc/`: embedding sets written by the spine's
              Ray Data encoder actors (`pipeline encode`'s shards, ids = `text_key`s); meta.json
              lists each shard's vectors and ids file (so train/ needs no index/ import),
              memory-mapped shard by shard
      flat    `keys.txt` (one `text_key` per row) + `vectors.npy` (float32, rows aligned)"""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        meta_path = self.folder / "meta.json"
        if not meta_path.exists():
            raise PipelineError(f"{self.folder}: not a complete regulator table (no meta.json)")
        self.meta = json.loads(meta_path.read_text())
        self.arrays: list[np.ndarray] = []
        self.row: dict[str, tuple[int, int]] = {}
        if self.meta.get("layout") == "shards":
            for f in self.meta["files"]:
                keys = (self.folder / f["keys"]).read_text(encoding="utf-8").splitlines()
                vectors = np.load(self.folder / f["vectors"], mmap_mode="r")
                if len(keys) != vectors.shape[0] or len(keys) != f["rows"]:
                    raise PipelineError(f"{self.folder / f['vectors']}: {vectors.shape[0]} vectors, "
                                        f"{len(keys)} ids, meta.json says {f['rows']}")
                a = len(self.arrays)
                self.arrays.append(vectors)
                self.row.update((k, (a, i)) for i, k in enumerate(keys))
        else:
            keys = (self.folder / "keys.txt").read_text().split()
            vectors = np.load(self.folder / "vectors.npy", mmap_mode="r")
            if len(keys) != vectors.shape[0]:
                raise PipelineError(f"{self.folder}: {len(keys)} keys, {vectors.shape[0]} vectors")
            self.arrays.append(vectors)
            self.row = {k: (0, i) for i, k in enumerate(keys)}
        if len(self.row) != self.meta.get("rows"):
            raise PipelineError(f"{self.folder}: {len(self.row)} sentences found, meta says {self.meta.get('rows')}")

    def __len__(self) -> int:
        return len(self.row)

    def lookup(self, texts: list[str], side: str) -> np.ndarray:
        try:
            where = [self.row[text_key(t, side)] for t in texts]
        except KeyError:
            missing = next(t for t in texts if text_key(t, side) not in self.row)
            raise PipelineError(f"{self.folder}: no regulator vector for the {side} {missing[:60]!r} "
                                "(the table was built from other examples)") from None
        if not where:
            dim = self.arrays[0].shape[1] if self.arrays else 0
            return np.zeros((0, dim), np.float32)
        return np.stack([np.asarray(self.arrays[a][i], dtype=np.float32) for a, i in where])


@register
class RCL(PairMethod):
    name = "rcl"
    description = "RCL: contrastive + in-batch entropy (entropy models) / frozen regulators (docs/METHODS.md §3)"
    config_cls = RCLConfig
    loss_fn = staticmethod(rcl_batch_loss)
    terms = ("cl", "entropy", "regulator")
    sections = {"rcl": RCLSettings}
    uses_negatives_provider = False
    builds_apart = False  # its STS pairs setting reads more than job.data

    def build_examples(self, job, out_dir: Path, progress: bool = True) -> dict:
        """`rcl.pairs` (the STS setting's sentence pairs, less the dev share) or DPR's sources."""
        s = job.section("rcl")
        if not s.pairs:
            return super().build_examples(job, out_dir, progress=progress)
        from ...data.sentence_pairs import pair_examples

        return pair_examples(s.pairs, out_dir, s.dev_split, job.validation.dev_seed, job.data.hard_negatives,
                             progress)

    def side_inputs(self, job, device: torch.device) -> dict:
        s = job.section("rcl")
        if not s.regulator_tables:
            return {}
        return {"regulators": [RegulatorTable(p) for p in s.regulator_tables]}

    def forward(self, model, rows: list[dict], ctx: StepContext) -> dict[str, torch.Tensor]:
        """q (B, D), docs = [positives | hard negatives]; plus, with regulators, the K frozen
        entropy models' vectors of the same texts (no gradient, never through the model)."""
        B = len(rows)
        queries = [r["query"] for r in rows]
        docs = [r["positive"] for r in rows] + [n for r in rows for n in self.negatives_for(r, ctx)]
        base = model.module if hasattr(model, "module") else model
        q_tok = {k: v.to(ctx.device) for k, v in base.tokenize(queries, "query").items()}
        d_tok = {k: v.to(ctx.device) for k, v in base.tokenize(docs, "doc").items()}
        q, d = model(q_tok, d_tok)
        out = {"q": q, "pos": d[:B], "hard": d[B:]}
        tables = ctx.side.get("regulators") or []
        if tables:
            out["reg_q"] = torch.from_numpy(np.stack([t.lookup(queries, "query") for t in tables])).to(ctx.device)
            rd = torch.from_numpy(np.stack([t.lookup(docs, "doc") for t in tables])).to(ctx.device)
            out["reg_pos"], out["reg_hard"] = rd[:, :B], rd[:, B:]
        return out

    def assemble(self, out: dict[str, torch.Tensor], ctx: StepContext) -> dict:
        batch = super().assemble(out, ctx)
        if "reg_q" in out:
            # the regulator documents take the layout of `docs`: [G gathered positives | hard negatives]
            K = out["reg_pos"].shape[0]
            per_k = []
            for k in range(K):
                parts = [gather_with_grad(out["reg_pos"][k].contiguous())]
                if out["reg_hard"].shape[1]:
                    parts.append(gather_with_grad(out["reg_hard"][k].contiguous()))
                per_k.append(torch.cat(parts, 0))
            batch["reg_q"] = _fp32(out["reg_q"])
            batch["reg_docs"] = torch.stack(per_k).float()
        return batch
