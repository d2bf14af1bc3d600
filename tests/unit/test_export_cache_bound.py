"""The export cache's bound (models/export_cache.prune, PIPELINE_EXPORT_CACHE_MAX_GB): the least recently used
entries go first, never the one just made, one used within the grace period or one another process holds;
a use keeps an entry; a bad bound is one clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from pipeline.errors import ConfigError
from pipeline.models import export_cache as ec

NOW = 1_000_000.0
OLD = NOW - 10 * ec.PRUNE_GRACE_S


def _entry(cache, kind: str, name: str, size: int, used: float, marked: bool = True):
    """An entry as the cache makes one (its kind's marker, sealed), or with `marked` off a folder of the user's."""
    entry = cache / kind / name
    entry.mkdir(parents=True)
    (entry / "tower.bin").write_bytes(b"\0" * size)
    if marked:
        (entry / ec.MARKERS[kind]).write_text(json.dumps(ec.seal({"files": ec._file_digests(entry, ["tower.bin"])})))
    os.utime(entry, (used, used))
    return entry


def _left(cache) -> set[str]:
    return {e.name for kind in ec.KINDS if (cache / kind).is_dir() for e in (cache / kind).iterdir()
            if not e.name.startswith(".")}


def test_the_least_recently_used_go_first_until_the_cache_fits(tmp_path):
    a = _entry(tmp_path, "openvino", "a", 4000, OLD)
    _entry(tmp_path, "openvino-graphs", "b", 3000, OLD + 10)
    _entry(tmp_path, "openvino", "c", 3000, OLD + 20)
    _entry(tmp_path, "openvino", "d", 3000, OLD + 30)
    note = ec.prune(tmp_path, limit=7000, now=NOW)
    assert _left(tmp_path) == {"c", "d"}  # 13,000 bytes (and markers) -> a and b removed: 6,000 (+ 2 markers) <= 7,000
    assert note.startswith(f"the export cache {tmp_path} holds 0.0 GB after removing the 2 least recently used "
                           "entries") and "PIPELINE_EXPORT_CACHE_MAX_GB" in note and "still over" not in note
    assert not a.exists() and not list(tmp_path.glob("openvino/.a-broken-*"))  # set aside, then deleted
    assert ec.prune(tmp_path, limit=7000, now=NOW) is None  # within the bound: nothing to say


def test_never_the_kept_one_a_recently_used_one_or_a_locked_one(tmp_path):
    made = _entry(tmp_path, "openvino", "made", 500, OLD)  # the oldest, but just made by this call
    _entry(tmp_path, "openvino", "recent", 500, NOW - 5)  # another process may be reading it
    locked = _entry(tmp_path, "openvino-graphs", "locked", 500, OLD + 1)
    _entry(tmp_path, "openvino", "old", 500, OLD + 2)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, sys, time
        f = open({str(locked.parent / '.locked.lock')!r}, "a+")
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        print("held", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        note = ec.prune(tmp_path, keep=made, limit=600, now=NOW)
    finally:
        holder.kill()
        holder.wait()
    assert _left(tmp_path) == {"made", "recent", "locked"}
    assert "removing the 1 least recently used entry (0.0 GB)" in note and "still over its bound" in note


def test_no_bound_and_a_bad_bound(tmp_path, monkeypatch):
    _entry(tmp_path, "openvino", "a", 1000, OLD)
    monkeypatch.setenv("PIPELINE_EXPORT_CACHE_MAX_GB", "0")
    assert ec.cache_limit_bytes() == 0 and ec.prune(tmp_path, now=NOW) is None and _left(tmp_path) == {"a"}
    monkeypatch.setenv("PIPELINE_EXPORT_CACHE_MAX_GB", "0.0000005")  # 500 bytes
    assert ec.prune(tmp_path, now=NOW) and _left(tmp_path) == set()
    monkeypatch.delenv("PIPELINE_EXPORT_CACHE_MAX_GB")
    assert ec.cache_limit_bytes() == 10 * 10**9
    for bad in ("ten", "-1", "nan", "inf"):
        monkeypatch.setenv("PIPELINE_EXPORT_CACHE_MAX_GB", bad)
        with pytest.raises(ConfigError, match="PIPELINE_EXPORT_CACHE_MAX_GB=.*not a size in GB"):
            ec.cache_limit_bytes()


def test_a_use_keeps_an_entry_and_making_one_prunes_the_others(tmp_path, monkeypatch):
    old = _entry(tmp_path, "openvino", "old", 600, OLD)
    used = _entry(tmp_path, "openvino", "used", 600, OLD - 100)

    def make(tmp):
        (tmp / "tower.bin").write_bytes(b"\1" * 600)
        return {"kind": "test"}

    # a complete entry that is found (not made) is touched: now the most recently used
    (used / "export.json").write_text(json.dumps(ec.seal({"files": ec._file_digests(used, ["tower.bin"])})))
    os.utime(used, (OLD - 100, OLD - 100))
    assert ec.cached_entry(used, "export.json", make, []) is False
    assert used.stat().st_mtime > NOW  # touched by the use (the real clock)
    monkeypatch.setenv("PIPELINE_EXPORT_CACHE_MAX_GB", str(1300 / 1e9))
    notes: list[str] = []
    new = tmp_path / "openvino" / "new"
    assert ec.cached_entry(new, "export.json", make, notes) is True
    assert _left(tmp_path) == {"used", "new"} and not old.exists()
    assert len(notes) == 1 and "removing the 1 least recently used entry" in notes[0]
    # an int8 entry sits in its tower's folder: making it touches the tower and keeps it
    int8 = new / "int8-abc"
    assert ec.cached_entry(int8, "quantized.json", make, []) is True
    assert ec._top_entry(int8) == new and (int8 / "quantized.json").is_file()


def test_over_the_bound_with_nothing_removable_says_nothing(tmp_path):
    _entry(tmp_path, "openvino", "recent", 500, NOW - 5)
    made = _entry(tmp_path, "openvino", "made", 500, NOW)
    assert ec.prune(tmp_path, keep=made, limit=100, now=NOW) is None and _left(tmp_path) == {"recent", "made"}


def test_a_folder_the_cache_did_not_make_is_never_removed_nor_counted(tmp_path):
    """With PIPELINE_EXPORT_CACHE pointed at a folder holding a user's `openvino/my-own-ir/`, an encode with a
    small bound removed it: any folder under openvino/ was taken as an entry. Only sealed entries go now; an
    entry whose marker was altered is not the cache's to remove (it is repaired when it is used)."""
    own = _entry(tmp_path, "openvino", "my-own-ir", 5000, OLD - 1000, marked=False)
    (own / "export.json").write_text('{"mine": true}')  # even a file of the marker's name is not a seal
    altered = _entry(tmp_path, "openvino-graphs", "altered", 5000, OLD - 900)
    record = json.loads((altered / "graph.json").read_text())
    (altered / "graph.json").write_text(json.dumps({**record, "files": {}}))
    ours = _entry(tmp_path, "openvino", "ours", 500, OLD)
    assert not ec.owned_entry(own) and not ec.owned_entry(altered) and ec.owned_entry(ours)
    assert ec.prune(tmp_path, limit=1000, now=NOW) is None  # 500 bytes and a marker of its own: within the bound
    note = ec.prune(tmp_path, limit=100, now=NOW)
    assert _left(tmp_path) == {"my-own-ir", "altered"} and (own / "tower.bin").stat().st_size == 5000
    assert "removing the 1 least recently used entry" in note


def test_an_entry_another_process_is_using_is_never_removed_however_long_ago_it_was_touched(tmp_path):
    """The grace period was the only protection of an entry being read: the check came before the touch, and an
    encode longer than PRUNE_GRACE_S was unprotected. A reader holds the entry in use (a shared lock) from
    before its check until it has compiled it; a prune removes only what no process holds."""
    used = _entry(tmp_path, "openvino", "used", 500, OLD)
    _entry(tmp_path, "openvino", "idle", 500, OLD + 1)
    reader = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from pathlib import Path
        from pipeline.models import export_cache as ec
        with ec.in_use(Path({str(used)!r}) / "int8-abc"):  # an int8 entry holds its tower
            print("reading", flush=True)
            time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "reading"
        note = ec.prune(tmp_path, limit=100, now=NOW)
    finally:
        reader.kill()
        reader.wait()
    assert _left(tmp_path) == {"used"} and "still over its bound" in note
    assert ec.prune(tmp_path, limit=100, now=NOW) and _left(tmp_path) == set()  # no reader now: it goes
    with ec.in_use(tmp_path / "openvino" / "gone"):  # several readers, and one of an entry not there, are fine
        with ec.in_use(tmp_path / "openvino" / "gone"):
            pass
