"""A local Google Cloud Storage endpoint for tests: gcp-storage-emulator (the GCS JSON API over
HTTP on 127.0.0.1, in memory). pyarrow reaches it with `gs://anonymous@bucket/...?scheme=http&
endpoint_override=host:port`: no credentials, so nothing looks for Google's metadata server."""

from __future__ import annotations

import socket
import uuid

_server = None
_port = 0

# The emulator serves one request at a time (http.server.HTTPServer): a reader that stops early (a
# ranged read of a .npy header) would hold it while Ray Train workers time out; one thread per request.
_LAUNCH = """
import http.server, sys, threading
import gcp_storage_emulator.server as emu
emu.server.HTTPServer = http.server.ThreadingHTTPServer
emu.create_server("127.0.0.1", int(sys.argv[1]), in_memory=True).start()
threading.Event().wait()
"""


def endpoint() -> str:
    """host:port of the one emulator of this process (started on first use, on a free port). It runs
    in its own process: in a thread of the test process it shares the GIL with pyarrow's reads of
    the objects it serves, and a ranged read then waits on a response that cannot be written."""
    global _server, _port
    if _server is None:
        import atexit
        import subprocess
        import sys
        import time

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            _port = s.getsockname()[1]
        _server = subprocess.Popen([sys.executable, "-c", _LAUNCH, str(_port)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        atexit.register(_server.kill)
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", _port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or _server.poll() is not None:
                    raise RuntimeError("gcp-storage-emulator did not start") from None
                time.sleep(0.1)
    return f"127.0.0.1:{_port}"


def uri(bucket: str, prefix: str = "") -> str:
    """A gs:// URI for pyarrow (and so the pipeline) pointing at the emulator; failed calls give up
    after 5 s (pyarrow's default retry budget is 15 minutes)."""
    path = f"{bucket}/{prefix}".rstrip("/")
    return f"gs://anonymous@{path}?scheme=http&endpoint_override={endpoint()}&retry_limit_seconds=5"


def make_bucket(name: str | None = None) -> str:
    """A new empty bucket; returns its name."""
    import pyarrow.fs as pafs

    name = name or f"b-{uuid.uuid4().hex[:12]}"
    host, port = endpoint().split(":")
    fs = pafs.GcsFileSystem(anonymous=True, scheme="http", endpoint_override=f"{host}:{port}", project_id="tests")
    fs.create_dir(name)
    return name
