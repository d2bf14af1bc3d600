"""Progress of long steps inside a run: updates reach the installed sink (first, last, and at most
every `every` seconds between), the driver's lines read as people expect, and the wall-time split."""

from __future__ import annotations

from pipeline import progress
from pipeline.train.trainer import format_progress, wall_split


def test_updates_reach_the_sink_first_last_and_throttled():
    got = []
    progress.update("encoding passages", 0, 10)  # no sink: nothing, no error
    with progress.sink(got.append, every=3600):
        for done in range(0, 11, 2):
            progress.update("encoding passages", done, 10)
    assert [r["done"] for r in got] == [0, 10]  # the first and the last; the rest within the hour
    assert got[-1]["total"] == 10 and got[-1]["what"] == "encoding passages"
    got.clear()
    with progress.sink(got.append, every=0):
        for done in (0, 5, 10):
            progress.update("encoding queries", done, 10)
    assert [r["done"] for r in got] == [0, 5, 10]
    with progress.sink(lambda rec: 1 / 0, every=0):
        progress.update("encoding passages", 1, 2)  # a broken sink never breaks the work


def test_the_driver_prints_validation_progress_and_the_wall_split():
    rec = {"kind": "progress", "step": 28, "stage": "validation", "what": "encoding passages", "done": 2048,
           "total": 5183, "rate": 18.2, "eta_s": 174.2}
    assert format_progress("dpr", rec, ("nll",)) == [
        "[train] dpr step 28 validation: encoding 2,048/5,183 passages, 18/s, ETA 2:54"]
    done = {**rec, "done": 5183, "eta_s": 0.0}
    assert format_progress("dpr", done, ("nll",))[0].endswith("encoding 5,183/5,183 passages, 18/s")
    split = {"time_split": {"start-up": 24.2, "training": 60.4, "validation": 452.0, "checkpoints": 3.1, "export": 1.0}}
    assert wall_split(split) == "start-up 24s, training 60s, validation 452s, checkpoints 3s, export 1s"
    assert wall_split({}) == "already complete"


def test_a_sink_hears_only_its_own_thread():
    """A background thread's work (e.g. a negatives version loading during validation) is not
    reported as the validation's progress."""
    import threading

    got = []
    with progress.sink(got.append, every=0):
        t = threading.Thread(target=progress.update, args=("reading corpus parts", 1, 1))
        t.start()
        t.join()
        progress.update("encoding passages", 1, 1)
    assert [r["what"] for r in got] == ["encoding passages"]
