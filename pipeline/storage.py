"""Storage locations: local paths, shared filesystems and object stores (`s3://`, `gs://`, …).

    resolve("runs/x")                      -> pathlib.Path (absolute): local code paths stay as they are
    resolve("file:///mnt/nfs/runs")        -> pathlib.Path("/mnt/nfs/runs") (a shared filesystem is a path)
    resolve("s3://bucket/runs?endpoint_override=127.0.0.1:9000&scheme=http&region=us-east-1")
                                           -> RemotePath on pyarrow's S3FileSystem
    resolve("gs://bucket/runs")            -> RemotePath on pyarrow's GcsFileSystem
    resolve("gs://anonymous@bucket/runs?scheme=http&endpoint_override=127.0.0.1:9023")
                                           -> the same, unauthenticated (a public bucket, an emulator);
                                              other credentials in a URI are refused

`RemotePath` offers the part of `pathlib.Path` the pipeline uses (`/`, `name`, `parent`,
`exists`, `is_dir`, `iterdir`, `stat().st_size`, `read_text`, `write_text`, …), so readers
written against `Path` (checkpoint and negatives listings) work on both. Its `str()` is the
URI with its query options, so it can be handed to Ray workers as a string and resolved
there; credentials are never part of it: every process finds them the usual way for its
store (AWS_* / GOOGLE_* environment variables, ~/.aws, an instance role).

Writes are "complete or absent": on object stores (S3, GCS) one object appears only when
its upload has finished, so an object is written in place; on filesystems that can
rename, under a temporary name and then moved. Folders get their files first and a
completion marker last (`upload_dir(..., marker=...)`), and readers trust only folders
with the marker (or, for checkpoints, a state.json listing every file's size).

`check_writable(location)` writes, reads back and deletes a probe object and raises a
`ConfigError` naming the location and the reason (missing bucket, no credentials, access
denied, read-only) — `check_writable_on_nodes` runs the same probe on every Ray node.

Size: ~510 lines on purpose: `RemotePath` (the Path subset), the complete-or-absent writes,
the upload/download helpers and the write checks are one concern, the one place URIs are handled.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator, Union

from .errors import ConfigError

OBJECT_STORES = ("s3", "gcs")  # pyarrow type names whose single-object writes are atomic


def is_uri(location) -> bool:
    """True for `scheme://…` strings other than `file://` (those are local paths)."""
    return isinstance(location, RemotePath) or (isinstance(location, str) and "://" in location
                                                and not location.startswith("file://"))


# query options that carry a credential: any whose name (percent-decoded) contains one of these words
# (secret_key, access_key, x-amz-security-token, X-Amz-Signature, X-Amz-Credential, sas_token, password,
# api_key, ...) or is one of the short spellings; never kept in a URI, masked in every message
_SECRET_WORDS = ("token", "secret", "key", "signature", "credential", "password", "passwd")
_SECRET_NAMES = ("pwd", "sig", "sas", "auth")
_USERINFO_RE = re.compile(r"(^|//)[^/@?&=\s]+:[^/@?&\s]*@")
_URI_RE = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)([^\s'\"]*)")


def _is_secret_name(name: str) -> bool:
    """A query option's name that names a credential, however it is spelled (percent-encoded too)."""
    from urllib.parse import unquote_plus

    key = unquote_plus(name).strip().lower()
    return any(w in key for w in _SECRET_WORDS) or key in _SECRET_NAMES


def _has_userinfo(value: str) -> bool:
    """A `user:password@host` inside an option's (percent-decoded) value, e.g. endpoint_override."""
    from urllib.parse import unquote_plus

    return bool(_USERINFO_RE.search(unquote_plus(value)))


