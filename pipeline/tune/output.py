"""Where a sweep writes: `output` as a local path, a `file://` shared filesystem or an object-store
URI (`s3://…`, `gs://…`), through the storage layer `pipeline train` and `pipeline encode` use.

    SweepOutput.resolve(output)  storage.resolve, first of all: a credential in the URI
                                 (`user:secret@`, `?secret_key=`, `;…`, `#…`, encoded) is refused
                                 before Ray starts or anything is written, and no message shows it
    .check(resume, identity, base)  on a URI the write check (the driver writes, reads back and
                                 deletes a probe); the output rules: an output that holds a sweep
                                 or other files only with --resume, which must find the same sweep
    .prepare(resume)             the local folder of the sweep's own files (`.local`)
    .trials                      the trials' `train.storage_path`: <output>/trials
    .tune_storage(), .experiment()  (path, pyarrow filesystem) of the output and of Tune's
                                 experiment folder (<output>/tune), for RunConfig / Tuner.restore

On a URI, Tune's experiment state and the trials' runs go to the URI themselves (Tune's RunConfig
and the trainer take a pyarrow filesystem). The sweep's own files (sweep.json, events.jsonl,
results.*, best.yaml, summary.json, plots/) are written in a local staging folder
(`storage.staging_dir(output, "tune")`, a cache: the URI is the truth) and uploaded one object each
(complete or absent): sweep.json before the first trial, events.jsonl at every trial's start and end
and whenever the sweep ends, and the results at the end with `summary.json` last (a summary on the
URI vouches for the results beside it). `--resume` downloads sweep.json and events.jsonl.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .. import storage as st
from ..errors import ConfigError, PipelineError

EXPERIMENT = "tune"          # Tune's experiment folder under the output
RESUMED = ("sweep.json", "events.jsonl")  # what --resume needs of the sweep's own files


class SweepOutput:
    """A sweep's output location (a local `Path` or a `storage.RemotePath`) and its local folder."""

    def __init__(self, location: st.Location):
        self.location = location
        self.local: Path | None = None if self.remote else location
        self._sync_failed = False

    @classmethod
    def resolve(cls, output: str) -> "SweepOutput":
        return cls(st.resolve(output))

    @property
    def remote(self) -> bool:
        return isinstance(self.location, st.RemotePath)

    def __str__(self) -> str:
        return str(self.location)

    @property
    def trials(self) -> str:
        return str(self.location / "trials")

    def tune_storage(self) -> tuple[str, object | None]:
        return st.ray_storage(self.location)

    def experiment(self) -> tuple[str, object | None]:
        return st.ray_storage(self.location / EXPERIMENT)

    # ---- before Ray starts --------------------------------------------------------
    def check(self, resume: bool, identity: dict, base) -> None:
        """The output rules (as for a local folder, on a URI through RemotePath.exists/iterdir)."""
        from ray import tune

        out, saved = self.location, self.location / "sweep.json"
        if self.remote:
            from .drivers import kind_of

            if kind_of(base) == "rcl":
                raise ConfigError(f"output={out}: an RCL sweep's trials keep their stages and regulator tables in "
                                  "a folder (recipes/rcl.py); give a local or shared path (file://…) as output")
            st.check_writable(out, who="the driver")  # a missing bucket or credentials: one error line, now
        if resume:
            path, fs = self.experiment()
            if not (saved.exists() and tune.Tuner.can_restore(path, storage_filesystem=fs)):
                raise PipelineError(f"--resume: {out} holds no sweep to resume (no sweep.json and Tune state); "
                                    "start it without --resume")
            then = json.loads(saved.read_text())["identity"]
            now = json.loads(json.dumps(identity, default=str))
            diff = [k for k in ("base", "space", "search") if then.get(k) != now.get(k)]
            if diff:
                raise PipelineError(f"--resume: the sweep in {out} was started with another "
                                    f"{' and '.join(diff)}; resume it with the same config, or use another output")
            return
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            what = "a sweep" if saved.exists() else "files that are not a sweep's"
            raise PipelineError(f"output {out} already holds {what}; resume it with --resume, or choose another "
                                "output (output=...)")

    def prepare(self, resume: bool) -> Path:
        """The local folder of the sweep's own files, made; on a URI the staging folder, emptied
        (a cache of the URI: what an earlier sweep left there is not this one's) and, on --resume,
        holding the URI's sweep.json and events.jsonl."""
        if not self.remote:
            self.location.mkdir(parents=True, exist_ok=True)
            return self.location
        self.local = st.staging_dir(self.location, "tune")
        for p in list(self.local.iterdir()):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        if resume:
            for name in RESUMED:
                src = self.location / name
                if src.exists():
                    (self.local / name).write_bytes(src.read_bytes())
        return self.local

    # ---- uploads ------------------------------------------------------------------
    def upload(self, *names: str) -> None:
        """These files of the local folder to the URI, one object each (a no-op for a local output)."""
        if not self.remote:
            return
        for name in names:
            src = self.local / name
            if src.exists():
                st.write_bytes_atomic(self.location / name, src.read_bytes())

    def sync_events(self, print_fn=print) -> None:
        """events.jsonl to the URI while Tune runs; a failure is said once and does not stop the
        sweep (the log is local and uploaded again at the next event and at the end)."""
        try:
            self.upload("events.jsonl")
        except Exception as e:  # noqa: BLE001 - the sweep goes on; publish() reports for good
            if not self._sync_failed:
                self._sync_failed = True
                print_fn(st.redact(f"[tune] WARNING: could not upload events.jsonl to {self.location} "
                                   f"({st._reason(e)}); retried at the next trial event"), flush=True)

    def publish(self) -> None:
        """The sweep's files to the URI, `summary.json` last (removed first: a summary on the URI
        vouches for the results uploaded with it). A no-op for a local output."""
        if not self.remote:
            return
        try:
            (self.location / "summary.json").unlink(missing_ok=True)
            marker = "summary.json" if (self.local / "summary.json").exists() else None
            st.upload_dir(self.local, self.location, marker=marker)
        except OSError as e:
            raise PipelineError(f"{self.location}: uploading the sweep's results failed ({st._reason(e)}); they "
                                f"are in {self.local}, and the sweep's state on the URI (pipeline tune ... --resume "
                                "writes them again)") from None
