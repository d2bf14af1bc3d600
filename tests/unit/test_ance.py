"""ANCE: the pairwise loss by hand, composition with DAR, and the refresher's protocol
(newest checkpoint wins, positives never negatives, per-version seeds, pinning, versions kept,
resume after the last version, bad input) on the bundled FAQ with the tiny BERT, without Ray."""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import pytest
import torch

from pipeline.errors import ConfigError, PipelineError
from pipeline.losses.ance import ANCEConfig, ANCEDARConfig, ance_batch_loss, ance_dar_batch_loss, pairwise_nll
from pipeline.losses.dpr import dpr_loss


def test_pairwise_nll_by_hand():
    # G = 2 queries, h = 1: docs = [d0+, d1+, d0-, d1-]
    s = torch.tensor([[3.0, 1.0, 2.0, 0.0], [0.5, 2.0, 4.0, 1.0]], dtype=torch.float64)
    got = pairwise_nll(s, torch.tensor([0, 1]), 2, 1)
    want = (-(3 - math.log(math.exp(3) + math.exp(2))) - (2 - math.log(math.exp(2) + math.exp(1)))) / 2
    assert got.item() == pytest.approx(want, abs=1e-12)
    # rank 1 of 2 (pos_idx = [1]): its own negative is column G + 1*h = 3
    one = pairwise_nll(s[1:], torch.tensor([1]), 2, 1).item()
    assert one == pytest.approx(-(2 - math.log(math.exp(2) + math.exp(1))), abs=1e-12)


def test_ance_loss_options_and_dar_composition():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, generator=g, dtype=torch.float64)
    docs = torch.randn(3 + 6, 4, generator=g, dtype=torch.float64)
    batch = {"q": q, "docs": docs, "pos_idx": torch.arange(3), "n_pos": 3, "hard_per_query": 2}
    pair, _ = ance_batch_loss(batch, ANCEConfig(similarity="dot"))
    inb, _ = ance_batch_loss(batch, ANCEConfig(similarity="dot", in_batch_negatives=True))
    assert torch.allclose(inb, dpr_loss(q, docs, torch.arange(3), ANCEConfig(similarity="dot"))[0])
    assert not torch.allclose(pair, inb)
    # before the first version (h = 0) the pairwise form falls back to the in-batch NLL
    b0 = {**batch, "docs": docs[:3], "hard_per_query": 0}
    assert torch.allclose(ance_batch_loss(b0, ANCEConfig(similarity="dot"))[0],
                          dpr_loss(q, docs[:3], torch.arange(3), ANCEConfig(similarity="dot"))[0])
    # ANCE + DAR with no copies and no mix is ANCE
    plain = ANCEDARConfig(similarity="dot", n_perturb=0, mix_weight=0.0)
    assert torch.allclose(ance_dar_batch_loss(batch, plain)[0], pair)
    full, terms = ance_dar_batch_loss(batch, ANCEDARConfig(similarity="dot"), generator=torch.Generator().manual_seed(1))
    assert set(terms) == {"nll", "mix"} and torch.isfinite(full)


def test_ance_config_section_and_bad_values():
    from pipeline.train.config import load_train_config

    job = load_train_config(None, ["loss.name=ance", "ance.negatives=5", "ance.top_k=50"])
    assert job.section("ance").negatives == 5
    with pytest.raises(ConfigError, match="more than ance.top_k"):
        load_train_config(None, ["loss.name=ance", "ance.negatives=30", "ance.top_k=20"])


# --------------------------------------------------------------------------- the refresher, without Ray



def _checkpoint(run_dir, step, model):
    from pipeline.models.checkpoint import finalize_checkpoint

    d = run_dir / f"step-{step:08d}"
    model.save(d / "model")
    finalize_checkpoint(d, {"step": step})
    return d


@pytest.fixture()
def run(tmp_path, tiny_model_dir):
    from pipeline.config import ModelConfig
    from pipeline.models import BiEncoder

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("{}\n")
    model = BiEncoder.load(ModelConfig(name_or_path=str(tiny_model_dir), pooling="mean", normalize=True))
    return run_dir, model


def _cfg(**kw):
    from pipeline.data.negatives import RefresherConfig

    return RefresherConfig(**{"top_k": 30, "negatives": 5, "precision": "fp32", "keep_versions": 2, **kw})