def redact(text: str) -> str:
    """`text` with every credential inside a URI replaced by ***: a user:password@ part (only
    `anonymous@` is kept) and the value of any credential-like query option (secret_key=…)."""
    def one(m: re.Match) -> str:
        scheme, rest = m.group(1), m.group(2)
        trail = rest[len(rest.rstrip(":;,.)")):]  # the sentence's punctuation after the URI stays
        rest = rest[:len(rest) - len(trail)]
        path, q, query = rest.partition("?")
        head, sep, tail = path.partition("/")
        if "@" in head:
            user, host = head.rsplit("@", 1)
            head = f"{user}@{host}" if user == "anonymous" else f"***@{host}"
        if q:
            parts = []
            for item in query.split("&"):
                key, eq, value = item.partition("=")
                if eq and _is_secret_name(key):
                    item = f"{key}=***"
                elif eq and _has_userinfo(value):
                    from urllib.parse import unquote_plus

                    item = f"{key}=" + _USERINFO_RE.sub(lambda m: m.group(1) + "***@", unquote_plus(value))
                parts.append(item)
            query = "&".join(parts)
        return scheme + head + sep + tail + q + query + trail
    return _URI_RE.sub(one, text)


def _split_uri(uri: str) -> tuple[str, str, str, str]:
    """(scheme, user, bucket/path, query). The only user a URI may carry is `anonymous`
    (pyarrow's unauthenticated access, e.g. a public bucket or a local emulator): a URI is written
    into manifests, run records and logs, so credentials in it are refused."""
    scheme, rest = uri.split("://", 1)
    path, _, query = rest.partition("?")
    head, sep, tail = path.partition("/")
    user = ""
    if "@" in head:
        user, head = head.rsplit("@", 1)
        if user != "anonymous":
            raise ConfigError(f"{scheme}://…@{head}: credentials in a storage URI would be written into manifests "
                              "and logs; give them the usual way for the store (AWS_* / GOOGLE_APPLICATION_"
                              "CREDENTIALS environment variables, ~/.aws, an instance role), or use anonymous@")
    secret = [item.partition("=")[0] for item in query.split("&")
              if item and (_is_secret_name(item.partition("=")[0]) or _has_userinfo(item.partition("=")[2]))]
    if secret:
        raise ConfigError(f"{redact(uri)}: credentials in a storage URI ({', '.join(secret)}) would be written into "
                          "manifests and logs; give them the usual way for the store (AWS_* / GOOGLE_APPLICATION_"
                          "CREDENTIALS environment variables, ~/.aws, an instance role)")
    return scheme, user, (head + sep + tail).strip("/"), query


