"""What a resumed `encode_corpus` found on disk when it started.

A killed encode's actors may still finish the shard they hold after the driver gave up (Ray stops
them asynchronously), so the shards a test reads right after the kill are a lower bound of what the
re-run finds. The guarantee under test is that the re-run reuses exactly the shards complete when
it starts and encodes exactly the rest; this spy records that set.
"""

from __future__ import annotations

from pipeline.index import encode as encode_mod


def watch_resume(monkeypatch) -> dict:
    """Returns a dict that holds, after the next encode_corpus call, the completed shards it found."""
    found: dict = {}
    real = encode_mod.completed_shards

    def spy(out_dir):
        done = real(out_dir)
        found.clear()
        found.update(done)
        return done

    monkeypatch.setattr(encode_mod, "completed_shards", spy)
    return found
