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
denied, read-only, or a store that did not answer within $PIPELINE_STORAGE_TIMEOUT_S, 60 s:
the probe runs in a thread, and a line says what is waited on after 5 s) — `check_writable_on_nodes`
runs the same probe on every Ray node.

Credentials are refused in every spelling (`redact`, `_split_uri`): query options split on `&`
and `;`, a `#fragment` read as options, names and values percent-decoded until they stop changing
(an encoded `%26secret_key%3D` inside another option's value is one), and a `user:password@`
whose password holds `/`.

Size: ~700 lines on purpose: `RemotePath` (the Path subset), the credential rules, the
complete-or-absent writes, the upload/download helpers and the write checks are one concern, the
one place URIs are handled.
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
# api_key, ...) or is one of the short spellings; never kept in a URI, masked in every message.
# Options are split on `&` and `;` (both are separators to some parsers), a `#fragment` is read as
# options too, and values are percent-decoded until they stop changing (double encoding), so an
# encoded separator (%26, %3B, %23, %2526) hides nothing: an option whose decoded text holds a
# credential-like `name=` or a `user:password@` is a credential as a whole.
_SECRET_WORDS = ("token", "secret", "key", "signature", "credential", "password", "passwd")
_SECRET_NAMES = ("pwd", "sig", "sas", "auth")
_OPTION_SEP = re.compile(r"[&;]")
_DECODED_SEP = re.compile(r"[&;#?]")
# `user:password@` inside a (decoded) option value; the password may hold `/` (unencoded AWS keys)
_USERINFO_RE = re.compile(r"(?:^|[/&;#?=])[^/@?&;#=\s:]+:[^@?&;#\s]*@")
_URI_RE = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)([^\s'\"]*)")


def _decoded(text: str, plus: bool = False) -> str:
    """`text` percent-decoded until it stops changing (a double-encoded `%2526` is `&`; each round
    that changes it makes it shorter, so this ends)."""
    from urllib.parse import unquote, unquote_plus

    while True:
        nxt = unquote_plus(text) if plus else unquote(text)
        if nxt == text:
            return text
        text = nxt


def _is_secret_name(name: str) -> bool:
    """A query option's name that names a credential, however it is spelled (percent-encoded too)."""
    key = _decoded(name, plus=True).strip().lower()
    return any(w in key for w in _SECRET_WORDS) or key in _SECRET_NAMES


def _has_userinfo(value: str) -> bool:
    """A `user:password@host` inside an option's (percent-decoded) value, e.g. endpoint_override."""
    return bool(_USERINFO_RE.search(_decoded(value)))


def _secret_option(item: str) -> bool:
    """One `name=value` option (as split on & and ;) that carries a credential: by its name, or by a
    credential-like `name=` or a `user:password@` anywhere in its decoded text."""
    key = item.partition("=")[0]
    if _is_secret_name(key):
        return True
    text = _decoded(item)
    inner = _DECODED_SEP.split(text)
    return any(eq and _is_secret_name(name) for name, eq, _ in (p.partition("=") for p in inner)) \
        or _has_userinfo(text)


def _masked_option(item: str) -> str:
    """`name=***`, or `***` alone where the name itself would show what it hides (an encoded
    separator or `=` inside it)."""
    key, eq, _ = item.partition("=")
    clean = eq and not re.search(r"[=&;#?@:]", _decoded(key, plus=True))
    return f"{key}=***" if clean else "***"


def _options(text: str) -> list[str]:
    return _OPTION_SEP.split(text) if text else []


def _mask_options(text: str) -> str:
    """A query or fragment with every credential option masked, separators kept as they were."""
    out, pos = [], 0
    for m in list(_OPTION_SEP.finditer(text)) + [None]:
        end = m.start() if m else len(text)
        item = text[pos:end]
        out.append(_masked_option(item) if item and _secret_option(item) else item)
        if m:
            out.append(m.group(0))
            pos = m.end()
    return "".join(out)


def _secret_segment(segment: str) -> bool:
    """A path segment that carries an option after a separator, raw or encoded (`runs;secret_key=…`,
    `runs%3Bsecret_key%3D…`): what follows the segment's first `;`, `&`, `?` or `#` (decoded) is read as
    options. The segment's own start is a name (`partition_key=3` is a folder)."""
    return any("=" in p and _secret_option(p) for p in _DECODED_SEP.split(_decoded(segment))[1:])


def _mask_path(path: str) -> str:
    """`path` cut at the first segment that carries a credential option, which is masked (its options
    after a raw `;` one by one, else whole): the value may run on across `/`, so nothing after it shows."""
    segs = path.split("/")
    for i, seg in enumerate(segs):
        if _secret_segment(seg):
            head, semi, tail = seg.partition(";")
            seg = head + semi + _mask_options(tail) if semi and not _secret_segment(head) else "***"
            return "/".join(segs[:i] + [seg])
    return path


def _split_authority(path: str) -> tuple[str, str]:
    """(userinfo, the rest) of a URI's part before `?`/`#`. A `user:password@` counts even when the
    password holds `/` (unencoded AWS secret keys do): the userinfo then runs to the last `@` when the
    text before it holds a `:`; otherwise only an `@` in the host part (before the first `/`) is one,
    so `s3://bucket/model@v2` is a path."""
    at = path.rfind("@")
    if at >= 0 and ":" in path[:at]:
        return path[:at], path[at + 1:]
    head = path.partition("/")[0]
    if "@" in head:
        user = head.rsplit("@", 1)[0]
        return user, path[len(user) + 1:]
    return "", path


def _split_rest(rest: str) -> tuple[str, str, str, str, str]:
    """(path, '?' or '', query, '#' or '', fragment) of what follows a URI's `scheme://`."""
    path, hash_, fragment = rest.partition("#")
    path, q, query = path.partition("?")
    return path, q, query, hash_, fragment


def redact(text: str) -> str:
    """`text` with every credential inside a URI replaced by ***: a user:password@ part (only
    `anonymous@` is kept) and every credential-like query or fragment option (secret_key=…,
    spelled with `&` or `;`, percent-encoded once or twice, hidden in another option's value)."""
    def one(m: re.Match) -> str:
        scheme, rest = m.group(1), m.group(2)
        trail = rest[len(rest.rstrip(":;,.)")):]  # the sentence's punctuation after the URI stays
        rest = rest[:len(rest) - len(trail)]
        path, q, query, hash_, fragment = _split_rest(rest)
        user, path = _split_authority(path)
        path = _mask_path(path)
        if user:
            path = f"{'anonymous' if user == 'anonymous' else '***'}@{path}"
        return scheme + path + q + _mask_options(query) + hash_ + _mask_options(fragment) + trail
    return _URI_RE.sub(one, text)


def _split_uri(uri: str) -> tuple[str, str, str, str]:
    """(scheme, user, bucket/path, query). The only user a URI may carry is `anonymous`
    (pyarrow's unauthenticated access, e.g. a public bucket or a local emulator): a URI is written
    into manifests, run records and logs, so credentials in it are refused."""
    scheme, rest = uri.split("://", 1)
    path, _, query, hash_, fragment = _split_rest(rest)
    user, path = _split_authority(path)
    head = path.partition("/")[0]
    if user and user != "anonymous":
        raise ConfigError(f"{scheme}://***@{head}: credentials in a storage URI would be written into manifests "
                          "and logs; give them the usual way for the store (AWS_* / GOOGLE_APPLICATION_"
                          "CREDENTIALS environment variables, ~/.aws, an instance role), or use anonymous@")
    secret = [_masked_option(item).partition("=")[0] for item in _options(query) + _options(fragment)
              if item and _secret_option(item)]
    secret += ["***" for seg in path.split("/") if _secret_segment(seg)]
    if secret:
        raise ConfigError(f"{redact(uri)}: credentials in a storage URI ({', '.join(secret)}) would be written into "
                          "manifests and logs; give them the usual way for the store (AWS_* / GOOGLE_APPLICATION_"
                          "CREDENTIALS environment variables, ~/.aws, an instance role)")
    if hash_:
        raise ConfigError(f"{redact(uri)}: a storage URI takes its options in the query (?key=value), not in a "
                          "#fragment; a '#' in an object name would be read as one")
    return scheme, user, path.strip("/"), query


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
        raise ConfigError(f"storage {location}: cannot {step[0]} from {who}: {_reason(e)}. Every node that trains "
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