class RemotePath:
    """A file or folder on a pyarrow filesystem, addressed by URI (see the module doc)."""

    def __init__(self, uri: str, fs=None):
        scheme, user, path, query = _split_uri(uri)
        if not path:
            raise ConfigError(f"{uri}: a storage URI needs a bucket (and optionally a prefix), e.g. s3://bucket/runs")
        self.scheme, self.user, self.path, self.query = scheme, user, path, query
        self._fs = fs

    # ---- identity ---------------------------------------------------------------
    @property
    def uri(self) -> str:
        return f"{self.scheme}://{self._user_at}{self.path}" + (f"?{self.query}" if self.query else "")

    @property
    def _user_at(self) -> str:
        return f"{self.user}@" if self.user else ""

    def __str__(self) -> str:
        return self.uri

    def __repr__(self) -> str:
        return f"RemotePath({self.uri!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, RemotePath) and other.uri == self.uri

    def __hash__(self) -> int:
        return hash(self.uri)

    def __getstate__(self):  # the filesystem is re-made from the URI where it is unpickled
        return {"scheme": self.scheme, "user": self.user, "path": self.path, "query": self.query, "_fs": None}

    @property
    def fs(self):
        if self._fs is None:
            import pyarrow.fs as pafs

            base = (f"{self.scheme}://{self._user_at}{self.path.split('/', 1)[0]}"
                    + (f"?{self.query}" if self.query else ""))
            try:
                self._fs, _ = pafs.FileSystem.from_uri(base)
            except Exception as e:
                raise ConfigError(redact(f"{self.uri}: not a usable storage URI ({_reason(e)})")) from None
        return self._fs

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def parent(self) -> "RemotePath":
        head = self.path.rsplit("/", 1)[0] if "/" in self.path else self.path
        return self._with(head)

    def _with(self, path: str) -> "RemotePath":
        out = RemotePath.__new__(RemotePath)
        out.scheme, out.user, out.path, out.query, out._fs = self.scheme, self.user, path, self.query, self._fs
        return out

    def __truediv__(self, name) -> "RemotePath":
        name = str(name).strip("/")
        return self._with(f"{self.path}/{name}" if name else self.path)

    def joinpath(self, *names) -> "RemotePath":
        out = self
        for n in names:
            out = out / n
        return out

    def relative_to(self, other: "RemotePath") -> str:
        if not self.path.startswith(other.path + "/"):
            raise ValueError(f"{self} is not under {other}")
        return self.path[len(other.path) + 1:]

    # ---- queries ----------------------------------------------------------------
    def _info(self):
        return self.fs.get_file_info(self.path)

    def exists(self) -> bool:
        import pyarrow.fs as pafs

        return self._info().type != pafs.FileType.NotFound

    def is_dir(self) -> bool:
        import pyarrow.fs as pafs

        return self._info().type == pafs.FileType.Directory

    def is_file(self) -> bool:
        import pyarrow.fs as pafs

        return self._info().type == pafs.FileType.File

    def stat(self):
        import pyarrow.fs as pafs

        info = self._info()
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(self.uri)
        return SimpleNamespace(st_size=info.size or 0, st_mtime=info.mtime.timestamp() if info.mtime else 0.0)

    def iterdir(self) -> Iterator["RemotePath"]:
        import pyarrow.fs as pafs

        # pyarrow's GCS lists one level only with folder marker objects, which uploads of single
        # objects (ours, Ray Train's) do not leave: there the children come from a full listing
        deep = self.fs.type_name == "gcs"
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.path, recursive=deep, allow_not_found=True))
        except FileNotFoundError:
            return iter(())
        children = dict.fromkeys(i.path.rstrip("/")[len(self.path) + 1:].split("/", 1)[0] for i in infos
                                 if i.path.rstrip("/").startswith(self.path + "/"))
        return iter([self._with(f"{self.path}/{c}") for c in children if c])

    def glob(self, pattern: str) -> Iterator["RemotePath"]:
        """Children whose name matches `pattern` (one level, as the pipeline uses it)."""
        return iter(sorted((c for c in self.iterdir() if fnmatch.fnmatch(c.name, pattern)), key=lambda c: c.path))

    def file_sizes(self) -> dict[str, int]:
        """Every file under this folder (relative path -> bytes), in one listing."""
        import pyarrow.fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.path, recursive=True, allow_not_found=True))
        except FileNotFoundError:
            return {}
        n = len(self.path) + 1
        return {i.path[n:]: i.size for i in infos if i.type == pafs.FileType.File}

    # ---- reads and writes ---------------------------------------------------------
    def read_bytes(self) -> bytes:
        import pyarrow.fs as pafs

        try:
            with self.fs.open_input_stream(self.path) as f:
                return f.read()
        except OSError as e:
            if self._info().type == pafs.FileType.NotFound:
                raise FileNotFoundError(self.uri) from None
            raise OSError(f"{self.uri}: {_reason(e)}") from None

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> None:
        """Complete or absent: one object on object stores; temp name + move elsewhere."""
        if self.fs.type_name in OBJECT_STORES:
            with self.fs.open_output_stream(self.path) as f:
                f.write(data)
            return
        tmp = self.parent / f".tmp-{self.name}-{uuid.uuid4().hex[:8]}"
        with self.fs.open_output_stream(tmp.path) as f:
            f.write(data)
        self.fs.move(tmp.path, self.path)

    def write_text(self, text: str, encoding: str = "utf-8") -> None:
        self.write_bytes(text.encode(encoding))

    def touch(self, exist_ok: bool = True) -> None:
        if not (exist_ok and self.exists()):
            self.write_bytes(b"")

    def mkdir(self, parents: bool = True, exist_ok: bool = True) -> None:
        if self.fs.type_name not in OBJECT_STORES:  # object stores have no folders to make
            self.fs.create_dir(self.path, recursive=True)

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.delete_file(self.path)
        except OSError:
            if self.exists():
                raise
            if not missing_ok:
                raise FileNotFoundError(self.uri) from None

    def rmtree(self) -> None:
        try:
            self.fs.delete_dir(self.path)
        except OSError:  # FileNotFoundError on S3; GCS says OSError("No such directory")
            if self.exists():
                raise


