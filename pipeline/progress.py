"""Progress of long steps inside a run, for people: `update(what, done, total)` from the code that
does the work, sent to whatever sink the caller installed (`sink(fn)`), at most every `every`
seconds, plus the first and the last update.

The training loop installs a sink around validation (rank 0) that forwards each update to the
driver, which prints `[train] <run> step 28 validation: encoding 2,048/5,183 passages, 18/s, ETA 2:54`;
with no sink installed, updates cost a time.time() call and go nowhere.

`bar(total, desc, unit)` is the driver's tqdm bar (pipeline encode's), ending on one final line.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from typing import Callable

EVERY = 5.0
_local = threading.local()  # a sink is the installing thread's: a background thread's work is not reported in it


@contextlib.contextmanager
def sink(fn: Callable[[dict], None] | None, every: float = EVERY):
    """Send the updates this thread makes inside this block to `fn(record)`; record = {what, done,
    total, rate (per second), eta_s}. `fn=None` reports nothing."""
    old = getattr(_local, "state", None)
    _local.state = {"fn": fn, "every": every, "last": {}, "started": {}} if fn is not None else None
    try:
        yield
    finally:
        _local.state = old


def inherit() -> Callable[[], contextlib.AbstractContextManager]:
    """For work another thread does on this thread's behalf (e.g. reading ahead of it): a context
    manager that installs this thread's sink in the thread that enters it."""
    state = getattr(_local, "state", None)

    @contextlib.contextmanager
    def installed():
        old = getattr(_local, "state", None)
        _local.state = state
        try:
            yield
        finally:
            _local.state = old

    return installed


def update(what: str, done: int, total: int) -> None:
    """`done` of `total` items of `what` (e.g. "encoding passages") are finished."""
    state = getattr(_local, "state", None)
    if state is None:
        return
    now = time.time()
    start = state["started"].setdefault(what, now)
    if done and done < total and now - state["last"].get(what, 0.0) < state["every"]:
        return
    state["last"][what] = now
    rate = done / (now - start) if done and now > start else None
    eta = (total - done) / rate if rate else None
    try:
        state["fn"]({"what": what, "done": int(done), "total": int(total), "rate": rate, "eta_s": eta})
    except Exception:  # progress is for people: it never breaks the work it reports on
        pass


def line(rec: dict) -> str:
    """`encoding 2,048/5,183 passages, 18/s, ETA 2:54` for one update."""
    verb, _, noun = rec["what"].partition(" ")
    text = f"{verb} {rec['done']:,}/{rec['total']:,} {noun}".rstrip()
    if rec.get("rate"):
        text += f", {rec['rate']:,.0f}/s"
    if rec.get("eta_s") is not None and rec["done"] < rec["total"]:
        eta = int(rec["eta_s"])
        text += f", ETA {eta // 60}:{eta % 60:02d}"
    return text


def bar(total: int, desc: str, unit: str = "it", show: bool = True, mininterval: float = 2.0,
        smoothing: float = 0.1, file=None):
    """A tqdm bar whose final state is printed once. tqdm's `close()` prints the final state again
    even when the last update has just printed it; on a terminal the two overwrite each other, but
    anywhere else (a log, a pipe, Ray's driver log) every refresh is a line of its own and the last
    line came out twice. Here `close()` only ends that line when the last update printed it (and
    prints it, with the overall rate, as tqdm does, when it did not); on a terminal nothing changes."""
    return _bar_class()(total=total, desc=desc, unit=unit, disable=not show, mininterval=mininterval,
                        smoothing=smoothing, file=file)


@functools.lru_cache(maxsize=None)
def _bar_class():
    from tqdm import tqdm

    class OnceBar(tqdm):
        _closing = False

        def close(self):
            self._closing = True
            super().close()

        def display(self, msg=None, pos=None):
            if self._closing and msg is None and self.n == self.last_print_n and not _is_tty(self.fp):
                return True  # the last update printed this state already: close() only ends its line
            return super().display(msg, pos)

    return OnceBar


def _is_tty(fp) -> bool:
    try:
        return bool(fp.isatty())
    except (AttributeError, ValueError):
        return False
