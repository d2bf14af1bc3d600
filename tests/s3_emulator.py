"""A local S3 endpoint for tests: moto's server (the S3 protocol over HTTP on 127.0.0.1).

Importing this module sets dummy AWS credentials in the environment. Test modules import it
at collection time, before the session's Ray starts, so Ray's workers inherit them too (as a
cluster's nodes would find real credentials in their environment or instance role).
"""

from __future__ import annotations

import os
import uuid

for _k, _v in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
               ("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_EC2_METADATA_DISABLED", "true")):
    os.environ.setdefault(_k, _v)

_server = None


def endpoint() -> str:
    """host:port of the one emulator of this process (started on first use, on a free port)."""
    global _server
    if _server is None:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        _server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        _server.start()
    host, port = _server.get_host_and_port()
    return f"{host}:{port}"


def make_bucket(name: str | None = None) -> str:
    """A new empty bucket; returns its name."""
    import boto3

    name = name or f"b-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=f"http://{endpoint()}", region_name="us-east-1").create_bucket(Bucket=name)
    return name


def uri(bucket: str, prefix: str = "") -> str:
    """An s3:// URI for pyarrow (and so the pipeline) pointing at the emulator."""
    path = f"{bucket}/{prefix}".rstrip("/")
    return f"s3://{path}?endpoint_override={endpoint()}&scheme=http&region=us-east-1"
