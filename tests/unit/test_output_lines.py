"""Lines people read: a count is not shown as a loss term, ANCE's closing line always says what the
trainer trained on, a progress bar's last line is printed once, and ARR's results land where the
documented table command reads them."""

from __future__ import annotations

import io
import json
import time

from pipeline.cli import main
from pipeline.progress import bar
from pipeline.train.config import load_train_config


def test_arr_cl_progress_line_shows_its_loss_not_the_anchor_count():
    from pipeline.train.methods import get_method
    from pipeline.train.trainer import format_progress

    method = get_method("arr_cl")
    terms = ("nll",) + tuple(t for t in method.terms if t != "nll")  # as the trainer builds them
    rec = {"step": 10, "total": 100, "loss": 2.5, "supcon": 2.5, "anchors": 64.0, "lr": 1e-4, "steps_per_s": 1.0}
    line = format_progress("arr_cl", rec, terms)[0]
    assert "supcon 2.5000" in line and "anchors" not in line


def test_ance_summary_line_says_what_the_trainer_used_even_when_no_version_reached_it():
    from pipeline.recipes.ance import refresher_summary_line

    status = {"versions": [{"seconds": 3.0}], "skipped_checkpoints": 1}
    job = load_train_config(None, ["loss.name=ance", "data.corpus=c"])
    used = refresher_summary_line(status, [{"version": 1, "at_step": 40}], job)
    assert used.endswith("trainer used v1 from step 40") and "1 version(s) this run, 3.0s each" in used
    none = refresher_summary_line({}, [], job)
    assert none.startswith("[ance] WARNING: refresher: 0 version(s) this run")
    assert ("the trainer used no refreshed version: it trained on in-batch negatives only throughout, so this run "
            "is not ANCE (no version came before training ended: give the refresher more CPUs") in none
    own = refresher_summary_line(status, [], load_train_config(None, ["loss.name=ance", "data.negatives_run=bm25.trec",
                                                                      "data.hard_negatives=1"]))
    assert "trained on the examples' own hard negatives throughout, so this run is not ANCE" in own
    assert own.endswith("(none came before the trainer's last look: refresh more often (ance.refresh_every) or "
                        "lower train.negatives_poll_every)")


def _lines(make) -> list[str]:
    out = io.StringIO()
    b = make(out)
    b.update(1)
    time.sleep(0.01)
    b.update(1)  # displayed: mininterval 0
    b.close()
    return [s for s in out.getvalue().replace("\r", "\n").split("\n") if s.strip()]


def test_a_progress_bars_last_line_is_printed_once():
    from tqdm import tqdm

    plain = _lines(lambda f: tqdm(total=2, desc="encode", mininterval=0, file=f))
    assert sum("2/2" in s for s in plain) == 2  # tqdm's own close() repeats it: the check can fail
    ours = _lines(lambda f: bar(2, "encode", mininterval=0, file=f))
    assert sum("2/2" in s for s in ours) == 1 and ours[-1].startswith("encode: 100%")
    slow = _lines(lambda f: bar(2, "encode", mininterval=3600, file=f))  # the last state not shown by update
    assert sum("2/2" in s for s in slow) == 1  # close() shows it, once


def test_arr_results_land_beside_the_split_where_the_table_reads_them(tmp_path, capsys):
    from pipeline.recipes.arr import default_result_path

    split = tmp_path / "runs" / "arr" / "split"
    results = tmp_path / "runs" / "arr" / "results"
    assert default_result_path(split, baseline="tfidf") == results / "tfidf.json"
    assert default_result_path(split, model="minilm") == results / "zero-shot.json"
    run = tmp_path / "runs" / "arr" / "train" / "arr_cl_arr"
    (run / "model").mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    assert default_result_path(split, model=str(run / "model")) == results / "arr_cl_arr.json"
    labelled = default_result_path(split, model=str(run / "model"), label="CL+ARR (lr 1e-4)")
    assert labelled == results / "CL+ARR-lr-1e-4.json"

    src = tmp_path / "recs.jsonl"
    recs = []
    for a in range(24):
        for k in range(6 if a < 12 else 2 + a % 3):
            t = (a + k) % 3 if a < 12 else (a + k) % 6
            recs.append({"body": f"w{a % 5} says {k % 4} words {a % 7} t{t}", "who": f"a{a}", "topic": f"t{t}"})
    src.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    assert main(["authorship", "split", "--input", str(src), "--out", str(split), "authorship.text_column=body",
                 "authorship.author_column=who", "authorship.author_fraction=0.5", "authorship.topic_fraction=0.5",
                 "authorship.train_fraction=1.0"]) == 0
    assert main(["authorship", "evaluate", "--split", str(split), "--baseline", "tfidf"]) == 0
    assert (results / "tfidf.json").exists() and f"wrote {results / 'tfidf.json'}" in capsys.readouterr().out
    assert main(["authorship", "table", *map(str, sorted(results.glob("*.json")))]) == 0
    assert "| TF-IDF |" in capsys.readouterr().out
    before = (results / "tfidf.json").read_bytes()
    # a result already there is never replaced silently
    assert main(["authorship", "evaluate", "--split", str(split), "--baseline", "tfidf"]) == 2
    assert "exists; use --overwrite" in capsys.readouterr().err and (results / "tfidf.json").read_bytes() == before