def test_refresher_takes_the_newest_checkpoint_and_never_a_positive(run, faq):
    from pipeline.data.negatives import VersionedNegatives, list_versions, version_dir
    from pipeline.data.readers import load_qrels
    from pipeline.index.refresher import Refresh

    run_dir, model = run
    for step in (2, 4, 6):  # three arrive at once: only the newest is refreshed
        _checkpoint(run_dir, step, model)
    r = Refresh(run_dir, _cfg(dev_qrels=str(faq / "qrels" / "test.trec"), dev_queries=str(faq / "queries.tsv")), faq)
    rec = r.step_once()
    assert rec["version"] == 1 and rec["checkpoint_step"] == 6 and r.skipped == 2
    assert 0.0 <= rec["dev_metric"] <= 1.0
    assert r.step_once() is None  # nothing newer
    meta = json.loads((version_dir(run_dir / "negatives", 1) / "meta.json").read_text())
    assert meta["checkpoint_step"] == 6 and meta["skipped_checkpoints"] == 2
    judged = load_qrels(faq / "qrels" / "train.trec")
    v1 = VersionedNegatives(run_dir / "negatives", faq)
    import pyarrow.parquet as pq

    table = pq.read_table(version_dir(run_dir / "negatives", 1) / "negatives.parquet").to_pylist()
    assert len(table) == len(judged)
    for row in table:
        assert len(row["negatives"]) == 5 and not set(row["negatives"]) & set(judged[row["qid"]])
    loaded = v1.load(1)
    assert loaded.get(table[0]["qid"])
    scratch = Path(loaded.lookup.store.path).parent  # the texts' memory-mapped copy, in a temporary folder
    assert scratch.is_dir()
    loaded.close()  # what the trainer does when it ends: a killed worker runs no finalizer
    assert not scratch.exists()
    loaded.close()  # twice is fine
    # the next checkpoints: new versions with a different seed; only the newest 2 kept
    _checkpoint(run_dir, 8, model)
    assert r.step_once()["version"] == 2
    _checkpoint(run_dir, 10, model)
    assert r.step_once()["version"] == 3
    assert list_versions(run_dir / "negatives") == [2, 3]
    t2 = pq.read_table(version_dir(run_dir / "negatives", 2) / "negatives.parquet").to_pylist()
    t3 = pq.read_table(version_dir(run_dir / "negatives", 3) / "negatives.parquet").to_pylist()
    assert [r["negatives"] for r in t2] != [r["negatives"] for r in t3]  # same model, per-version seed
    # a restarted refresher resumes after its last version
    again = Refresh(run_dir, _cfg(), faq)
    assert (again.version, again.last_step) == (3, 10) and again.step_once() is None
    pins = run_dir / "negatives" / ".pins"
    assert not pins.exists() or not list(pins.iterdir())  # pins released


def test_pinned_checkpoint_survives_rotation(run):
    from pipeline.index.refresher import pin_checkpoint
    from pipeline.models.checkpoint import read_state

    run_dir, model = run
    ckpt = _checkpoint(run_dir, 2, model)
    pin = pin_checkpoint(ckpt, run_dir / "pins")
    shutil.rmtree(ckpt)  # checkpoint rotation deletes it mid-read
    assert read_state(pin) is not None and (pin / "model" / "config.json").exists()
    assert pin_checkpoint(ckpt, run_dir / "pins") is None  # a vanished checkpoint is skipped


def test_pipeline_refresh_started_before_its_trainer_waits_for_the_run_folder(tmp_path, capsys):
    """ance.md's pair (trainer and `pipeline refresh` in two terminals) worked only trainer first: a refresher
    started before the trainer had written its run folder was refused. It now waits for it (--idle-exit)."""
    import threading

    from pipeline.index.refresher import check_run_dir, wait_for_run

    run_dir = tmp_path / "runs" / "ance-apart"
    timer = threading.Timer(0.3, lambda: (run_dir.mkdir(parents=True), (run_dir / "config.yaml").write_text("{}\n")))
    timer.start()
    wait_for_run(run_dir, 60, 0.05)
    timer.join()
    out = capsys.readouterr().out
    assert "[refresh] waiting for" in out and "is a training run after" in out
    wait_for_run(run_dir, 60, 0.05)  # already a run: no wait, nothing said
    assert capsys.readouterr().out == ""
    never = tmp_path / "runs" / "never"
    wait_for_run(never, 0.2, 0.05)  # gives up after its wait; the refusal is check_run_dir's, as before
    with pytest.raises(PipelineError, match="not a training run"):
        check_run_dir(never, tmp_path)


