"""Credentials in storage URIs: found however they are spelled, refused (`split_uri`), masked in every
message (`redact`).

A URI is written into manifests, run records and logs, so it may carry no credential: the only user it
may name is `anonymous` (pyarrow's unauthenticated access: a public bucket, a local emulator); every
process finds its credentials the usual way for its store (AWS_* / GOOGLE_* environment variables,
~/.aws, an instance role).

Credentials are refused in every spelling: query options split on `&` and `;`, a `#fragment` read as
options, names and values percent-decoded until they stop changing (an encoded `%26secret_key%3D` inside
another option's value is one), and a `user:password@` whose password holds `/`.
"""

from __future__ import annotations

import re

from .errors import ConfigError

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


def is_secret_name(name: str) -> bool:
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
    if is_secret_name(key):
        return True
    text = _decoded(item)
    inner = _DECODED_SEP.split(text)
    return any(eq and is_secret_name(name) for name, eq, _ in (p.partition("=") for p in inner)) \
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


def split_uri(uri: str) -> tuple[str, str, str, str]:
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
