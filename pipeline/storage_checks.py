"""The write check: can this process, and every Ray node, write to a storage location?

`check_writable(location)` writes, reads back and deletes a probe object and raises a
`ConfigError` naming the location and the reason (missing bucket, no credentials, access
denied, read-only, or a store that did not answer within $PIPELINE_STORAGE_TIMEOUT_S, 60 s:
the probe runs in a thread, and a line says what is waited on after 5 s) — `check_writable_on_nodes`
runs the same probe on every Ray node, which must also see a probe the driver wrote (shared storage).
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid

from .credentials import redact
from .errors import ConfigError
from .remote_path import Location, RemotePath, error_reason, is_uri, resolve
from .storage_io import write_bytes_atomic

CHECK_TIMEOUT_S = 60.0  # how long the write check waits for a store ($PIPELINE_STORAGE_TIMEOUT_S)
CHECK_NOTICE_S = 5.0  # after this long, one line says what is being waited on


def _check_timeout() -> float:
    raw = os.environ.get("PIPELINE_STORAGE_TIMEOUT_S")
    if not raw:
        return CHECK_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value != value or value == float("inf"):
        raise ConfigError(f"PIPELINE_STORAGE_TIMEOUT_S={raw!r}: must be a positive number of seconds")
    return value


def _bounded(loc: Location, timeout_s: float) -> Location:
    """`loc` on a filesystem whose own retries end near `timeout_s`: pyarrow's GCS client retries a store
    that does not answer for 15 minutes by default, and a probe left running after the check gave up
    would go on that long (S3's client gives up by itself). The URI and its messages are unchanged."""
    if not isinstance(loc, RemotePath) or loc.scheme not in ("gs", "gcs") or "retry_limit_seconds" in loc.query:
        return loc
    import pyarrow.fs as pafs

    query = "&".join(q for q in (loc.query, f"retry_limit_seconds={max(1, int(timeout_s))}") if q)
    base = f"{loc.scheme}://{loc._user_at}{loc.path.split('/', 1)[0]}?{query}"
    try:
        fs, _ = pafs.FileSystem.from_uri(base)
    except Exception:  # the option refused by this pyarrow: the check's own timeout still bounds the wait
        return loc
    out = loc._with(loc.path)
    out._fs = fs
    return out


def _probe(location, who: str | None, step: list[str], timeout_s: float) -> None:
    """Write, read back and delete a probe under `location` (`step[0]` says which step is under way)."""
    loc = _bounded(resolve(location), timeout_s)
    who = who or f"{socket.gethostname()} (pid {os.getpid()})"
    probe_name = f".write-probe-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    payload = uuid.uuid4().hex.encode()
    step[0] = "create the folder"
    try:
        loc.mkdir(parents=True, exist_ok=True)
        probe = loc / probe_name
        step[0] = "write a probe object"
        probe.write_bytes(payload)
        step[0] = "read the probe back"
        if probe.read_bytes() != payload:
            raise OSError("the probe read back differs from what was written")
        step[0] = "delete the probe"
        probe.unlink()
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"storage {location}: cannot {step[0]} from {who}: {error_reason(e)}. Every node that trains "
                          "or encodes must be able to write there (check the bucket, the credentials of that "
                          "node, e.g. AWS_* / GOOGLE_APPLICATION_CREDENTIALS or an instance role, and mounts)"
                          ) from None


def check_writable(location: str | Location, who: str | None = None, *, timeout_s: float | None = None,
                   notice_s: float = CHECK_NOTICE_S) -> None:
    """Write, read back and delete a probe under `location`; ConfigError naming the reason if any step fails.

    The probe runs in a thread and is waited on for `timeout_s` (default $PIPELINE_STORAGE_TIMEOUT_S, else
    60 s): a store that does not answer (no network, a wrong endpoint) is one ConfigError naming the location,
    never a silent wait. After `notice_s` one line on stderr says what is being waited on."""
    import sys
    import threading

    timeout_s = _check_timeout() if timeout_s is None else float(timeout_s)
    where = redact(str(location))
    step = ["reach the store"]
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            _probe(location, who, step, timeout_s)
            outcome.append(None)
        except BaseException as e:  # handed to the caller's thread
            outcome.append(e)

    # a daemon thread: a store that never answers cannot keep the process from exiting after the error
    worker = threading.Thread(target=run, name="storage-write-check", daemon=True)
    worker.start()
    worker.join(max(0.0, min(notice_s, timeout_s)))
    what = "the store" if is_uri(location) else "the filesystem"
    if worker.is_alive() and notice_s < timeout_s:
        print(f"[storage] checking that {where} is writable (waiting for {what}; up to {timeout_s:g} s) ...",
              file=sys.stderr, flush=True)
        worker.join(timeout_s - notice_s)
    if worker.is_alive() or not outcome:
        raise ConfigError(f"storage {where}: {what} did not answer within {timeout_s:g} s (while trying to "
                          f"{step[0]} from {who or socket.gethostname()}); check the network, the endpoint and "
                          "the bucket (PIPELINE_STORAGE_TIMEOUT_S sets how long this check waits)")
    if outcome[0] is not None:
        raise outcome[0]


def _probe_task(location: str, shared: str) -> str | None:
    loc = resolve(location)
    try:
        seen = (loc / shared).read_bytes()
    except Exception:
        seen = None
    if seen != shared.encode():
        return (f"storage {location}: this node does not see the probe the driver wrote there, so it is not "
                "storage shared by the nodes (a local path on each machine?); use a shared filesystem mounted "
                "at the same path on every node, or an object-store URI (s3://…, gs://…)")
    try:
        check_writable(location)
    except ConfigError as e:
        return str(e)
    return None


def check_writable_on_nodes(location: str | Location) -> int:
    """The write check on every alive Ray node (a zero-CPU task pinned to each), which must also
    see a probe the driver wrote (shared storage, not one local folder per machine).
    Returns the number of nodes checked."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    loc = resolve(location)
    shared = f".shared-probe-{uuid.uuid4().hex[:12]}"
    check_writable(loc, who="the driver")
    write_bytes_atomic(loc / shared, shared.encode())
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        task = ray.remote(num_cpus=0, max_retries=0)(_probe_task)
        refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            str(location), shared) for n in nodes]
        try:
            answers = ray.get(refs, timeout=_check_timeout() * 2)
        except ray.exceptions.GetTimeoutError:
            raise ConfigError(f"storage {redact(str(location))}: the write check on the Ray nodes did not finish "
                              f"within {_check_timeout() * 2:g} s (a node that cannot reach the store, or no "
                              "free worker on it)") from None
        errors = [(n, e) for n, e in zip(nodes, answers) if e]
    finally:
        with contextlib.suppress(Exception):
            (loc / shared).unlink()
    if errors:
        n, e = errors[0]
        raise ConfigError(f"{len(errors)} of {len(nodes)} Ray node(s) cannot use the storage; e.g. node "
                          f"{n.get('NodeManagerAddress')}: {e}")
    return len(nodes)