@pytest.mark.slow
def test_pipeline_refresh_follows_a_finished_run_that_is_resumed_until_it_finishes_again(run, faq, capsys):
    """A finished run resumed to train further (a larger train.max_steps) keeps its old summary.json until it
    ends again: `pipeline refresh` started beside it took that summary for the end and exited at once, so the
    resumed run trained on stale negatives."""
    import threading

    from pipeline.index.refresher import run_refresher

    run_dir, model = run
    _checkpoint(run_dir, 2, model)
    (run_dir / "summary.json").write_text('{"step": 2}')  # the first run's end

    def trainer_goes_on():
        _checkpoint(run_dir, 4, model)
        time.sleep(1.5)
        (run_dir / "summary.json").write_text('{"step": 4}')  # the resumed run's end

    timer = threading.Timer(1.0, trainer_goes_on)
    timer.start()
    done = run_refresher(run_dir, _cfg(poll_seconds=0.2), faq, idle_exit_s=60)
    timer.join()
    out = capsys.readouterr().out
    assert "holds the summary.json of a run that finished; following it" in out
    assert [r["checkpoint_step"] for r in done][-1] == 4 and "has finished; " in out


def test_refresher_bad_input(tmp_path, run, faq):
    from pipeline.index.refresher import Refresh

    run_dir, _ = run
    not_a_run = tmp_path / "notes"
    not_a_run.mkdir()
    with pytest.raises(PipelineError, match="not a training run"):
        Refresh(not_a_run, _cfg(), faq)
    with pytest.raises(PipelineError, match="more than the corpus"):
        Refresh(run_dir, _cfg(top_k=1000, negatives=5), faq)
    (run_dir / "examples").mkdir()
    (run_dir / "examples" / "examples.json").write_text(json.dumps({"corpus_fingerprint": "deadbeef"}))
    with pytest.raises(PipelineError, match="fingerprint"):
        Refresh(run_dir, _cfg(), faq)


def test_subset_keeps_every_positive_of_the_sampled_queries(faq, tmp_path):
    from pipeline.data.manifest import load_manifest
    from pipeline.data.readers import load_qrels
    from pipeline.data.subset import make_subset

    rec = make_subset(faq, faq / "queries.tsv", faq / "qrels" / "train.trec", tmp_path / "sub", passages=120,
                      train_queries=40, seed=1, progress=False)
    assert rec["passages"] == 120 and rec["train_queries"] == 40 and rec["seed"] == 1
    sub_qrels = load_qrels(tmp_path / "sub" / "qrels" / "train.trec")
    assert sorted(sub_qrels) == rec["queries"]
    import pyarrow.parquet as pq

    m = load_manifest(tmp_path / "sub")
    pids = {p for part in m["parts"] for p in pq.read_table(tmp_path / "sub" / part["file"])["pid"].to_pylist()}
    assert len(pids) == 120 and set(rec["positives"]) <= pids
    assert all(d in pids for docs in sub_qrels.values() for d in docs)
    again = make_subset(faq, faq / "queries.tsv", faq / "qrels" / "train.trec", tmp_path / "sub2", passages=120,
                        train_queries=40, seed=1, progress=False)
    assert again["fingerprint"] == rec["fingerprint"]  # seeded: the same subset
    with pytest.raises(PipelineError, match="more than --passages"):
        make_subset(faq, faq / "queries.tsv", faq / "qrels" / "train.trec", tmp_path / "sub3", passages=10,
                    train_queries=40, progress=False)