Location = Union[Path, RemotePath]


def resolve(location: str | os.PathLike | RemotePath) -> Location:
    """A path or URI -> an absolute local `Path` or a `RemotePath` (checked to be a usable URI)."""
    if isinstance(location, RemotePath):
        return location
    s = str(location)
    if s.startswith("file://"):
        return Path(s[len("file://"):].split("?", 1)[0]).expanduser().resolve()
    if "://" in s:
        r = RemotePath(s)
        r.fs  # noqa: B018 - unknown schemes and bad options fail here, with the URI named
        return r
    return Path(s).expanduser().resolve()


def ray_storage(location: Location) -> tuple[str, object | None]:
    """(storage_path, storage_filesystem) for Ray Train's RunConfig."""
    if isinstance(location, RemotePath):
        return location.path, location.fs
    return str(location), None


def from_filesystem(fs, path: str, like: Location | None = None) -> Location:
    """A location from a (pyarrow filesystem, path) pair, e.g. Ray's `Checkpoint.filesystem/.path`."""
    import pyarrow.fs as pafs

    if fs is None or isinstance(fs, pafs.LocalFileSystem):
        return Path(path)
    if isinstance(like, RemotePath):
        out = like._with(path.strip("/"))
        out._fs = fs
        return out
    scheme = {"gcs": "gs"}.get(fs.type_name, fs.type_name)
    return RemotePath(f"{scheme}://{path.strip('/')}", fs=fs)


# --------------------------------------------------------------------------- helpers on either kind

def read_json(location: Location):
    return json.loads(location.read_text())


def write_bytes_atomic(location: Location, data: bytes) -> None:
    if isinstance(location, RemotePath):
        location.write_bytes(data)
        return
    from .io_utils import atomic_path

    location.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(location) as tmp:
        Path(tmp).write_bytes(data)


def write_text_atomic(location: Location, text: str) -> None:
    write_bytes_atomic(location, text.encode("utf-8"))


