"""Checks every reader applies to what it reads: ids, texts and line endings.

Shared by `readers.py` (files) and `irds.py` (ir_datasets), so neither imports the other for them.
Each check raises `InputError` naming the source, the 1-based line and the reason.
"""

from __future__ import annotations

import re

from ..errors import InputError


_SPACE = re.compile(r"\s")  # str.isspace's characters (one C scan per id, not a Python call per character)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_id(path, line, pid: str, what: str = "id") -> str:
    """A passage/query id as TREC files carry it: non-empty, no whitespace, no control character."""
    pid = pid.strip()
    if not pid:
        raise InputError(path, line, f"empty {what}")
    if _SPACE.search(pid):
        raise InputError(path, line, f"{what} {pid!r} contains whitespace, which TREC run and qrels files cannot carry")
    if _CONTROL.search(pid):
        raise InputError(path, line, f"{what} {pid!r} contains a control character (NUL or similar)")
    return pid


_JSON_NAMES = {float: "a number with a fraction", list: "an array", dict: "an object"}


def value_id(path, line, value, what: str = "id", field: str = "_id") -> str:
    """An id read from JSON (or a typed column): a string, or an integer (some BEIR-style files
    and many Hugging Face datasets number their records), written as its decimal digits.
    null, true/false, a float, a list or an object is an error: str() of them ("None", "True",
    "1.0") would be an id nobody wrote."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        shown = _JSON_NAMES.get(type(value), type(value).__name__)
        if value is None or isinstance(value, bool):
            shown = {None: "null", True: "true", False: "false"}[value]
        raise InputError(path, line, f"{field} must be a string (or an integer), got {shown}")
    return check_id(path, line, str(value), what)


def check_text(path, line, value: str, what: str = "text") -> str:
    """A NUL in a passage's text or title is an error: never kept, never dropped silently."""
    if "\x00" in value:
        raise InputError(path, line, f"NUL character in the {what} at position {value.index(chr(0))} "
                                     "(a binary or corrupt source?)")
    return value


def check_no_bare_cr(path, line, text: str) -> str:
    """A carriage return left inside a line (its LF/CRLF ending already stripped) is an error.

    Lines end at LF (CRLF is accepted); a CR on its own is what old-Mac files end lines with, and
    reading such a file as one line would merge its records silently."""
    at = text.find("\r")
    if at >= 0:
        raise InputError(path, line, f"carriage return (CR) at character {at} inside the line: lines must end "
                                     "with LF or CRLF; a file with CR-only line endings reads as one merged record "
                                     "(convert it first, e.g. tr '\\r' '\\n' < in > out)")
    return text