def test_subset_out_follows_the_output_rules_naming_subsets_own_options(faq, tmp_path, capsys):
    from pipeline.cli import main

    args = ["subset", "--corpus", str(faq), "--queries", str(faq / "queries.tsv"), "--qrels",
            str(faq / "qrels" / "train.trec"), "--passages", "60", "--train-queries", "10", "--out"]
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    assert main(args + [str(user)]) == 2
    err = capsys.readouterr().err
    assert "holds notes.txt; pipeline subset writes into a new or empty folder" in err and "(--overwrite)" in err
    assert sorted(p.name for p in user.iterdir()) == ["notes.txt"]
    assert main(args + [str(faq)]) == 2
    assert "is the source corpus (--corpus)" in capsys.readouterr().err
    assert main(args + [str(tmp_path / "sub")]) == 0
    assert main(args + [str(tmp_path / "sub")]) == 2
    assert "already holds a subset; pass --overwrite to `pipeline subset`" in capsys.readouterr().err
    assert main(args + [str(tmp_path / "sub"), "--overwrite", "--seed", "3"]) == 0
    assert json.loads((tmp_path / "sub" / "subset.json").read_text())["seed"] == 3


def test_ance_negatives_before_a_version_and_for_queries_a_version_lacks():
    import random

    from pipeline.data.negatives import NegativesVersion
    from pipeline.train.config import load_train_config
    from pipeline.train.methods import StepContext, get_method

    method = get_method("ance")
    job = load_train_config(None, ["loss.name=ance", "data.hard_negatives=2"])
    ctx = StepContext(job=job, device=torch.device("cpu"), rank=0, world=1, step=0, rng=random.Random(0))
    row = {"idx": 0, "qid": "q9", "negatives": []}
    assert method.negatives_for(row, ctx) == []  # no version and no initial negatives: in-batch only
    ctx.negatives = NegativesVersion(1, {}, {"q1": ["n1", "n2"]})
    got = method.negatives_for(row, ctx)  # q9 is not in the version and has none of its own
    assert len(got) == 2 and set(got) <= {"n1", "n2"} and ctx.stats == {"negatives_fallback": 1}


def test_subset_keeps_the_dev_positives_and_names_its_source_variant(faq, tmp_path):
    from pipeline.data.manifest import load_manifest
    from pipeline.data.readers import load_qrels, load_queries
    from pipeline.data.subset import make_subset

    import pyarrow.parquet as pq

    dev_q = tmp_path / "dev_queries.tsv"  # the dev queries in their own file
    test_qrels = load_qrels(faq / "qrels" / "test.trec")
    all_q = load_queries(faq / "queries.tsv")
    dev_q.write_text("".join(f"{q}\t{all_q[q]}\n" for q in sorted(test_qrels)))
    rec = make_subset(faq, faq / "queries.tsv", faq / "qrels" / "train.trec", tmp_path / "sub", passages=120,
                      train_queries=30, seed=2, progress=False, dev_queries=dev_q, dev_qrels=faq / "qrels" / "test.trec")
    m = load_manifest(tmp_path / "sub")
    assert m["variant"] == "beir-python_faq-subset" and rec["source_variant"] == "beir-python_faq"
    pids = {p for part in m["parts"] for p in pq.read_table(tmp_path / "sub" / part["file"])["pid"].to_pylist()}
    dev_pos = {d for docs in test_qrels.values() for d, r in docs.items() if r >= 1}
    assert len(pids) == 120 and dev_pos <= pids  # every dev positive kept
    assert load_qrels(tmp_path / "sub" / "qrels" / "dev.trec").keys() == test_qrels.keys()
    assert rec["dev_queries"] == len(test_qrels) and rec["training_pairs"] >= 30
    assert set(load_queries(tmp_path / "sub" / "queries.tsv")) == set(rec["queries"]) | set(test_qrels)

    bad = tmp_path / "other.tsv"
    bad.write_text("zz1\tnothing\n")
    with pytest.raises(PipelineError, match="none of its .* queries is in --dev-queries"):
        make_subset(faq, faq / "queries.tsv", faq / "qrels" / "train.trec", tmp_path / "sub2", passages=120,
                    train_queries=30, progress=False, dev_queries=bad, dev_qrels=faq / "qrels" / "test.trec")
    with pytest.raises(PipelineError, match="more than the corpus's 176"):
        make_subset(faq, faq / "queries.tsv", faq / "qrels" / "train.trec", tmp_path / "sub3", passages=10_000,
                    train_queries=30, progress=False)
    with pytest.raises(PipelineError, match="--dev-queries and --dev-qrels go together"):
        make_subset(faq, faq / "queries.tsv", faq / "qrels" / "train.trec", tmp_path / "sub4", passages=120,
                    train_queries=30, progress=False, dev_qrels=faq / "qrels" / "test.trec")


