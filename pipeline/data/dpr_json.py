"""DPR retriever training JSON as examples, read as a stream.

The file is DPR's top-level array of questions (`question`, `answers`, `positive_ctxs`,
`negative_ctxs`, `hard_negative_ctxs`; a ctx = `title`, `text`, `passage_id`): `iter_json_array`
decodes it object by object, never loading it whole, and `dpr_json_examples` turns each question into
an example in the texts form (query, positive, negatives; the contexts title-joined).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from ..errors import InputError
from .manifest import join_title


def iter_json_array(path: str | Path, chunk_size: int = 1 << 20) -> Iterator[tuple[int, int, dict]]:
    """Stream the objects of a top-level JSON array: yields (index, line, object).

    Memory holds one object (plus a chunk) at a time. Separators are checked: objects
    must be separated by single commas, and nothing may follow the closing bracket.
    """
    path = Path(path)
    decoder = json.JSONDecoder()
    if not path.exists():
        raise InputError(path, None, "file not found")
    with open(path, "r", encoding="utf-8-sig", errors="strict") as f:
        buf, pos, line, idx = "", 0, 1, 0
        state = "start"  # start -> value -> sep -> value ... -> end

        def more() -> bool:
            nonlocal buf, pos
            try:
                chunk = f.read(chunk_size)
            except UnicodeDecodeError as e:
                raise InputError(path, line, f"invalid UTF-8: {e.reason}") from None
            if not chunk:
                return False
            buf = buf[pos:] + chunk
            pos = 0
            return True

        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n":
                line += buf[pos] == "\n"
                pos += 1
            if pos >= len(buf):
                if more():
                    continue
                if state == "end":
                    return
                raise InputError(path, line, "unexpected end of file (unterminated JSON array)")
            ch = buf[pos]
            if state == "end":
                raise InputError(path, line, f"unexpected {ch!r} after the closing ']'")
            if state == "start":
                if ch != "[":
                    raise InputError(path, line, "expected a JSON array of examples ('[' at the start)")
                state, pos = "first", pos + 1
                continue
            if ch == "]" and state in ("first", "sep"):
                state, pos = "end", pos + 1
                continue
            if state == "sep":
                if ch != ",":
                    raise InputError(path, line, f"expected ',' or ']' between examples, found {ch!r}")
                state, pos = "value", pos + 1
                continue
            while True:
                try:
                    obj, end = decoder.raw_decode(buf, pos)
                    break
                except json.JSONDecodeError as e:
                    # Incomplete at the end of the buffer: read on. An error inside the buffer is real.
                    truncated = e.pos >= len(buf) - 1 or e.msg.startswith("Unterminated string")
                    if truncated and more():
                        continue
                    raise InputError(path, line + buf.count("\n", pos, e.pos), f"invalid JSON: {e.msg}") from None
            if not isinstance(obj, dict):
                raise InputError(path, line, "each array element must be a JSON object")
            yield idx, line, obj
            line += buf.count("\n", pos, end)
            pos, idx, state = end, idx + 1, "sep"


def _ctx_text(ctx: dict, join: str) -> str:
    return join_title(ctx.get("title") or "", ctx.get("text") or "", join)


def dpr_json_examples(path: str | Path, join: str = "{title} [SEP] {text}", negatives: str = "hard",
                      skipped: dict | None = None, need_negatives: bool = False) -> Iterator[dict]:
    """Examples from DPR training JSON. `negatives`: 'hard' (hard_negative_ctxs, falling back to
    negative_ctxs), 'random' (negative_ctxs) or 'both'. Questions without a positive are skipped
    and counted in `skipped` (as DPR's own loader does)."""
    skipped = skipped if skipped is not None else {}
    for i, line, obj in iter_json_array(path):
        if "question" not in obj or "positive_ctxs" not in obj:
            raise InputError(path, line, f"example {i}: missing 'question' or 'positive_ctxs'")
        if not obj["positive_ctxs"]:
            skipped["no_positive"] = skipped.get("no_positive", 0) + 1
            continue
        first = obj["positive_ctxs"][0]
        if not isinstance(first, dict) or not str(first.get("text") or "").strip():
            raise InputError(path, line, f"example {i}: the first positive context has no 'text'")
        hard = obj.get("hard_negative_ctxs") or []
        rand = obj.get("negative_ctxs") or []
        negs = {"hard": hard or rand, "random": rand, "both": hard + rand}[negatives]
        if need_negatives and not negs:
            skipped["no_negatives"] = skipped.get("no_negatives", 0) + 1
            continue
        yield {"qid": str(obj.get("id", i)), "query": obj["question"],
               "positive": _ctx_text(obj["positive_ctxs"][0], join),
               "negatives": [_ctx_text(c, join) for c in negs]}

