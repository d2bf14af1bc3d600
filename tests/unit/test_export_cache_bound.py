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


def _entry(cache, kind: str, name: str, size: int, used: float):
    entry = cache / kind / name
    entry.mkdir(parents=True)
    (entry / "tower.bin").write_bytes(b"\0" * size)
    os.utime(entry, (used, used))
    return entry


def _left(cache) -> set[str]:
    return {e.name for kind in ec.KINDS if (cache / kind).is_dir() for e in (cache / kind).iterdir()
            if not e.name.startswith(".")}


def test_the_least_recently_used_go_first_until_the_cache_fits(tmp_path):
    a = _entry(tmp_path, "openvino", "a", 400, OLD)
    _entry(tmp_path, "openvino-graphs", "b", 300, OLD + 10)
    _entry(tmp_path, "openvino", "c", 300, OLD + 20)
    _entry(tmp_path, "openvino", "d", 300, OLD + 30)
    note = ec.prune(tmp_path, limit=700, now=NOW)
    assert _left(tmp_path) == {"c", "d"}  # 1,300 bytes -> a (400) and b (300) removed: 600 <= 700
    assert note.startswith(f"the export cache {tmp_path} holds 0.0 GB after removing the 2 least recently used "
                           "entries") and "PIPELINE_EXPORT_CACHE_MAX_GB" in note and "still over" not in note
    assert not a.exists() and not list(tmp_path.glob("openvino/.a-broken-*"))  # set aside, then deleted
    assert ec.prune(tmp_path, limit=700, now=NOW) is None  # within the bound: nothing to say


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