# --------------------------------------------------------------------------- the refresher when a refresh fails


def test_a_refresh_that_raises_is_retried_then_its_checkpoint_given_up_and_the_status_says_so(run, faq, monkeypatch):
    from pipeline.data.negatives import VersionedNegatives, list_versions, read_status
    from pipeline.index.refresher import Refresh

    run_dir, model = run
    _checkpoint(run_dir, 4, model)
    r = Refresh(run_dir, _cfg(refresh_retries=1, retry_backoff_s=0), faq)
    calls = []

    def broken(model_dir, step, source):
        calls.append(step)
        raise RuntimeError("CUDA error: an illegal memory access")

    monkeypatch.setattr(r, "refresh", broken)
    assert r.step_safely() is None and r.step_safely() is None  # the first try and its one retry
    assert calls == [4, 4] and r.last_step == 4  # given up: the next checkpoint is taken
    st = read_status(run_dir / "negatives")
    assert st["state"] == "skipped-checkpoint" and st["failures"] == 2
    assert st["last_error"]["version"] == 1 and st["last_error"]["checkpoint_step"] == 4
    assert "illegal memory access" in st["last_error"]["error"] and "step-00000004" in st["last_error"]["checkpoint"]
    assert "RuntimeError" in (run_dir / "negatives" / "refresher.log").read_text()  # the traceback, logged

    # the provider: no version for max_missed refresh intervals -> the run's error, or (continue) a stale note
    strict = VersionedNegatives(run_dir / "negatives", faq, refresh_every=4, max_missed_refreshes=2)
    assert strict.health(11) == {}
    err = strict.health(12)["error"]
    assert "no negatives version for 2 refresh intervals of 4 steps (step 12, newest: the start" in err
    assert "illegal memory access" in err and "refresher.log" in err and "on_refresher_failure=continue" in err
    lenient = VersionedNegatives(run_dir / "negatives", faq, refresh_every=4, max_missed_refreshes=2,
                                 on_failure="continue")
    assert lenient.health(12)["stale"].startswith("negatives stale since the start: no negatives version")

    # a refresh that fails once and then works: the next checkpoint gives version 1, the status is ok
    monkeypatch.undo()
    _checkpoint(run_dir, 8, model)
    rec = r.step_safely()
    assert rec["version"] == 1 and rec["checkpoint_step"] == 8 and list_versions(run_dir / "negatives") == [1]
    assert read_status(run_dir / "negatives")["state"] == "ok"
    assert strict.health(12) == {} and strict.health(19) == {} and "error" in strict.health(20)  # 8 + (2 + 1) * 4


def test_a_dead_refresher_fails_the_run_at_once(run, faq):
    from pipeline.data.negatives import VersionedNegatives, write_status

    run_dir, _ = run
    write_status(run_dir / "negatives", {"state": "dead", "reason": "its actor died after its restarts: OOM"})
    p = VersionedNegatives(run_dir / "negatives", faq, refresh_every=100, max_missed_refreshes=3)
    assert "the index refresher has failed for good (its actor died after its restarts: OOM)" in p.health(1)["error"]
    assert VersionedNegatives(run_dir / "negatives", faq).health(1)["error"]  # dead means dead, lateness aside


def test_a_restarted_refresher_clears_stale_pins_and_dev_queries_come_from_their_own_file(run, faq, tmp_path):
    from pipeline.index.refresher import Refresh

    run_dir, model = run
    stale = run_dir / "negatives" / ".pins" / "step-00000002-deadbeef" / "model"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"x" * 1000)  # what a crashed refresher left pinned
    Refresh(run_dir, _cfg(), faq)
    assert not (run_dir / "negatives" / ".pins").exists()

    with pytest.raises(ConfigError, match="ance.dev_qrels needs ance.dev_queries"):
        _cfg(dev_qrels=str(faq / "qrels" / "test.trec"))
    half = tmp_path / "dev.tsv"
    half.write_text("".join(line + "\n" for line in (faq / "queries.tsv").read_text().splitlines()[:5]))
    with pytest.raises(PipelineError, match=r"ance.dev_qrels .*: \d+ of its \d+ queries are not in ance.dev_queries"):
        Refresh(run_dir, _cfg(dev_qrels=str(faq / "qrels" / "test.trec"), dev_queries=str(half)), faq)



