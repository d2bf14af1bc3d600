"""A location: a local `Path` or a `RemotePath` on an object store (`s3://`, `gs://`, …); `resolve` makes one.

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
Its single-file writes are complete or absent (one object on an object store, a temporary name
moved into place elsewhere).

`from_filesystem` makes a location from a (pyarrow filesystem, path) pair and `ray_storage` the
reverse, for Ray Train; `error_reason` says in words what a store's error means.
"""

from __future__ import annotations

import fnmatch
import os
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator, Union

from .credentials import redact, split_uri
from .errors import ConfigError

OBJECT_STORES = ("s3", "gcs")  # pyarrow type names whose single-object writes are atomic


def is_uri(location) -> bool:
    """True for `scheme://…` strings other than `file://` (those are local paths)."""
    return isinstance(location, RemotePath) or (isinstance(location, str) and "://" in location
                                                and not location.startswith("file://"))


class RemotePath:
    """A file or folder on a pyarrow filesystem, addressed by URI (see the module doc)."""

    def __init__(self, uri: str, fs=None):
        scheme, user, path, query = split_uri(uri)
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
                raise ConfigError(redact(f"{self.uri}: not a usable storage URI ({error_reason(e)})")) from None
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
            raise OSError(f"{self.uri}: {error_reason(e)}") from None

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


def error_reason(e: BaseException) -> str:
    """What a filesystem error means, in words (missing bucket, access denied, no credentials, read-only),
    with the store's own message cut short."""
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
