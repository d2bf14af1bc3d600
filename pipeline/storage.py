"""Storage locations: local paths, shared filesystems and object stores (`s3://`, `gs://`, …).

    resolve("runs/x")                      -> pathlib.Path (absolute): local code paths stay as they are
    resolve("file:///mnt/nfs/runs")        -> pathlib.Path("/mnt/nfs/runs") (a shared filesystem is a path)
    resolve("s3://bucket/runs?endpoint_override=127.0.0.1:9000&scheme=http&region=us-east-1")
                                           -> RemotePath on pyarrow's S3FileSystem
    resolve("gs://bucket/runs")            -> RemotePath on pyarrow's GcsFileSystem
    resolve("gs://anonymous@bucket/runs?scheme=http&endpoint_override=127.0.0.1:9023")
                                           -> the same, unauthenticated (a public bucket, an emulator);
                                              other credentials in a URI are refused

Each concern is a module of its own, its names re-exported here (`from pipeline.storage import resolve`,
`storage.check_writable(...)` work as they always did):

    remote_path.py     `resolve`, `RemotePath` (the part of `pathlib.Path` the pipeline uses, on a pyarrow
                       filesystem), `Location`, `is_uri`, `from_filesystem`, `ray_storage`
    storage_io.py      complete-or-absent writes (`write_*_atomic`), `read_json`, `remove`, `rmtree`, folder copies
                       (`upload_dir` with a marker last, `download_dir`, `copy_dir`), `staging_dir`
    storage_checks.py  the write check: `check_writable` (a probe written, read back and deleted, bounded
                       by $PIPELINE_STORAGE_TIMEOUT_S) and `check_writable_on_nodes` (on every Ray node)
    credentials.py     credentials in a URI found in every spelling, refused (`split_uri`) and masked in
                       every message (`redact`)
"""

from __future__ import annotations

from .credentials import is_secret_name as _is_secret_name  # noqa: F401
from .credentials import redact  # noqa: F401
from .credentials import split_uri as _split_uri  # noqa: F401
from .remote_path import (OBJECT_STORES, Location, RemotePath, error_reason, from_filesystem,  # noqa: F401
                          is_uri, ray_storage, resolve)
from .remote_path import error_reason as _reason  # noqa: F401
from .storage_checks import (CHECK_NOTICE_S, CHECK_TIMEOUT_S, _bounded, _probe_task, check_writable,  # noqa: F401
                             check_writable_on_nodes)
from .storage_io import (copy_dir, download_dir, read_json, remove, rmtree, staging_dir, staging_root,  # noqa: F401
                         upload_dir, write_bytes_atomic, write_json_atomic, write_text_atomic)