def test_a_refresher_that_cannot_publish_is_refused_when_it_starts(run, faq, tmp_path):
    from pipeline.index.refresher import Refresh

    run_dir, _ = run
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")  # nothing can be written below a file, not even by root
    with pytest.raises(PipelineError, match=r"ance.versions_dir .*a-file/negatives: the refresher cannot write there"):
        Refresh(run_dir, _cfg(versions_dir=str(blocker / "negatives")), faq)


def test_a_silent_heartbeat_is_a_gone_refresher_judged_by_the_trainers_own_clock(run, faq, monkeypatch):
    """A refresher in its own job (`pipeline refresh`) that is killed stops beating: the provider
    notices by its own clock (no clock compared across machines), the same rule for both layouts."""
    import time as time_mod

    from pipeline.data.negatives import VersionedNegatives, write_status

    run_dir, _ = run
    root = run_dir / "negatives"
    now = [1000.0]
    monkeypatch.setattr(time_mod, "monotonic", lambda: now[0])
    p = VersionedNegatives(root, faq, refresh_every=4, max_missed_refreshes=50, heartbeat_timeout_s=30)
    lenient = VersionedNegatives(root, faq, refresh_every=4, max_missed_refreshes=50, heartbeat_timeout_s=30,
                                 on_failure="continue")
    status = {"state": "ok", "pid": 4242, "host": "node-7", "beat": 1, "log": "/x/refresher.log"}
    write_status(root, status)
    assert p.health(3) == {} and lenient.health(3) == {}
    now[0] += 29
    assert p.health(4) == {}
    write_status(root, {**status, "beat": 2})  # it beats: alive however long its refresh takes
    now[0] += 29
    assert p.health(5) == {}
    now[0] += 29
    assert p.health(6) == {}
    now[0] += 2  # 31 s without a beat
    err = p.health(7)["error"]
    assert "heartbeat stopped 31s ago (ance.heartbeat_timeout_s=30; pid 4242 on node-7" in err and "gone" in err
    assert lenient.health(7) == {}  # its first look: the clock starts there
    now[0] += 31
    assert "negatives stale since the start: the index refresher's heartbeat stopped" in lenient.health(8)["stale"]
    # a refresher that left on purpose (--once, the run finished) is not judged by its heartbeat
    write_status(root, {**status, "beat": 9, "state": "stopped", "reason": "--once: version 1 published"})
    now[0] += 100
    assert p.health(9) == {}
    # no refresher ever wrote anything: the lateness rule says so
    other = VersionedNegatives(run_dir / "none", faq, refresh_every=4, max_missed_refreshes=2, heartbeat_timeout_s=30)
    assert "is `pipeline refresh` running" in other.health(12)["error"]


def test_a_failure_before_any_checkpoint_is_retried_then_ends_the_refresher(run, faq, monkeypatch):
    """Not retried at every poll forever: the same retries and backoff, then the refresher stops and its
    status says dead, and why."""
    import pipeline.index.refresher as refresher_mod
    from pipeline.data.negatives import VersionedNegatives, read_status
    from pipeline.index.refresher import Refresh

    run_dir, model = run
    r = Refresh(run_dir, _cfg(refresh_retries=2, retry_backoff_s=0), faq)

    def unreadable(_):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(refresher_mod, "list_checkpoints", unreadable)
    assert r.step_safely() is None and r.step_safely() is None  # attempts 1 and 2
    assert read_status(run_dir / "negatives")["state"] == "retrying"
    with pytest.raises(PipelineError, match=r"looking for a checkpoint in .* failed 3 times: OSError"):
        r.step_safely()
    st = read_status(run_dir / "negatives")
    assert st["state"] == "dead" and "failed 3 times" in st["reason"]
    assert "failed for good" in VersionedNegatives(run_dir / "negatives", faq).health(1)["error"]
    log = (run_dir / "negatives" / "refresher.log").read_text()
    assert log.count("Traceback") == 3  # one per attempt, then no more


