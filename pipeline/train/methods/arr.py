"""ARR (docs/METHODS.md §4): authorship base models and topic-regularised distillation.

    arr_cl   step A with SupCon (positives = same author, τ 0.07)         -> G
    arr_mll  step A with an author classifier (a trainable head, checkpointed,
             not saved with the encoder; retrieval uses the pooled vectors) -> G.
             `loss.mll_head: released` (default) is the released baseline's head on the
             first token (see ReleasedMLLHead); `pooled` a bias-free head on the pooled
             vector, logits / τ
    arr      steps B + C: F (from the pretrained encoder) distilled from the frozen G,
             its in-batch probabilities rescaled by the TF-IDF topic bias of the batch

Every method reads the `authorship:` section: `split` (a folder from `pipeline authorship
split`; training uses its `train.parquet` only), `m` (texts per author in a batch, 2) and,
for `arr`, `teacher` (G's model folder). Examples are (idx, text, author id, topic); the
author id is the index of the author's name in the sorted training authors, and it is the
partition key, so every worker holds its own authors. Batches are B/m authors x m texts
(`batching.m_per_class_batches`); under several workers the batch dict gathers every
worker's vectors (with gradients) so each local row scores against the global batch.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import torch

from ...errors import ConfigError
from ...losses.arr import (ARRConfig, MLLConfig, SupConConfig, arr_batch_loss, mll_batch_loss,
                           supcon_batch_loss)
from ...losses.dist import gather_with_grad
from ..batching import epoch_rng, m_per_class_batches
from .registry import register
from .base import Method, StepContext, freeze
from .configs import AuthorshipSettings  # the `authorship:` section, torch-free in configs.py

EXAMPLES_META = "examples.json"


class ReleasedMLLHead(torch.nn.Linear):
    """The released MLL baseline's classifier (the authors' SentenceClassifier is Hugging Face's
    AutoModelForSequenceClassification; for a BERT tower, BertForSequenceClassification's head):

        first token's last hidden state -> dense + tanh (BERT's pooler) -> dropout -> linear + bias

    The dense layer starts from the tower's pretrained pooler when it has one (as from_pretrained
    loads it) and is trained with the head; dropout is the tower's `classifier_dropout`, else its
    `hidden_dropout_prob` (as Hugging Face picks it); new weights are drawn N(0, initializer_range)
    with zero biases (Hugging Face's init). Exact for BERT-architecture towers (MiniLM, BERT);
    another architecture gets this same BERT form, not its own Hugging Face head.

    It *is* the output layer (`weight`, `bias`, `out_features`: the author count), with the
    pooler's dense layer and the dropout in front."""

    def __init__(self, hidden: int, n_classes: int, dropout: float = 0.1, init_std: float = 0.02,
                 pooler_dense: torch.nn.Linear | None = None):
        super().__init__(hidden, n_classes, bias=True)
        self.dense = torch.nn.Linear(hidden, hidden)
        self.dropout = torch.nn.Dropout(dropout)
        with torch.no_grad():
            for layer in (self, self.dense):
                layer.weight.normal_(0.0, init_std)
                layer.bias.zero_()
            if pooler_dense is not None and tuple(pooler_dense.weight.shape) == (hidden, hidden):
                self.dense.weight.copy_(pooler_dense.weight)
                if pooler_dense.bias is not None:
                    self.dense.bias.copy_(pooler_dense.bias)

    @classmethod
    def for_tower(cls, tower, n_classes: int) -> "ReleasedMLLHead":
        config = tower.config
        dropout = getattr(config, "classifier_dropout", None)
        if dropout is None:
            dropout = getattr(config, "hidden_dropout_prob", 0.1)
        pooler = getattr(tower, "pooler", None)
        dense = getattr(pooler, "dense", None)
        return cls(int(config.hidden_size), n_classes, float(dropout), float(getattr(config, "initializer_range", 0.02)),
                   dense if isinstance(dense, torch.nn.Linear) else None)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        return super().forward(self.dropout(torch.tanh(self.dense(first))))


def _fp32(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def train_authors(split_dir: str | Path) -> list[str]:
    """The sorted author names of the split's training file (author id = index)."""
    from ...data.authorship import load_split

    return sorted({r["author"] for r in load_split(split_dir, "train")})


def _gather_objects(obj, world: int) -> list:
    if world == 1:
        return [obj]
    import torch.distributed as dist

    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def _gather_nograd(t: torch.Tensor, world: int) -> torch.Tensor:
    if world == 1:
        return t
    import torch.distributed as dist

    out = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(out, t.contiguous())
    return torch.cat(out, 0)


class AuthorshipMethod(Method):
    """Shared by arr_cl, arr_mll, arr: examples, the m-per-author sampler, one tower."""

    partition_key = "author"
    sections = {"authorship": AuthorshipSettings}

    # ---- examples
    def _settings(self, job) -> AuthorshipSettings:
        sec = job.section("authorship")
        if not sec.split:
            raise ConfigError(f"loss.name={self.name} needs authorship.split (a folder from `pipeline authorship "
                              "split`)")
        return sec

    def build_examples(self, job, out_dir: Path, progress: bool = True) -> dict:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from ...data.authorship import load_split, read_manifest, vectorizer
        from ...io_utils import atomic_path, sha256_file, sha256_files

        sec = self._settings(job)
        split = Path(sec.split)
        read_manifest(split)
        out_dir = Path(out_dir)
        base = {"source": "authorship", "split": str(split), "train_sha256": sha256_file(split / "train.parquet")}
        sampler = {"dir": str(out_dir), "m": sec.m, "seed": job.train.seed, "epochs": job.train.epochs,
                   "max_steps": job.train.max_steps}
        extra = {}
        if self.name == "arr":
            if not sec.teacher:
                raise ConfigError("loss.name=arr needs authorship.teacher (the base model G: the model folder of an "
                                  "arr_cl or arr_mll run)")
            if sec.teacher != "minilm" and not Path(sec.teacher).is_dir():
                raise ConfigError(f"authorship.teacher={sec.teacher}: not a model folder")
            tfidf = vectorizer(split, "tfidf")  # fitted on train only (here, on the driver), persisted with its hash
            extra = {"tfidf_sha256": tfidf.sha256, "tfidf_vocabulary": tfidf.vocabulary_size}
        meta_path = out_dir / EXAMPLES_META
        if meta_path.exists():
            old = json.loads(meta_path.read_text())
            if {k: old.get(k) for k in base} == base:
                return {**old, **sampler, **extra}
        records = load_split(split, "train")
        names = sorted({r["author"] for r in records})
        ids = {a: i for i, a in enumerate(names)}
        rows = [{"idx": i, "text": r["text"], "author": ids[r["author"]], "topic": r["topic"]}
                for i, r in enumerate(records)]
        schema = pa.schema([("idx", pa.int64()), ("text", pa.string()), ("author", pa.int64()),
                            ("topic", pa.string())])
        with atomic_path(out_dir) as tmp:
            tmp.mkdir(parents=True)
            pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp / "part-00000.parquet")
            digest = sha256_files([tmp / "part-00000.parquet"])
            meta = {**base, "examples": len(rows), "authors": len(names), "parts": 1, "digest": digest,
                    "author_names": names}
            (tmp / EXAMPLES_META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        if progress:
            print(f"[train-data] {len(rows):,} texts by {len(names):,} authors from {split / 'train.parquet'} "
                  f"-> {out_dir}", flush=True)
        return {**meta, **sampler, **extra}

    # ---- sampler
    def _rank_rows(self, meta: dict, world: int) -> list[list[dict]]:
        import pyarrow.parquet as pq

        rows = pq.read_table(Path(meta["dir"]) / "part-00000.parquet").to_pylist()
        return [[r for r in rows if r["author"] % world == rank] for rank in range(world)]

    def steps_per_epoch(self, meta: dict, world: int, batch_size: int) -> int:
        """The deterministic sampler run on the driver for every rank and epoch; the smallest count."""
        per_rank = self._rank_rows(meta, world)

        def count(rank: int, epoch: int) -> int:
            rng = epoch_rng(meta["seed"], epoch, rank)
            return sum(1 for _ in m_per_class_batches(list(per_rank[rank]), "author", meta["m"], batch_size,
                                                      1 << 30, rng))

        if batch_size % meta["m"]:
            raise ConfigError(f"train.batch_size={batch_size} must be a multiple of authorship.m={meta['m']}")
        epochs = max(1, meta["epochs"])
        spe = min(count(r, e) for r in range(world) for e in range(epochs))
        while spe and meta["max_steps"] and math.ceil(meta["max_steps"] / spe) > epochs:
            epochs = math.ceil(meta["max_steps"] / spe)
            spe = min(count(r, e) for r in range(world) for e in range(epochs))
        if spe == 0:
            raise ConfigError(f"some worker has fewer than {batch_size // meta['m']} authors with {meta['m']} texts: "
                              f"lower train.batch_size or train.num_workers ({world})")
        return spe

    def batches(self, rows, job, epoch: int, rank: int, spe: int):
        m = job.section("authorship").m
        return m_per_class_batches(list(rows), "author", m, job.train.batch_size, spe,
                                   epoch_rng(job.train.seed, epoch, rank))

    # ---- the step
    def _encode(self, model, rows: list[dict], ctx: StepContext) -> torch.Tensor:
        base = model.module if hasattr(model, "module") else model
        tok = {k: v.to(ctx.device) for k, v in base.tokenize([r["text"] for r in rows], "doc").items()}
        return model(None, tok)[1]

    def forward(self, model, rows: list[dict], ctx: StepContext) -> dict:
        z = self._encode(model, rows, ctx)
        return {"z": z, "labels": torch.tensor([int(r["author"]) for r in rows], device=ctx.device)}


@register
class ARRContrastive(AuthorshipMethod):
    name = "arr_cl"
    description = "ARR step A, CL: supervised contrastive loss over authors (docs/METHODS.md §4)"
    config_cls = SupConConfig
    loss_fn = staticmethod(supcon_batch_loss)
    # the loss term only: `anchors` (texts with a same-author partner, a count) is still reported, but is no
    # loss term and is not shown as one on the progress lines (nor offered as a sweep metric)
    terms = ("supcon",)

    def assemble(self, out: dict, ctx: StepContext) -> dict:
        z = _fp32(out["z"])
        return {"z": z, "z_all": gather_with_grad(z), "labels_all": _gather_nograd(out["labels"], ctx.world),
                "offset": ctx.rank * z.shape[0]}


@register
class ARRClassifier(AuthorshipMethod):
    """`loss.mll_head: released`: ReleasedMLLHead on the first token's last hidden state (read
    from the document tower's output during the model's own forward, so DDP sees one forward);
    `pooled`: a bias-free linear head on the pooled vector. Retrieval reads the pooled vector."""

    name = "arr_mll"
    description = "ARR step A, MLL: author classifier (released: first-token head; pooled: on the pooled vectors)"
    config_cls = MLLConfig
    loss_fn = staticmethod(mll_batch_loss)
    terms = ("mll", "train_acc")

    def heads(self, job, model) -> dict:
        n = len(train_authors(self._settings(job).split))
        if job.loss.mll_head == "pooled":
            return {"classifier": torch.nn.Linear(model.dim, n, bias=False)}
        return {"classifier": ReleasedMLLHead.for_tower(model.doc_encoder, n)}

    def forward(self, model, rows: list[dict], ctx: StepContext) -> dict:
        base = model.module if hasattr(model, "module") else model
        if ctx.job.loss.mll_head == "pooled":
            out = super().forward(model, rows, ctx)
            out["logits"] = base.heads["classifier"](_fp32(out["z"]))
            return out
        firsts = []  # the first token's state, call by call: a training batch is encoded in length groups

        def keep_first(module, args, output):
            firsts.append((output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0])[:, 0])

        hook = base.doc_encoder.register_forward_hook(keep_first)
        try:
            out = super().forward(model, rows, ctx)
        finally:
            hook.remove()
        first = torch.cat(firsts)
        order = getattr(base, "row_order", None)
        if order is not None:  # back in the batch's order, as the tower's pooled vectors are
            first = first[torch.argsort(order)]
        out["logits"] = base.heads["classifier"](_fp32(first))
        return out

    def assemble(self, out: dict, ctx: StepContext) -> dict:
        return {"logits": _fp32(out["logits"]), "labels": out["labels"]}


@register
class ARR(AuthorshipMethod):
    name = "arr"
    description = "ARR steps B + C: distillation from a frozen G, topic-regularised by TF-IDF (docs/METHODS.md §4)"
    config_cls = ARRConfig
    loss_fn = staticmethod(arr_batch_loss)
    terms = ("distill", "B", "agreement", "no_pair")

    def side_inputs(self, job, device: torch.device) -> dict:
        from ...data.authorship import vectorizer
        from ...models import BiEncoder

        sec = self._settings(job)
        if not sec.teacher:
            raise ConfigError("loss.name=arr needs authorship.teacher")
        teacher = BiEncoder.load(replace(job.model, name_or_path=sec.teacher, query_name_or_path=None))
        tfidf = vectorizer(sec.split, "tfidf")  # persisted by build_examples on the driver: loaded, not refitted
        return {"teacher": freeze(teacher.to(device)), "tfidf": tfidf}

    def forward(self, model, rows: list[dict], ctx: StepContext) -> dict:
        out = super().forward(model, rows, ctx)
        teacher = ctx.side["teacher"]
        texts = [r["text"] for r in rows]
        with torch.no_grad():
            tok = {k: v.to(ctx.device) for k, v in teacher.tokenize(texts, "doc").items()}
            out["g"] = teacher(None, tok)[1]
        out["texts"] = texts
        return out

    def assemble(self, out: dict, ctx: StepContext) -> dict:
        f = _fp32(out["z"])
        texts = [t for part in _gather_objects(out["texts"], ctx.world) for t in part]
        h_sim = torch.from_numpy(ctx.side["tfidf"].similarity(texts)).to(f.device)
        return {"f": f, "f_all": gather_with_grad(f), "g_all": _gather_nograd(_fp32(out["g"]).detach(), ctx.world),
                "h_sim": h_sim, "authors": _gather_nograd(out["labels"], ctx.world), "offset": ctx.rank * f.shape[0]}

