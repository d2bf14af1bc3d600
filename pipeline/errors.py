"""Errors a user can act on: every one names the file, the line and the reason."""

from __future__ import annotations

import re


class PipelineError(Exception):
    """Base class for errors that the CLI prints without a traceback."""


class InputError(PipelineError):
    """Malformed input: `path:line: reason`."""

    def __init__(self, path, line: int | None, reason: str):
        self.path = str(path)
        self.line = line
        self.reason = reason
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {reason}")

    def __reduce__(self):  # copied and pickled as it was made (Ray copies a trial's or task's error)
        return self.__class__, (self.path, self.line, self.reason)


class ConfigError(PipelineError):
    """A configuration value that cannot work (unknown key, bad type, impossible resources)."""


class NonFiniteError(PipelineError):
    """A NaN or inf where a number must be finite (a vector, a score, a loss): stopped where it appears."""


class ResourceError(PipelineError):
    """The cluster or machine lacks what the step asks for (CPUs, GPUs, memory)."""


def worker_error(e: BaseException) -> PipelineError | None:
    """The PipelineError a worker raised, from the exception Ray hands the driver (or None)."""
    cause: BaseException | None = e
    seen: set[int] = set()
    while cause is not None and not isinstance(cause, PipelineError) and id(cause) not in seen:
        seen.add(id(cause))
        cause = cause.__cause__ or getattr(cause, "cause", None)
    if isinstance(cause, PipelineError):
        return PipelineError(str(cause))
    # Ray does not pickle __cause__: the worker's error survives only in the message text
    found = re.findall(r"pipeline\.errors\.\w+: ([^\n]+)", str(e))
    return PipelineError(found[-1].strip()) if found else None


def worker_os_error(e: BaseException) -> str | None:
    """`[Errno 28] No space left on device` when a worker's OSError is what Ray hands the driver
    (its message text: Ray does not pickle the chain), else None."""
    found = re.findall(r"OSError: (\[Errno \d+\] [^\n]+)", str(e))
    return found[-1].strip() if found else None