@pytest.mark.slow
def test_dev_qrels_naming_queries_the_dev_queries_lack_is_one_line_before_anything_starts(faq, tmp_path,
                                                                                         tiny_model_dir):
    """Checked on the driver before Ray, the dev split or the run folder start: no raylet traceback,
    no split/ folder left."""
    import subprocess
    import sys

    from pipeline.data.readers import load_queries

    texts = load_queries(faq / "queries.tsv")
    dev_q = tmp_path / "dev_queries.tsv"
    dev_q.write_text("".join(f"{q}\t{t}\n" for q, t in list(texts.items())[:5]))  # most judged queries missing
    store = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-m", "pipeline.cli", "train", "--config", "jobs/configs/ance.yaml",
                        f"model.name_or_path={tiny_model_dir}", f"data.corpus={faq}", f"train.storage_path={store}",
                        f"ance.dev_qrels={faq / 'qrels' / 'test.trec'}", f"ance.dev_queries={dev_q}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "queries are not in ance.dev_queries" in err[0], r.stderr
    assert "Traceback" not in r.stdout + r.stderr and "raylet" not in r.stdout + r.stderr
    assert not store.exists()


def test_refresh_schedule_never_polls_less_often_than_versions_come():
    """A poll interval above the refresh interval only skips versions: an 80-step run with the default poll
    of 100 never looked at all (the effects experiment's first ANCE seeds trained on BM25's negatives
    throughout). It is lowered to the refresh interval; one at or below it is kept."""
    from pipeline.recipes.ance import refresh_schedule
    from pipeline.train.config import load_train_config

    job = refresh_schedule(load_train_config(None, ["loss.name=ance", "ance.refresh_every=40"]))
    assert (job.train.checkpoint_every, job.train.negatives_poll_every) == (40, 40)
    job = refresh_schedule(load_train_config(None, ["loss.name=ance", "ance.refresh_every=40",
                                                    "train.negatives_poll_every=1"]))
    assert (job.train.checkpoint_every, job.train.negatives_poll_every) == (40, 1)
    job = refresh_schedule(load_train_config(None, ["loss.name=ance", "ance.refresh_every=40",
                                                    "train.checkpoint_every=500"]))
    assert (job.train.checkpoint_every, job.train.negatives_poll_every) == (500, 100)
    shipped = load_train_config("jobs/configs/ance.yaml", [])
    assert refresh_schedule(shipped).train.negatives_poll_every == 3


def test_the_refresher_searches_its_version_in_parts_and_finds_what_one_index_finds(run, tmp_path):
    """The refresher held every passage's vector in one Flat index, so its memory grew with the corpus (#61). It
    now searches its version as parts, one corpus part at a time, and merges every query's top k: the same
    negatives and dev figure as one exact index over the whole corpus (IVF1,Flat: one list, exact)."""
    import pyarrow.parquet as pq

    from pipeline.data.bundled import python_faq_dir
    from pipeline.data.ingest import ingest
    from pipeline.data.negatives import version_dir
    from pipeline.index.refresher import Refresh

    corpus = tmp_path / "corpus"
    ingest([python_faq_dir()], "beir", corpus, progress=False, part_rows=40)
    run_dir, model = run
    _checkpoint(run_dir, 2, model)
    dev = {"dev_qrels": str(corpus / "qrels" / "test.trec"), "dev_queries": str(corpus / "queries.tsv")}
    parts = Refresh(run_dir, _cfg(**dev), corpus)
    rec = parts.step_once()
    meta = json.loads((version_dir(run_dir / "negatives", 1) / "meta.json").read_text())
    assert meta["index_parts"] == len(json.loads((corpus / "manifest.json").read_text())["parts"]) > 1
    got = pq.read_table(version_dir(run_dir / "negatives", 1) / "negatives.parquet").to_pylist()
    other = tmp_path / "run2"
    shutil.copytree(run_dir, other, ignore=shutil.ignore_patterns("negatives"))
    whole = Refresh(other, _cfg(**dev, factory="IVF1,Flat"), corpus)
    rec2 = whole.step_once()
    want = pq.read_table(version_dir(other / "negatives", 1) / "negatives.parquet").to_pylist()
    assert json.loads((version_dir(other / "negatives", 1) / "meta.json").read_text())["index_parts"] is None
    assert got == want and rec["dev_metric"] == pytest.approx(rec2["dev_metric"], abs=1e-12)
