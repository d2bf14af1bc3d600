"""tests/subprocs.run_cluster_script: a simulated cluster's script is started once more only when a node missed
Ray's fixed 30 s registration window, in a new folder; any other failure, or that window missed twice, fails."""

from __future__ import annotations

import textwrap

import pytest
from subprocs import NODE_START_TIMEOUT, run_cluster_script

# prints `up` in the folders it is told to, then fails with `message` in the folders it is told to fail in, else
# prints its RESULT
SCRIPT = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    folder, fail_in, message, up_in = Path(sys.argv[1]), sys.argv[2].split(","), sys.argv[3], sys.argv[4].split(",")
    (folder / "started").write_text("")
    if folder.name in up_in:
        print("STAGE two nodes up", flush=True)
    if folder.name in fail_in:
        raise SystemExit(message)
    print("RESULT " + json.dumps({"folder": folder.name}))
''')


def test_a_missed_start_up_window_is_run_again_in_a_new_folder(tmp_path, capsys):
    res, folder = run_cluster_script(SCRIPT, tmp_path, lambda d: (d, "run-1", NODE_START_TIMEOUT + ". This could", ""),
                                     timeout=60, what="a script")
    assert res == {"folder": "run-2"} and folder == tmp_path / "run-2"
    assert (tmp_path / "run-1" / "started").exists() and (tmp_path / "run-2" / "started").exists()
    assert "missed Ray's fixed 30 s start-up window" in capsys.readouterr().err


def test_another_failure_the_window_missed_once_up_or_twice_fails(tmp_path):
    with pytest.raises(AssertionError, match="exit 1"):
        run_cluster_script(SCRIPT, tmp_path / "a", lambda d: (d, "run-1", "some other error", ""), timeout=60,
                           what="a script")
    assert not (tmp_path / "a" / "run-2").exists()
    # the same message after the nodes were up: not a start-up that missed its window
    with pytest.raises(AssertionError, match=NODE_START_TIMEOUT):
        run_cluster_script(SCRIPT, tmp_path / "b", lambda d: (d, "run-1", NODE_START_TIMEOUT, "run-1"), timeout=60,
                           what="a script")
    assert not (tmp_path / "b" / "run-2").exists()
    with pytest.raises(AssertionError, match=NODE_START_TIMEOUT):
        run_cluster_script(SCRIPT, tmp_path / "c", lambda d: (d, "run-1,run-2", NODE_START_TIMEOUT, ""), timeout=60,
                           what="a script")
