"""Errors a user can act on: every one names the file, the line and the reason."""

from __future__ import annotations


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


class ResourceError(PipelineError):
    """The cluster or machine lacks what the step asks for (CPUs, GPUs, memory)."""