def write_json_atomic(location: Location, obj) -> None:
    write_text_atomic(location, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def rmtree(location: Location) -> None:
    if isinstance(location, RemotePath):
        location.rmtree()
    else:
        shutil.rmtree(location, ignore_errors=True)


def upload_dir(local_dir: str | Path, dest: Location, marker: str | None = None) -> None:
    """Copy a local folder to `dest` (files first, then `marker` if given, written last)."""
    local_dir = Path(local_dir)
    files = sorted(p for p in local_dir.rglob("*") if p.is_file() and (marker is None or p.name != marker))
    if isinstance(dest, Path):
        for p in files:
            (dest / p.relative_to(local_dir)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dest / p.relative_to(local_dir))
    else:
        import pyarrow.fs as pafs

        dest.mkdir()
        for p in files:
            pafs.copy_files(str(p), (dest / str(p.relative_to(local_dir))).path,
                            source_filesystem=pafs.LocalFileSystem(), destination_filesystem=dest.fs)
    if marker is not None:
        src = local_dir / marker
        write_bytes_atomic(dest / marker, src.read_bytes() if src.exists() else b"ok\n")


def download_dir(src: Location, local_dir: str | Path) -> Path:
    """Copy a folder (local or remote) into `local_dir` (made if missing); returns `local_dir`."""
    local_dir = Path(local_dir)
    local_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(src, Path):
        shutil.copytree(src, local_dir, dirs_exist_ok=True)
        return local_dir
    import pyarrow.fs as pafs

    for rel in sorted(src.file_sizes()):
        (local_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        pafs.copy_files((src / rel).path, str(local_dir / rel), source_filesystem=src.fs,
                        destination_filesystem=pafs.LocalFileSystem())
    return local_dir


def copy_dir(src: Location, dst: Location) -> None:
    """Folder to folder, across any two locations (remote -> remote copies through this process)."""
    if isinstance(src, Path):
        upload_dir(src, dst)
        return
    if isinstance(dst, Path):
        download_dir(src, dst)
        return
    import pyarrow.fs as pafs

    for rel in sorted(src.file_sizes()):
        pafs.copy_files((src / rel).path, (dst / rel).path, source_filesystem=src.fs, destination_filesystem=dst.fs)


def staging_dir(location: Location, kind: str = "runs") -> Path:
    """A local working folder that stands for a remote location on this machine (a cache:
    safe to delete). $PIPELINE_STAGING_DIR, else <tmp>/pipeline-staging."""
    root = Path(os.environ.get("PIPELINE_STAGING_DIR") or Path(tempfile.gettempdir()) / "pipeline-staging")
    key = hashlib.sha256(str(location).encode()).hexdigest()[:16]
    name = location.name if location.name else "root"
    out = root / kind / f"{name}-{key}"
    out.mkdir(parents=True, exist_ok=True)
    return out


# --------------------------------------------------------------------------- the write check

def _reason(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    low = msg.lower()
    gcs_write_404 = "not_found" in low and ("createresumableupload" in low or "insertobject" in low)
    if "no_such_bucket" in low or "nosuchbucket" in low or "bucket does not exist" in low or gcs_write_404:
        return f"the bucket does not exist ({msg[:200]})"
    if "access_denied" in low or "accessdenied" in low or "forbidden" in low or "403" in low:
        return f"access denied: the credentials this process finds may not write there ({msg[:200]})"
    if "credential" in low or "invalidaccesskeyid" in low or "signaturedoesnotmatch" in low:
        return f"no valid credentials ({msg[:200]})"
    if "read-only" in low or "read only" in low or isinstance(e, PermissionError):
        return f"read-only or not permitted ({msg[:200]})"
    return msg[:300] or type(e).__name__


def check_writable(location: str | Location, who: str | None = None) -> None:
    """Write, read back and delete a probe under `location`; ConfigError naming the reason if any step fails."""
    loc = resolve(location)
    who = who or f"{socket.gethostname()} (pid {os.getpid()})"
    probe_name = f".write-probe-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    payload = uuid.uuid4().hex.encode()
    step = "create the folder"
    try:
        loc.mkdir(parents=True, exist_ok=True)
        probe = loc / probe_name
        step = "write a probe object"
        probe.write_bytes(payload)
        step = "read the probe back"
        if probe.read_bytes() != payload:
            raise OSError("the probe read back differs from what was written")
        step = "delete the probe"
        probe.unlink()
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"storage {location}: cannot {step} from {who}: {_reason(e)}. Every node that trains "
                          "or encodes must be able to write there (check the bucket, the credentials of that "
                          "node, e.g. AWS_* / GOOGLE_APPLICATION_CREDENTIALS or an instance role, and mounts)"
                          ) from None


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
        errors = [(n, e) for n, e in zip(nodes, ray.get(refs, timeout=120)) if e]
    finally:
        with contextlib.suppress(Exception):
            (loc / shared).unlink()
    if errors:
        n, e = errors[0]
        raise ConfigError(f"{len(errors)} of {len(nodes)} Ray node(s) cannot use the storage; e.g. node "
                          f"{n.get('NodeManagerAddress')}: {e}")
    return len(nodes)
