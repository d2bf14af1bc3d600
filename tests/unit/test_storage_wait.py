"""storage.check_writable on a store that never answers: one clear error naming the location, and a line
saying what is waited on, never a silent wait (pyarrow's GCS client retries for 15 minutes by default).

The store here is a socket on 127.0.0.1 that accepts connections (the kernel's backlog) and never
answers a request, so the probe cannot finish however long it is given: the tests assert the error
and the line, never a duration."""

from __future__ import annotations

import contextlib
import socket

import pytest

from pipeline import storage
from pipeline.errors import ConfigError


@contextlib.contextmanager
def silent_endpoint():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)  # connections complete in the backlog; nothing ever reads or answers them
    try:
        yield f"127.0.0.1:{s.getsockname()[1]}"
    finally:
        s.close()


def test_a_store_that_does_not_answer_is_one_clear_error_after_a_line_saying_what_is_waited_on(capsys):
    with silent_endpoint() as endpoint:
        uri = f"gs://anonymous@bucket/runs?scheme=http&endpoint_override={endpoint}"
        with pytest.raises(ConfigError) as e:
            storage.check_writable(uri, who="the driver", timeout_s=1, notice_s=0)
    msg = str(e.value)
    assert msg.startswith(f"storage {uri}: the store did not answer within 1 s")
    assert "from the driver" in msg and "PIPELINE_STORAGE_TIMEOUT_S" in msg
    err = capsys.readouterr().err
    assert f"[storage] checking that {uri} is writable (waiting for the store" in err
    assert err.count("\n") == 1  # one line


def test_the_cli_bounds_the_wait_by_the_environment_and_prints_one_error_line(tmp_path, monkeypatch, capsys):
    from pipeline.cli import main

    monkeypatch.setenv("PIPELINE_STORAGE_TIMEOUT_S", "1")
    with silent_endpoint() as endpoint:
        uri = f"gs://anonymous@bucket/emb?scheme=http&endpoint_override={endpoint}"
        assert main(["encode", "--corpus", str(tmp_path / "corpus"), "--out", uri]) == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: storage {uri}: the store did not answer within 1 s")
    assert not (tmp_path / "corpus").exists()


def test_a_store_that_answers_is_checked_as_before_and_a_bad_timeout_is_refused(tmp_path, monkeypatch, capsys):
    storage.check_writable(str(tmp_path / "new" / "dir"), timeout_s=30)
    assert list((tmp_path / "new" / "dir").iterdir()) == []  # the probe is gone
    assert capsys.readouterr().err == ""  # no line when nothing was waited on
    monkeypatch.setenv("PIPELINE_STORAGE_TIMEOUT_S", "soon")
    with pytest.raises(ConfigError, match="PIPELINE_STORAGE_TIMEOUT_S='soon': must be a positive number"):
        storage.check_writable(str(tmp_path))


def test_the_gcs_probe_gives_up_retrying_near_the_timeout():
    """The probe left running after the check gave up ends too: the GCS client's own retries are bounded
    (pyarrow's retry_limit_seconds, 15 minutes by default), without changing the URI the messages show;
    a bound the URI sets itself is kept."""
    import datetime

    def retry_limit(loc):
        return loc.fs.__reduce__()[1][0]["retry_time_limit"]  # the options pyarrow pickles the filesystem with

    loc = storage.resolve("gs://anonymous@bucket/runs?scheme=http&endpoint_override=127.0.0.1:9")
    bounded = storage._bounded(loc, 7)
    assert str(bounded) == str(loc) and retry_limit(bounded) == datetime.timedelta(seconds=7)
    own = storage.resolve("gs://anonymous@bucket/runs?scheme=http&retry_limit_seconds=3")
    assert retry_limit(storage._bounded(own, 7)) == datetime.timedelta(seconds=3)
    local = storage.resolve("/tmp/x")
    assert storage._bounded(local, 7) is local
